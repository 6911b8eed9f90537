"""BackwardHooks (hvdtrain/adapters/torch/hooks.py): the per-gradient hooks over
Horovod's public collectives, on one process whose hooks are on (as in an elastic job,
``HOROVOD_ELASTIC=1`` set after ``hvt.init()``, so that the one rank averages with
itself). Each case is its own line of the script's report, so a failure names it. The
hooks on 2 real ranks (overlap, groups, sparse, process sets) are
test_torch_optimizer.py's, test_groups.py's and test_torch_horovod_api.py's.
"""

import textwrap

import pytest
from torch_results import one_process_cases

_HOOKS = textwrap.dedent("""
    import json, os, torch
    import hvdtrain.adapters.torch as hvt

    hvt.init()
    os.environ["HOROVOD_ELASTIC"] = "1"  # hooks on, one rank averaging with itself

    def report(case, **values):
        print(json.dumps({"case": case, **values}), flush=True)

    def made(overlap, passes=1, **more):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 1))
        optimizer = hvt.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.5), model.named_parameters(),
            overlap=overlap, backward_passes_per_step=passes, **more)
        return model, optimizer

    x = torch.arange(8.0).reshape(2, 4) / 8

    for overlap in (False, True):
        model, optimizer = made(overlap)
        model(x).sum().backward()
        report("started_during_backward", overlap=overlap,
               started=len(optimizer._started))
        before = [p.grad.clone() for p in model.parameters()]
        optimizer.synchronize()
        report("one_rank_average_is_the_gradient", overlap=overlap,
               same=all(torch.equal(b, p.grad) for b, p in zip(before, model.parameters())))
        with optimizer.skip_synchronize():
            optimizer.step()

    model, optimizer = made(True)
    model(x).sum().backward()
    try:
        optimizer.zero_grad()
        report("zero_grad_in_flight", error=None)
    except RuntimeError as error:
        report("zero_grad_in_flight", error=str(error))
    optimizer.step()

    model, optimizer = made(False, passes=2)
    for _ in range(2):
        model(x).sum().backward()
    try:
        model(x).sum().backward()
        report("too_many_passes", error=None)
    except RuntimeError as error:
        report("too_many_passes", error=str(error))

    model, optimizer = made(True, groups=1)
    report("groups", groups=sorted(len(group) for group in optimizer._ready_in_group))
    model(x).sum().backward()
    report("group_started_once_complete", keys=[len(key) if isinstance(key, tuple) else 1
                                                for key in optimizer._started])
    optimizer.step()
    model, optimizer = made(True, groups=[[model_param] for model_param in []])
    report("empty_groups_leave_each_alone", groups=sorted(
        len(group) for group in optimizer._ready_in_group))
""")


@pytest.fixture(scope="module")
def cases() -> dict:
    return one_process_cases(_HOOKS)


def test_with_overlap_the_hooks_start_each_allreduce_during_backward(cases):
    assert cases["started_during_backward"] == [{"overlap": False, "started": 0},
                                                {"overlap": True, "started": 4}]


def test_one_rank_averaging_with_itself_keeps_its_gradient(cases):
    assert [c["same"] for c in cases["one_rank_average_is_the_gradient"]] == [True, True]


def test_zero_grad_is_refused_while_allreduces_are_in_flight(cases):
    error = cases["zero_grad_in_flight"][0]["error"]
    assert error and "still in flight" in error and "zero_grad() before the backward" in error


def test_a_pass_beyond_backward_passes_per_step_names_the_parameter(cases):
    error = cases["too_many_passes"][0]["error"]
    assert error and any(f"the gradient of '{name}'" in error
                         for name in ("0.weight", "0.bias", "1.weight", "1.bias"))
    assert "backward_passes_per_step=2" in error


def test_groups_make_one_grouped_allreduce_once_the_group_is_complete(cases):
    assert cases["groups"] == [{"groups": [4]}]
    assert cases["group_started_once_complete"] == [{"keys": [4]}]
    assert cases["empty_groups_leave_each_alone"] == [{"groups": [1, 1, 1, 1]}]
