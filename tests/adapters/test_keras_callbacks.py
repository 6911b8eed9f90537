"""The callbacks (hvdtrain/adapters/keras/callbacks/) and verify_replicas
(hvdtrain/adapters/keras/replicas.py) on 2 real ranks (Gloo and MPI).

The launches, shared by tests/adapters/test_keras_*.py: conftest.py's ``keras_run`` and
``keras_torch_run``.
"""

import numpy as np
import pytest
from harness import max_difference
from workers.keras_common import (
    EPOCHS,
    JOIN_BATCHES,
    JOIN_EPOCHS,
    STEPS_PER_EPOCH,
    join_schedule,
    loss,
    make_model,
    make_validation_data,
    reference_join_fit,
    schedule,
    use_floatx,
)

FIT_CASES = [("sgd", "sgd", 1), ("adam", "adam", 1), ("sgd_accumulate", "sgd", 2)]


@pytest.mark.parametrize("name", ["sgd", "adam", "sgd_accumulate", "sgd_bf16",
                                  "sgd_mixed_bfloat16", "sgd_bfloat16"])
def test_replicas_identical_before_the_first_step_and_after_every_epoch(keras_run, name):
    rank0, rank1 = keras_run.both(name)
    assert rank0["first"] == rank1["first"]  # they were built from different seeds
    assert rank0["epoch_sums"] == rank1["epoch_sums"]
    assert len(set(rank0["epoch_sums"])) == EPOCHS


@pytest.mark.parametrize(("name", "kind", "passes"), FIT_CASES)
def test_learning_rate_of_every_batch_is_the_schedule(keras_run, name, kind, passes):
    plan = schedule(kind, passes)
    batches = STEPS_PER_EPOCH * passes
    expected = [plan.lr_at((epoch * batches + batch) // passes)
                for epoch in range(EPOCHS) for batch in range(batches)]
    assert keras_run.both(name)[0]["lrs"] == expected


def test_momentum_correction_rescales_the_velocity(keras_run):
    report = keras_run.both("sgd")[0]
    factor = report["lr_after"] / report["lr_before"]
    assert factor > 1  # the 4th batch is inside the warmup
    for before, after in zip(report["velocity_before"], report["velocity_after"], strict=True):
        np.testing.assert_allclose(after, np.asarray(before) * factor, rtol=1e-15, atol=0)
        assert np.any(np.asarray(before) != 0)


def test_metric_average_is_the_mean_of_the_ranks(keras_run):
    rank0, rank1 = keras_run.both("sgd")
    for epoch in range(EPOCHS):
        raw0, raw1 = rank0["raw_logs"][epoch], rank1["raw_logs"][epoch]
        assert raw0["loss"] != raw1["loss"]  # the shards differ
        for report in (rank0, rank1):
            assert report["averaged_logs"][epoch]["loss"] == pytest.approx(
                (raw0["loss"] + raw1["loss"]) / 2, rel=1e-15)


def test_replica_check_and_metric_keys_name_what_differs(keras_run):
    for report in keras_run.both("replica_check"):
        assert "rank(s) [1]" in report["message"] and "bias" in report["message"]
        assert "['loss'] on rank 0 but ['loss', 'val_loss'] on rank 1" in report["key_error"]


def test_ranks_that_start_differently_are_stopped_before_the_first_step(keras_run):
    for report in keras_run.both("failures"):
        errors = report["disagreements"]
        assert "optimizer class is 'SGD' on rank 0 but 'Adam' on rank 1" in errors["optimizer"]
        assert "batch_size_per_worker is 4 on rank 0 but 8 on rank 1" in errors["batch size"]
        assert "flat gradient buffer (hvdtrain._tf_packing, built by scripts/setup.sh) is " \
               "True on rank 0 but False on rank 1" in errors["flat buffer"]


def test_metric_average_weighted_by_examples_equals_one_process_on_uneven_validation(
        keras_run):
    """Validation shares of 11 and 10 examples: with validation_examples, val_loss and
    val_accuracy are those of one process evaluating all 21 with the final weights
    (both ranks log them); the plain mean of the two shares' means is not."""
    use_floatx("float64")
    model = make_model()
    model.compile(loss=loss(), metrics=["accuracy"], jit_compile=False)
    model.set_weights(keras_run.arrays("uneven_validation"))
    xv, yv = make_validation_data()
    expected_loss, expected_accuracy = model.evaluate(xv, yv, batch_size=32, verbose=0)
    rank0, rank1 = keras_run.both("uneven_validation")
    assert (rank0["shares"], rank1["shares"]) == (11, 10)
    for report in (rank0, rank1):
        assert report["weighted"]["val_loss"] == pytest.approx(expected_loss, rel=1e-10)
        assert report["weighted"]["val_accuracy"] == pytest.approx(expected_accuracy,
                                                                   rel=1e-10)
    assert rank0["unweighted"]["val_loss"] != pytest.approx(expected_loss, rel=1e-6)


def test_join_at_epoch_end_trains_uneven_shares_like_one_process(keras_run):
    """Shares of 3 and 2 batches for 2 epochs: the third step of each epoch averages rank
    0's batch alone, as one process on the blocks that remain does (plain Horovod would
    halve it); both ranks end every epoch identical, with the schedule's rates for an
    epoch of 3 steps, and the epoch loss weighted by examples is one process's."""
    check_join_uneven(keras_run, 1e-10)


def test_join_at_epoch_end_on_the_torch_backend(keras_torch_run):
    """The same on Keras's torch backend (float32 losses: see test_keras_optimizer.py)."""
    check_join_uneven(keras_torch_run, 1e-5)


def check_join_uneven(run, tolerance: float) -> None:
    reference, reference_loss = reference_join_fit()
    for rank in (0, 1):
        assert max_difference(run.arrays("join_uneven", rank), reference) <= tolerance
    rank0, rank1 = run.both("join_uneven")
    assert rank0["epoch_sums"] == rank1["epoch_sums"]
    assert rank0["steps"] == rank1["steps"] == JOIN_EPOCHS * max(JOIN_BATCHES)
    plan, epoch = join_schedule(), max(JOIN_BATCHES)
    for report, batches in zip((rank0, rank1), JOIN_BATCHES, strict=True):
        assert report["lrs"] == [plan.lr_at(e * epoch + b) for e in range(JOIN_EPOCHS)
                                 for b in range(batches)]
    for report in (rank0, rank1):
        assert report["loss"] == pytest.approx(reference_loss, rel=tolerance)


def test_join_can_be_called_again_in_the_same_process(keras_run):
    """Two joins in a row, each answered by both ranks (on TensorFlow, patch 0005 is what
    lets the second run at all: tests/test_stock_horovod.py shows the refusal without it)."""
    check_join_twice(keras_run)


def test_join_can_be_called_again_on_the_torch_backend(keras_torch_run):
    check_join_twice(keras_torch_run)


def check_join_twice(run) -> None:
    for report in run.both("join_twice"):
        assert len(report["last_joined"]) == 2
        assert set(report["last_joined"]) <= {0, 1}
