"""hvdtrain.adapters.tensorflow: a tf.function custom loop on 2 ranks against one process."""

import json
import re
from collections import Counter
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from harness import max_difference
from workers.keras_common import (
    EPOCHS,
    STEPS_PER_EPOCH,
    reference_accumulated_fit,
    reference_custom_loop,
    reference_join_fit,
    schedule,
    use_floatx,
)

import hvdtrain.adapters.tensorflow as hvtf
from hvdtrain.schedule import LinearScalingSchedule


def test_custom_loop_on_two_workers_equals_one_process(keras_run):
    reference = reference_custom_loop()
    for rank in (0, 1):
        assert max_difference(keras_run.arrays("custom_loop", rank), reference) <= 1e-10
    rank0, rank1 = keras_run.both("custom_loop")
    assert rank0["first"] == rank1["first"] and rank0["after"] == rank1["after"]


def test_the_tape_stops_every_rank_on_a_nonfinite_average_unless_told_not_to(keras_run):
    for report in keras_run.both("custom_loop_checks"):
        # names the variable (its Keras path) whose averaged gradient is not finite
        assert re.search(r"worker-averaged gradient of '[\w/]+/kernel' holds NaN or Inf at "
                         r"optimizer step", report["error"]), report["error"]
        assert "check_nonfinite=False" in report["error"]
        assert report["passed_through"]


def test_uneven_shares_in_a_custom_loop_with_join_equal_one_process(keras_run):
    """Shares of 3 and 2 batches, 2 epochs: the tape's average divides by the ranks that
    sent gradients (rank 0 alone on each epoch's third step) and the state of the last
    rank to join, broadcast after ``hvtf.join()``, starts the next epoch."""
    reference, _ = reference_join_fit(warmup=False)
    for rank in (0, 1):
        assert max_difference(keras_run.arrays("custom_loop_join", rank), reference) <= 1e-10
    rank0, rank1 = keras_run.both("custom_loop_join")
    assert rank0["after"] == rank1["after"]


def test_micro_batches_accumulate_in_a_custom_loop_like_one_process(keras_run):
    """Plain tape gradients into DistributedOptimizer(backward_passes_per_step=2) with
    optimizer.apply: 10 micro-batches are 5 updates, each the mean over 2 micro-batches
    and 2 workers, equal to one process on the 16-example batches."""
    reference = reference_accumulated_fit()
    for rank in (0, 1):
        assert keras_run.both("custom_loop_checks")[rank]["updates"] == STEPS_PER_EPOCH
        assert max_difference(keras_run.arrays("custom_loop_accumulate", rank), reference) \
            <= 1e-10


def test_the_tape_accumulates_micro_batches_like_one_process(keras_run):
    """DistributedGradientTape(backward_passes_per_step=2) into a plain SGD made with
    gradient_accumulation_steps=2: 10 micro-batches are 5 updates, each the mean over 2
    micro-batches and 2 workers, equal to one process on the 16-example batches. The
    gradients went through 5 allreduces, one per update, all in one flat buffer
    (Horovod's timeline: averaging every micro-batch would give the same weights with
    10). A NaN in rank 1's second
    micro-batch stops both ranks at update 0."""
    reference = reference_accumulated_fit()
    for rank in (0, 1):
        assert max_difference(keras_run.arrays("tape_accumulate", rank), reference) <= 1e-10
    negotiations = allreduces_by_tensor(keras_run.out_dir / "tape_accumulate_timeline.json")
    gradients = {name: count for name, count in negotiations.items()
                 if name.startswith("hvdtrain.gradients")}
    # float64 gradients on TensorFlow travel in one flat buffer (keras/tally.py)
    assert gradients == {"hvdtrain.gradients": STEPS_PER_EPOCH}, negotiations
    for report in keras_run.both("tape_accumulate"):
        assert report["updates"] == STEPS_PER_EPOCH
        assert report["optimizer_class"] == "SGD"
        assert report["error"].startswith("micro-batch 1:")
        assert re.search(r"worker-averaged gradient of '[\w/]+' holds NaN or Inf at "
                         r"optimizer step 0 \(counting", report["error"]), report["error"]
        assert "check_nonfinite=False to DistributedGradientTape" in report["error"]


def allreduces_by_tensor(timeline: Path) -> Counter:
    """How many allreduces Horovod's timeline file shows for each tensor name."""
    events = json.loads(timeline.read_text())
    names = {e["pid"]: e["args"]["name"] for e in events
             if e.get("name") == "process_name" and "name" in e.get("args", {})}
    return Counter(names[e["pid"]] for e in events
                   if e.get("ph") == "B" and e.get("name") == "NEGOTIATE_ALLREDUCE")


def test_custom_loop_learning_rate_is_the_schedule(keras_run):
    plan = schedule("sgd")
    expected = [plan.lr_at(step) for step in range(EPOCHS * STEPS_PER_EPOCH)]
    assert keras_run.both("custom_loop")[0]["lrs"] == expected


def test_schedule_object_is_hvdtrain_schedule_and_serializes():
    arguments = dict(batch_size_per_worker=32, steps_per_epoch=10, base_batch_size=64,
                     warmup_epochs=3, milestones=[5, 8], gamma=0.5, world_size=8)
    use_floatx("float64")
    rate = hvtf.LinearScalingWarmup(0.1, **arguments)
    plan = LinearScalingSchedule(base_lr=0.1, batch_size_per_worker=32, world_size=8,
                                 steps_per_epoch=10, base_batch_size=64, warmup_epochs=3,
                                 milestones=(5, 8), gamma=0.5)
    steps = range(0, 100)
    assert [float(rate(tf.constant(s))) for s in steps] == [plan.lr_at(s) for s in steps]
    graph_rate = tf.function(rate.__call__, autograph=False)
    assert float(graph_rate(tf.constant(37, tf.int64))) == plan.lr_at(37)
    copy = keras.optimizers.schedules.deserialize(keras.optimizers.schedules.serialize(rate))
    assert copy.get_config() == rate.get_config()
    assert float(copy(tf.constant(12))) == plan.lr_at(12)


def test_schedule_rejects_bad_input_and_needs_a_world_size():
    with pytest.raises(ValueError, match="steps_per_epoch must be an int > 0"):
        hvtf.LinearScalingWarmup(0.1, batch_size_per_worker=32, steps_per_epoch=0, world_size=2)
    with pytest.raises(RuntimeError, match="call init"):
        hvtf.LinearScalingWarmup(0.1, batch_size_per_worker=32, steps_per_epoch=5)


def test_gradient_tape_rejects_bad_arguments():
    with tf.GradientTape() as tape:
        pass
    with pytest.raises(ValueError, match=r"needs optimizer=.*gradient_accumulation_steps=2"):
        hvtf.DistributedGradientTape(tape, backward_passes_per_step=2)
    with pytest.raises(ValueError, match="backward_passes_per_step must be an int > 0"):
        hvtf.DistributedGradientTape(tape, backward_passes_per_step=0)
    with pytest.raises(ValueError, match="compression"):
        hvtf.DistributedGradientTape(tape, compression="fp8")
    with pytest.raises(TypeError, match=r"tf\.GradientTape"):
        hvtf.DistributedGradientTape(np.zeros(1))
