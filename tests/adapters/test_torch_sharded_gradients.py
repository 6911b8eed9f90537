"""ShardedGradients (hvdtrain/adapters/torch/sharded_gradients.py, ZeRO stage 2) on one
process whose hooks are on (``HOROVOD_ELASTIC=1`` after ``hvt.init()``, as in
test_torch_hooks.py): its reduce-scatter, clip and step against plain torch on the same
model. Its equivalence with one process on the concatenated batch, over 2 real ranks
and at 5 and 8, is test_torch_sharding.py's and test_many_ranks.py's.
"""

import textwrap

import pytest
from torch_results import one_process_cases

_SHARDED_GRADIENTS = textwrap.dedent("""
    import copy, json, math, os, torch
    import hvdtrain.adapters.torch as hvt

    hvt.init()
    os.environ["HOROVOD_ELASTIC"] = "1"

    def report(case, **values):
        print(json.dumps({"case": case, **values}), flush=True)

    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    plain_model = copy.deepcopy(model)
    x, y = torch.randn(8, 5), torch.randn(8, 2)

    def loss(m):
        return torch.nn.functional.mse_loss(m(x), y)

    sharded = hvt.DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=0.1),
                                       model.named_parameters(), shard_gradients=True)
    plain = torch.optim.AdamW(plain_model.parameters(), lr=0.1)
    for step in range(3):
        sharded.zero_grad(); plain.zero_grad()
        loss(model).backward(); loss(plain_model).backward()
        sharded.synchronize()
        report("gradients_hold_nan_after_the_reduce_scatter", step=step,
               all_nan=all(bool(torch.isnan(p.grad).all()) for p in model.parameters()))
        norm = sharded.clip_grad_norm_(0.5)
        plain_norm = torch.nn.utils.clip_grad_norm_(plain_model.parameters(), 0.5)
        report("the_clip_norm_is_the_whole_gradients", step=step,
               difference=abs(float(norm) - float(plain_norm)))
        with sharded.skip_synchronize():
            sharded.step()
        plain.step()
        report("the_step_is_plain_adamw", step=step, difference=max(
            float((a - b).abs().max()) for a, b in zip(model.parameters(),
                                                       plain_model.parameters())))

    sharded.zero_grad()
    loss(model).backward()
    sharded.synchronize()
    next(model.parameters()).grad.mul_(2.0)  # as torch's clip_grad_norm_ would
    try:
        with sharded.skip_synchronize():
            sharded.step()
        report("a_changed_gradient_is_refused", error=None)
    except RuntimeError as error:
        report("a_changed_gradient_is_refused", error=str(error))
""")


@pytest.fixture(scope="module")
def cases() -> dict:
    return one_process_cases(_SHARDED_GRADIENTS)


def test_the_parameters_gradients_hold_nan_once_reduce_scattered(cases):
    assert [c["all_nan"] for c in cases["gradients_hold_nan_after_the_reduce_scatter"]] == [
        True, True, True]


def test_the_clip_takes_the_norm_of_the_whole_gradients(cases):
    assert all(c["difference"] <= 1e-6 for c in cases["the_clip_norm_is_the_whole_gradients"])


def test_each_step_is_the_users_optimizers_on_the_shards(cases):
    steps = cases["the_step_is_plain_adamw"]
    assert len(steps) == 3 and all(c["difference"] <= 1e-6 for c in steps)


def test_a_gradient_changed_after_synchronize_is_refused_naming_it(cases):
    error = cases["a_changed_gradient_is_refused"][0]["error"]
    assert error and "the gradient of '0.weight' changed after synchronize()" in error
    assert "optimizer.clip_grad_norm_" in error
