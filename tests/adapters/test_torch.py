"""hvdtrain.adapters.torch on 2 real ranks (Gloo and MPI) against one plain process.

One launch per controller runs every scenario of tests/workers/torch_adapter.py;
these tests read its reports and saved tensors.
"""

import pytest
import torch
from workers.torch_common import (
    STEPS,
    global_rows,
    loss_fn,
    make_data,
    make_model,
    reference_run,
    schedule,
)

from hvdtrain.schedule import LinearScalingSchedule

FLOAT64_TOLERANCE = 1e-10
# Unit roundoff of the wire formats.
FP16_UNIT, BF16_UNIT = 2.0**-11, 2.0**-8


@pytest.fixture
def run(torch_run):
    return torch_run


def tensors(run, name, rank=0):
    return torch.load(run.out_dir / f"{name}-rank{rank}.pt")


def max_difference(a, b):
    return max((a[name].double() - b[name].double()).abs().max().item() for name in b)


@pytest.mark.parametrize(("name", "kind", "passes"), [
    ("sgd", "sgd", 1), ("adam", "adam", 1), ("sgd_groups", "sgd", 1),
    ("sgd_accumulate", "sgd", 2), ("adam_accumulate", "adam", 2),
])
def test_two_workers_equal_one_process_on_the_concatenated_batch(run, name, kind, passes):
    reference = reference_run(kind, passes=passes)
    for rank in (0, 1):
        assert max_difference(tensors(run, name, rank), reference) <= FLOAT64_TOLERANCE


@pytest.mark.parametrize("name", ["sgd", "adam", "sgd_accumulate", "sgd_fp16", "sgd_bf16"])
def test_ranks_are_bit_identical_after_every_step(run, name):
    rank0, rank1 = run.both(name)
    assert len(rank0["checksums"]) == STEPS
    assert rank0["checksums"] == rank1["checksums"]
    assert len(set(rank0["checksums"])) == STEPS  # the weights really moved each step


@pytest.mark.parametrize(("name", "passes"), [("sgd", 1), ("adam", 1), ("sgd_accumulate", 2)])
def test_learning_rate_follows_the_schedule_step_by_step(run, name, passes):
    eta = {"sgd": 0.05, "adam": 0.01, "sgd_accumulate": 0.05}[name]
    expected = schedule(passes, base_lr=eta)
    assert run.report(name)["lrs"] == [expected.lr_at(step) for step in range(STEPS)]
    assert expected.scale == 2 * passes


@pytest.mark.parametrize(("name", "unit"), [("sgd_fp16", FP16_UNIT), ("sgd_bf16", BF16_UNIT)])
def test_compression_stays_within_its_rounding(run, name, unit):
    """Each averaged gradient is rounded to the wire format, a relative error of at most
    one unit roundoff u per worker's value (plus one more rounding of the fp16 sum);
    SGD's update is linear in the gradient, so over 20 steps the weights may differ
    from the uncompressed float32 run by about u times the distance they travelled.
    We allow 2u, covering the second rounding and the feedback of perturbed weights
    into later gradients; measured here: 0.78u (fp16) and 0.47u (bf16)."""
    exact = tensors(run, "sgd_float32")
    initial = dict(make_model(dtype=torch.float32).named_parameters())
    travelled = max_difference(exact, {k: v.detach() for k, v in initial.items()})
    difference = max_difference(tensors(run, name), exact)
    assert 0 < difference <= 2 * unit * travelled


def test_broadcast_state_from_different_seeds(run):
    rank0, rank1 = run.both("broadcast_state")
    assert rank0["before"] != rank1["before"]
    assert rank0["after"] == rank0["before"] == rank1["after"]
    assert rank0["identical"] and rank1["identical"]  # verify_replicas, Adam state included
    assert rank1["adam_state_entries"] == rank0["adam_state_entries"] == 4
    assert rank1["extra"] == rank0["extra"] == {"epoch": 3, "seed": 41}
    assert rank1["last_lr"] == rank0["last_lr"] == [0.01 * 0.5**3]


def test_broadcast_state_creates_no_state_and_leaves_the_weights(run):
    rank0, rank1 = run.both("broadcast_fresh")
    assert rank0["after"] == rank0["before"] == rank1["after"] != rank1["before"]
    assert rank0["state_entries"] == rank1["state_entries"] == 0


@pytest.mark.parametrize(("scenario", "details"), [
    ("mismatch_shape", ["rank 1", "'0.weight'", "(5, 6) on rank 0", "(4, 6) on rank 1"]),
    ("mismatch_dtype", ["rank 1", "'0.weight'", "torch.float64 on rank 0",
                        "torch.float32 on rank 1"]),
])
def test_model_mismatch_names_rank_parameter_and_both_values(run, scenario, details):
    for report in run.both(scenario):
        assert report["message"] is not None
        for detail in details:
            assert detail in report["message"]


def test_verify_replicas_names_the_rank_and_tensor(run):
    for report in run.both("verify_replicas"):
        assert "rank(s) [1]" in report["message"]
        assert "model.2.bias" in report["message"]


def test_nonfinite_step_is_skipped_on_every_rank(run):
    rank0, rank1 = run.both("skip_nonfinite")
    assert rank0["checksums"] == rank1["checksums"]
    first, skipped, third = rank0["checksums"]
    assert skipped == first != third
    assert rank0["skipped"] == rank1["skipped"] == 1


def test_resume_from_checkpoint_continues_exactly(run):
    for report in run.both("checkpoint"):
        assert report["extra"] == {"step": 3, "note": "after 3 steps"}
        assert report["resumed"] == report["straight"]
        assert report["resumed_lrs"] == report["straight_lrs"]
        expected = LinearScalingSchedule(base_lr=0.01, batch_size_per_worker=4, workers=2,
                                         steps_per_epoch=2, base_batch_size=4, warmup_epochs=2)
        assert report["straight_lrs"] == [expected.lr_at(step) for step in range(8)]


def test_failed_checkpoint_write_raises_everywhere_and_keeps_the_previous(run):
    for report in run.both("checkpoint"):
        assert "disk full (injected)" in report["torn_error"]
        assert report["leftovers"] == []
    payload = torch.load(run.out_dir / "checkpoint.pt", weights_only=True)
    assert payload["extra"]["step"] == 3


def test_missing_checkpoint_raises_on_every_rank(run):
    for report in run.both("checkpoint_missing"):
        assert "missing.pt" in report["error"] and "FileNotFoundError" in report["error"]


def test_grad_scaler_steps_like_plain_averaging(run):
    x, y = make_data(dtype=torch.float32)
    model = make_model(dtype=torch.float32)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        optimizer.zero_grad()
        loss_fn(model, x[global_rows(step, 1)], y[global_rows(step, 1)]).backward()
        optimizer.step()
    expected = {name: p.detach() for name, p in model.named_parameters()}
    assert max_difference(tensors(run, "grad_scaler"), expected) <= 1e-6
    rank0, rank1 = run.both("grad_scaler")
    assert rank0["checksum"] == rank1["checksum"]


def test_average_metrics_and_sampler(run):
    rank0, rank1 = run.both("metrics")
    expected = {"loss": (1.0 + 2.0) / 2, "accuracy": (0.0 + 0.25) / 2}
    assert rank0["averaged"] == rank1["averaged"] == pytest.approx(expected)
    for report in (rank0, rank1):
        assert "['loss'] on rank 0 but ['los'] on rank 1" in report["key_error"]
    for epoch in (0, 1):
        shares = rank0["sampler"][epoch] + rank1["sampler"][epoch]
        assert sorted(shares) == list(range(10))
    assert rank0["sampler"][0] != rank0["sampler"][1]
