"""DistributedOptimizer(shard_state=True) and (shard_gradients=True)
(hvdtrain/adapters/torch/sharding.py) on 2 real ranks (Gloo and MPI), against one process
on the concatenated batch.

The launch, shared by tests/adapters/test_torch_*.py: conftest.py's ``torch_run``.
"""

import pytest
import torch
from torch_results import max_difference, tensors
from workers.torch_common import STEPS, make_model, reference_run

FLOAT64_TOLERANCE = 1e-10
# The test model's 53 parameters over 2 ranks: slices of 27 and 26 elements.
SLICES = ([27], [26])

SHARDED = [  # (scenario, optimizer kind, backward passes, clip norm)
    ("sgd_sharded", "sgd", 1, None), ("adamw_sharded", "adamw", 1, None),
    ("sgd_sharded_accumulate", "sgd", 2, None), ("adamw_sharded_accumulate", "adamw", 2, None),
    # Horovod's summing convention: the script divides its loss by the passes
    ("sgd_sharded_accumulate_horovod", "sgd", 2, None),
    ("sgd_sharded_clip", "sgd", 1, 0.05), ("adamw_sharded_clip", "adamw", 1, 0.05),
    ("adamw_sharded_accumulate_clip", "adamw", 2, 0.05),
    # torch's clip on p.grad after synchronize(): the averaged, whole gradients
    ("adamw_sharded_torch_clip", "adamw", 1, 0.05),
    ("sgd_sharded_overlap", "sgd", 1, None),
    # every parameter's data replaced halfway: put back into the buffer, value kept
    ("adamw_sharded_relinked", "adamw", 1, None),
    # ZeRO stage 2: the gradients reduce-scattered (clipped by optimizer.clip_grad_norm_)
    ("sgd_grad_sharded", "sgd", 1, None), ("adamw_grad_sharded", "adamw", 1, None),
    ("sgd_grad_sharded_accumulate", "sgd", 2, None),
    ("adamw_grad_sharded_accumulate", "adamw", 2, None),
    ("sgd_grad_sharded_accumulate_horovod", "sgd", 2, None),
    ("sgd_grad_sharded_clip", "sgd", 1, 0.05), ("adamw_grad_sharded_clip", "adamw", 1, 0.05),
    ("adamw_grad_sharded_accumulate_clip", "adamw", 2, 0.05),
    ("adamw_grad_sharded_relinked", "adamw", 1, None),
]


@pytest.mark.parametrize(("name", "kind", "passes", "clip"), [
    *SHARDED, ("adamw", "adamw", 1, None), ("adamw_clip", "adamw", 1, 0.05)])
def test_two_workers_equal_one_process_on_the_concatenated_batch(torch_run, name, kind, passes,
                                                                 clip):
    reference = reference_run(kind, passes=passes, clip=clip)
    for rank in (0, 1):
        assert max_difference(tensors(torch_run, name, rank), reference) <= FLOAT64_TOLERANCE


def test_the_clip_bites_in_the_clipped_runs():
    """So the clipped scenarios above test clipping: the reference differs without it."""
    assert max_difference(reference_run("adamw", clip=0.05), reference_run("adamw")) > 1e-3


@pytest.mark.parametrize("name", [name for name, *_ in SHARDED])
def test_each_rank_holds_its_slice_of_the_state_and_the_same_weights(torch_run, name):
    rank0, rank1 = torch_run.both(name)
    assert (rank0["state_sizes"], rank1["state_sizes"]) == SLICES
    assert rank0["checksums"] == rank1["checksums"]
    assert len(set(rank0["checksums"])) == STEPS


@pytest.mark.parametrize("name", ["sgd_sharded_fp16", "sgd_grad_sharded_fp16"])
def test_fp16_on_the_wire_stays_within_its_rounding(torch_run, name):
    """As test_torch_optimizer's fp16 check: within 2u of the distance travelled."""
    exact = tensors(torch_run, "sgd_float32")
    initial = dict(make_model(dtype=torch.float32).named_parameters())
    travelled = max_difference(exact, {k: v.detach() for k, v in initial.items()})
    difference = max_difference(tensors(torch_run, name), exact)
    assert 0 < difference <= 2 * 2.0**-11 * travelled


def test_unsharded_optimizers_hold_the_whole_state(torch_run):
    assert torch_run.report("adamw")["state_sizes"] == sorted(
        {p.numel() for p in make_model().parameters()})


def test_a_sharded_checkpoint_is_the_unsharded_file_and_resumes_either_way(torch_run):
    """The file written by 2 sharded ranks holds what one process training on the
    concatenated batch holds; an unsharded run resumed from it, and a sharded one
    resumed from that one's file, continue exactly."""
    expected_state: dict = {}
    expected_model = reference_run("adamw", steps=3, warmup=False, optimizer_state=expected_state)
    payload = torch.load(torch_run.out_dir / "sharded_checkpoint" / "sharded.pt",
                         weights_only=True)
    assert max_difference(payload["model"], expected_model) <= FLOAT64_TOLERANCE
    saved = payload["optimizer"]
    assert saved["param_groups"] == expected_state["param_groups"]
    for index, state in expected_state["state"].items():
        assert set(saved["state"][index]) == set(state)
        for key, value in state.items():
            assert saved["state"][index][key].shape == value.shape
            assert (saved["state"][index][key] - value).abs().max() <= FLOAT64_TOLERANCE, key
    for rank in (0, 1):
        assert max_difference(tensors(torch_run, "sharded_checkpoint_resumed", rank),
                              tensors(torch_run, "sharded_checkpoint_straight", rank)) <= 1e-12
    reports = torch_run.both("sharded_checkpoint")
    assert all(report["state_difference"] == 0.0 for report in reports)
    assert tuple(report["state_sizes"] for report in reports) == SLICES


@pytest.mark.parametrize(("case", "message"), [
    ("lbfgs", "TypeError: shard_state=True cannot shard torch.optim.lbfgs.LBFGS"),
    ("adasum", "ValueError: shard_state=True cannot be combined with op=hvt.Adasum"),
    ("fingerprint", "ValueError: state_fingerprint is local, but this optimizer's state is "
                    "sharded"),
    ("converted", "RuntimeError: parameter '0.weight' changed from (5, 6) torch.float64 on "
                  "cpu to (5, 6) torch.float32 on cpu after DistributedOptimizer(shard_state="
                  "True) was made"),
    ("closure", "ValueError: step(closure) with shard_state=True"),
    ("torch_clip_sliced", "RuntimeError: the gradient of '0.weight' changed after "
                          "synchronize(), but with shard_gradients=True each worker holds "
                          "only its shard"),
    ("overlap_sliced", "ValueError: shard_gradients=True reduce-scatters the gradients after "
                       "backward(), so it cannot go with overlap=True"),
])
def test_what_sharding_cannot_do_is_refused_saying_what_to_do(torch_run, case, message):
    for report in torch_run.both("sharded_refusals"):
        assert report["errors"][case].startswith(message), report["errors"][case]
    assert "before wrapping" in torch_run.report("sharded_refusals")["errors"]["converted"]


@pytest.mark.parametrize("name", ["join_sharded", "join_grad_sharded"])
def test_a_worker_that_joins_early_is_refused_on_the_others_saying_why(torch_run, name):
    rank0, rank1 = torch_run.both(name)
    assert rank1["error"] is None  # it had fewer steps and joined
    assert rank0["error"].startswith("a worker called join() while others still step")
    assert "hvt.distributed_sampler" in rank0["error"]


@pytest.mark.parametrize("name", ["sharded_nonfinite", "grad_sharded_nonfinite"])
def test_a_nonfinite_gradient_on_one_rank_is_skipped_or_named_on_both(torch_run, name):
    rank0, rank1 = torch_run.both(name)
    for report in (rank0, rank1):
        assert report["outcomes"]["True"]["skipped"] == 1
        assert "'0.weight'" in report["outcomes"]["False"]["error"]
        assert "step 1" in report["outcomes"]["False"]["error"]
    assert rank0["outcomes"]["True"]["fingerprint"] == rank1["outcomes"]["True"]["fingerprint"]
