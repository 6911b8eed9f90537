"""DistributedOptimizer (hvdtrain/adapters/torch/optimizer.py)
on 2 real ranks (Gloo and MPI).

The launch, shared by tests/adapters/test_torch_*.py: conftest.py's ``torch_run``.
"""

import pytest
import torch
from harness import Run, launch
from torch_results import max_difference, tensors
from workers.scenarios import expected_tensor_collective
from workers.torch_common import (
    JOIN_STEPS,
    STEPS,
    global_rows,
    loss_fn,
    make_data,
    make_model,
    reference_run,
    uneven_reference_run,
)

from hvdtrain.jobs.launch import CONTROLLERS

FLOAT64_TOLERANCE = 1e-10
# Unit roundoff of the wire formats.
FP16_UNIT, BF16_UNIT = 2.0**-11, 2.0**-8


@pytest.mark.parametrize(("name", "kind", "passes"), [
    ("sgd", "sgd", 1), ("adam", "adam", 1), ("sgd_groups", "sgd", 1),
    ("sgd_accumulate", "sgd", 2), ("adam_accumulate", "adam", 2),
    # Horovod's default sums the micro-batches; its scripts divide the loss by the passes
    ("sgd_accumulate_horovod", "sgd", 2),
    # 2 ranks x 4 passes: the "8-worker equivalent" benchmark 6 relies on
    ("sgd_accumulate4", "sgd", 4),
    ("sgd_overlap", "sgd", 1), ("adam_accumulate_overlap", "adam", 2),
    ("sgd_predivide", "sgd", 1),  # Horovod's gradient_predivide_factor: the same mean
])
def test_two_workers_equal_one_process_on_the_concatenated_batch(torch_run, name, kind, passes):
    reference = reference_run(kind, passes=passes)
    for rank in (0, 1):
        assert max_difference(tensors(torch_run, name, rank), reference) <= FLOAT64_TOLERANCE


@pytest.mark.parametrize(("name", "overlap"), [
    ("sgd", False), ("sgd_accumulate", False), ("sgd_groups", True), ("sgd_bf16", False),
    ("sgd_overlap", True), ("sgd_bfloat16", False),
])
def test_cpu_models_group_their_allreduce_unless_asked_or_needing_per_tensor_ones(
        torch_run, name, overlap):
    assert torch_run.report(name)["overlap"] is overlap


@pytest.mark.parametrize("name", ["sgd", "adam", "sgd_accumulate", "sgd_fp16", "sgd_bf16",
                                  "sgd_overlap", "sgd_bf16_overlap", "sgd_bf16_sharded",
                                  "sgd_bf16_grad_sharded", "sgd_bfloat16",
                                  "sgd_bfloat16_overlap", "adamw_bfloat16",
                                  "adamw_bfloat16_sharded", "adamw_bfloat16_grad_sharded"])
def test_ranks_are_bit_identical_after_every_step(torch_run, name):
    rank0, rank1 = torch_run.both(name)
    assert len(rank0["checksums"]) == STEPS
    assert rank0["checksums"] == rank1["checksums"]
    assert len(set(rank0["checksums"])) == STEPS  # the weights really moved each step


@pytest.mark.parametrize(("name", "unit"), [
    ("sgd_fp16", FP16_UNIT), ("sgd_bf16", BF16_UNIT), ("sgd_bf16_overlap", BF16_UNIT),
    ("sgd_bf16_sharded", BF16_UNIT), ("sgd_bf16_grad_sharded", BF16_UNIT),
])
def test_compression_stays_within_its_rounding(torch_run, name, unit):
    """Each averaged gradient is rounded to the wire format, a relative error of at most
    one unit roundoff u per worker's value (plus one more rounding of the fp16 sum);
    SGD's update is linear in the gradient, so over 20 steps the weights may differ
    from the uncompressed float32 run by about u times the distance they travelled.
    We allow 2u, covering the second rounding and the feedback of perturbed weights
    into later gradients; measured here: 0.78u (fp16) and 1.02u (bf16, reduced in
    bfloat16 by patch 0011: each rank's value and the sum are rounded)."""
    exact, travelled = float32_run(torch_run)
    difference = max_difference(tensors(torch_run, name), exact)
    assert 0 < difference <= 2 * unit * travelled


def float32_run(run) -> tuple[dict[str, torch.Tensor], float]:
    """The uncompressed float32 run's weights, and the farthest any moved from the start."""
    exact = tensors(run, "sgd_float32")
    initial = {k: v.detach() for k, v in make_model(dtype=torch.float32).named_parameters()}
    return exact, max_difference(exact, initial)


@pytest.mark.parametrize("controller", CONTROLLERS)
def test_bf16_compression_on_four_ranks_stays_within_its_rounding(tmp_path, controller):
    """compression="bf16" on 4 ranks (oversubscribed on 2 cores): each rank's gradient is
    rounded to bfloat16 (u = 2**-8 of it), the sum takes 3 roundings (each at most u of
    the sum of the ranks' magnitudes) and the average one more: 5u of the ranks' mean
    magnitude per step, which we compare with the distance the float32 run travelled
    (as on 2 ranks, where 2u is allowed); measured here: 0.57u. Both trainings run in
    the same launch."""
    out = tmp_path / "out"
    out.mkdir()
    run = Run(launch("torch_adapter.py", str(out), controller=controller, np=4,
                     env={"HVDTRAIN_TEST_SCENARIOS": "sgd_bf16,sgd_float32"}), out)
    exact, travelled = float32_run(run)
    for rank in range(4):
        assert run.report("sgd_bf16", rank)["checksums"] == run.report("sgd_bf16", 0)["checksums"]
        difference = max_difference(tensors(run, "sgd_bf16", rank), exact)
        assert 0 < difference <= 5 * BF16_UNIT * travelled, (
            f"rank {rank}: {difference / (BF16_UNIT * travelled):.2f}u x travelled")


@pytest.mark.parametrize("name", ["sgd_bfloat16", "sgd_bfloat16_overlap", "adamw_bfloat16",
                                  "adamw_bfloat16_sharded", "adamw_bfloat16_grad_sharded"])
def test_bfloat16_parameters_train_as_one_process_within_bfloat16s_rounding(torch_run, name):
    """A bfloat16 model (parameters, gradients and data in bfloat16; patch 0011 reduces
    them) trained on 2 ranks against one process training the same bfloat16 model on the
    concatenated batch. They cannot agree bit for bit: each rank's backward pass rounds
    its own half-batch sums, and the average rounds once more. Each step then rounds every
    weight to bfloat16, where a slightly different gradient may round the other way: at
    most one unit roundoff u = 2**-8 of the weight per step. So after STEPS steps the
    weights may differ by STEPS * u * max|w| (plus the gradients' own rounding, within
    it). A wrong average (a sum, a missed rank) moves them by the whole distance travelled
    instead, several times that bound; measured here: 0.16 of the bound for SGD, 0.23
    for AdamW (the distance travelled: 9.6 and 4.1 times it)."""
    kind = name.split("_")[0]
    reference = reference_run(kind, dtype=torch.bfloat16)
    initial = {k: v.detach() for k, v in make_model(dtype=torch.bfloat16).named_parameters()}
    largest = max(float(t.double().abs().max()) for t in [*reference.values(),
                                                           *initial.values()])
    allowed = STEPS * BF16_UNIT * largest
    travelled = max_difference(reference, initial)
    assert travelled > 3 * allowed  # the bound can tell a wrong average from rounding
    for rank in (0, 1):
        result = tensors(torch_run, name, rank)
        assert all(t.dtype == torch.bfloat16 for t in result.values())
        difference = max_difference(result, reference)
        assert difference <= allowed, (
            f"{name} rank {rank}: {difference:.3g} from the one-process run, allowed "
            f"{allowed:.3g} (travelled {travelled:.3g})")


@pytest.mark.parametrize(("scenario", "details"), [
    ("mismatch_shape", ["rank 1", "'0.weight'", "(5, 6) on rank 0", "(4, 6) on rank 1"]),
    ("mismatch_dtype", ["rank 1", "'0.weight'", "torch.float64 on rank 0",
                        "torch.float32 on rank 1"]),
])
def test_model_mismatch_names_rank_parameter_and_both_values(torch_run, scenario, details):
    for report in torch_run.both(scenario):
        assert report["message"] is not None
        for detail in details:
            assert detail in report["message"]


def test_nonfinite_step_is_skipped_on_every_rank(torch_run):
    rank0, rank1 = torch_run.both("skip_nonfinite")
    assert rank0["checksums"] == rank1["checksums"]
    first, skipped, third = rank0["checksums"]
    assert skipped == first != third
    assert rank0["skipped"] == rank1["skipped"] == 1


def test_step_observers_hear_each_reduction_and_whether_the_step_was_applied(torch_run):
    for report in torch_run.both("skip_nonfinite"):
        assert report["events"] == [
            event for step in range(3) for event in (
                ["reduction_started", step], ["reduction_finished", step],
                ["step_finished", step, step != 1])]


@pytest.mark.parametrize(("case", "raises"), [
    ("small", False),
    ("overflow", True),  # finite on each rank, Inf once summed
    ("cancel", False),  # huge on each rank, 0 on average
    ("one_large", False),  # close to overflow, and finite
    ("nan", True),
    ("fp16_overflow", None),  # near float16's largest: Horovod's fp16 sum decides
])
def test_the_nonfinite_check_raises_exactly_when_the_average_is_not_finite(
        torch_run, case, raises):
    for report in torch_run.both("nonfinite_edges"):
        outcome = report["outcomes"][case]
        assert (outcome["message"] is not None) is (not outcome["finite"]), outcome
        if raises is not None:
            assert (outcome["message"] is not None) is raises, outcome
        if outcome["message"]:
            assert "'weight'" in outcome["message"]
    rank0, rank1 = torch_run.both("nonfinite_edges")
    expected = {"small": -0.5, "cancel": 0.0,
                "one_large": (0.75 * torch.finfo(torch.float32).max + 1.0) / 2}
    if case in expected:
        assert rank0["outcomes"][case]["averaged"] == pytest.approx(expected[case], rel=1e-6)
    assert rank0["outcomes"][case]["averaged"] == rank1["outcomes"][case]["averaged"] or (
        case == "nan")


def test_the_carried_bound_settles_ordinary_steps_and_defers_near_overflow(torch_run):
    """The L2 norms summed in the allreduce prove ordinary gradients finite without a
    read of them; near the largest float, or with fp16 on the wire, the bound defers
    to the read of the averaged gradients (whose outcomes the test above checks)."""
    outcomes = torch_run.report("nonfinite_edges")["outcomes"]
    assert {case: outcome["bound_sufficed"] for case, outcome in outcomes.items()} == {
        "small": True, "overflow": False, "cancel": False, "one_large": False,
        "nan": False, "fp16_overflow": False}


def test_gradients_changed_after_the_users_synchronize_are_read_not_bounded(torch_run):
    for report in torch_run.both("nonfinite_edges"):
        assert report["changed_after_synchronize"] is not None
        assert "'weight'" in report["changed_after_synchronize"]


@pytest.mark.parametrize("scenario", ["join_uneven", "join_uneven_overlap",
                                      "join_uneven_groups"])
def test_uneven_shares_with_join_average_over_the_ranks_that_still_have_data(
        torch_run, scenario):
    """Rank 0 trains 3 batches, rank 1 2 and then joins: the third step averages over
    rank 0 alone (one process on the same batches), not Horovod's divide-by-every-rank
    (half the gradient); after broadcasting from the last rank to join, both agree.
    The flat allreduce, Horovod's per-tensor allreduces during backward
    (``overlap=True``) and its grouped ones (``groups=2``)."""
    reference = uneven_reference_run()
    for rank, report in enumerate(torch_run.both(scenario)):
        assert report["last"] == 0
        assert report["steps"] == JOIN_STEPS[rank]
        assert max_difference(tensors(torch_run, scenario, rank), reference) \
            <= FLOAT64_TOLERANCE
    halved = uneven_reference_run(joined_scale=0.5)
    assert max_difference(halved, reference) > 1e3 * FLOAT64_TOLERANCE


@pytest.mark.parametrize("name", ["grad_scaler", "grad_scaler_sharded"])
def test_grad_scaler_steps_like_plain_averaging(torch_run, name):
    x, y = make_data(dtype=torch.float32)
    model = make_model(dtype=torch.float32)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        optimizer.zero_grad()
        loss_fn(model, x[global_rows(step, 1)], y[global_rows(step, 1)]).backward()
        optimizer.step()
    expected = {name: p.detach() for name, p in model.named_parameters()}
    assert max_difference(tensors(torch_run, name), expected) <= 1e-6
    rank0, rank1 = torch_run.both(name)
    assert rank0["checksum"] == rank1["checksum"]


def test_the_tensor_collective_moves_tensors_as_the_core_expects(torch_run):
    """tensors(): the core's TensorCollective over horovod.torch, each operation against
    the ranks' values combined here."""
    for rank, report in enumerate(torch_run.both("tensor_collective")):
        report = {key: value for key, value in report.items() if key not in ("scenario", "rank")}
        assert report == expected_tensor_collective(2, rank)
