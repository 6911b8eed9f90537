"""DistributedOptimizer and load_model (hvdtrain/adapters/keras/optimizer.py) on 2 real
ranks (Gloo and MPI) against one plain-Keras process.

The launches, shared by tests/adapters/test_keras_*.py: conftest.py's ``keras_run`` and
``keras_torch_run``.
"""

import keras
import numpy as np
import pytest
from harness import max_difference
from workers.keras_common import (
    EPOCHS,
    ETA,
    OVERFLOW_STEP,
    STEPS_PER_EPOCH,
    horovod_rate,
    loss,
    make_data,
    make_model,
    reference_accumulated_fit,
    reference_batch_norm_fit,
    reference_embedding_fit,
    reference_fit,
    reference_mixed_precision,
    shard,
    use_floatx,
)
from workers.scenarios import expected_tensor_collective

import hvdtrain.adapters.keras as hvk

FLOAT64_TOLERANCE = 1e-10
FP16_UNIT, BF16_UNIT = 2.0**-11, 2.0**-8
FIT_CASES = [("sgd", "sgd", 1), ("adam", "adam", 1), ("sgd_accumulate", "sgd", 2)]


@pytest.mark.parametrize(("name", "kind", "passes"), FIT_CASES)
def test_fit_on_two_workers_equals_one_process(keras_run, name, kind, passes):
    reference = reference_fit(kind, passes)
    for rank in (0, 1):
        assert max_difference(keras_run.arrays(name, rank), reference) <= FLOAT64_TOLERANCE


@pytest.mark.parametrize(("name", "kind", "passes"), FIT_CASES)
def test_fit_on_the_torch_backend_equals_one_process(keras_torch_run, name, kind, passes):
    """Keras's torch backend computes every loss in float32 even with floatx float64
    (checked: each loss returns a torch.float32 tensor), so its gradients carry float32
    rounding (~1e-7 relative), which Adam's division by sqrt(v) amplifies for small
    entries (measured: 6e-8 for SGD, 1.4e-6 for Adam after 20 steps). We allow 1e-5
    against the float64 reference; gradients that were not averaged would be off by ~1e-2."""
    reference = reference_fit(kind, passes)
    for rank in (0, 1):
        assert max_difference(keras_torch_run.arrays(name, rank), reference) <= 1e-5
    assert keras_torch_run.both(name)[0]["epoch_sums"] == keras_torch_run.both(name)[1][
        "epoch_sums"]


@pytest.mark.parametrize(("name", "unit"), [("sgd_fp16", FP16_UNIT), ("sgd_bf16", BF16_UNIT)])
def test_compression_stays_within_its_rounding(keras_run, name, unit):
    """As for PyTorch: one rounding of each gradient to the wire format (unit roundoff
    u) perturbs the linear SGD update by about u of the distance travelled; 2u allows
    the sum's own rounding and feedback through later gradients (measured here:
    0.61u for fp16, 0.62u for bf16, which patch 0011 reduces in bfloat16)."""
    check_compression(keras_run, name, unit)


def test_bf16_compression_on_the_torch_backend_stays_within_its_rounding(keras_torch_run):
    """The same through horovod.torch's grouped allreduce (measured: 0.62u)."""
    check_compression(keras_torch_run, "sgd_bf16", BF16_UNIT)


def check_compression(run, name: str, unit: float) -> None:
    exact = run.arrays("sgd_float32")
    use_floatx("float32")
    travelled = max_difference(exact, make_model().get_weights())
    difference = max_difference(run.arrays(name), exact)
    assert 0 < difference <= 2 * unit * travelled


@pytest.mark.parametrize("floatx", ["mixed_bfloat16", "bfloat16"])
def test_bfloat16_fit_equals_one_process_within_bfloat16s_rounding(keras_run, floatx):
    check_bfloat16_fit(keras_run, floatx, "tensorflow")


@pytest.mark.parametrize("floatx", ["mixed_bfloat16", "bfloat16"])
def test_bfloat16_fit_on_the_torch_backend_equals_one_process(keras_torch_run, floatx):
    check_bfloat16_fit(keras_torch_run, floatx, "torch")


def check_bfloat16_fit(run, floatx: str, backend: str) -> None:
    """Keras computing in bfloat16 on 2 ranks, on both backends, against one Keras
    process computing the same on the concatenated batch. mixed_bfloat16 keeps float32
    variables, so its float32 gradients take the flat buffer; "bfloat16" variables give
    bfloat16 gradients, which Horovod reduces natively (patch 0011: TensorFlow's
    HorovodGroupedAllreduce, torch's BFloat16Tensor). Each rank's backward pass rounds
    its half-batch sums in bfloat16 (unit roundoff u = 2**-8) where the one process
    rounds the whole batch's, so the gradients differ by a few u of their size, and
    bfloat16 weights also round every update (one u of the weight per step at most).
    Allowed: STEPS * u * max|w|, which a wrong average (a sum, a missed rank: off by the
    distance travelled, about 9.6 times the bound) exceeds; measured: 0.03-0.05 of the
    bound for mixed_bfloat16, 0.16 for bfloat16. Replicas stay identical (ReplicaCheck
    in the fit, and the epoch checksums here)."""
    name = f"sgd_{floatx}"
    reference = reference_fit("sgd", floatx=floatx)
    initial = make_model().get_weights()
    largest = max(float(np.abs(np.asarray(w, dtype=np.float64)).max())
                  for w in [*reference, *initial])
    allowed = EPOCHS * STEPS_PER_EPOCH * BF16_UNIT * largest
    travelled = max_difference(reference, initial)
    assert travelled > 3 * allowed
    for rank in (0, 1):
        difference = max_difference(run.arrays(name, rank), reference)
        assert difference <= allowed, (
            f"{backend} {floatx} rank {rank}: {difference:.3g} from the one-process fit, "
            f"allowed {allowed:.3g} (travelled {travelled:.3g})")
    assert run.both(name)[0]["epoch_sums"] == run.both(name)[1]["epoch_sums"]


def test_saved_model_loads_plain_and_distributed(keras_run):
    for report in keras_run.both("save_load"):
        assert report["plain_is_base"] and report["loaded_is_subclass"]
        assert report["iterations"] == STEPS_PER_EPOCH
    rank0, rank1 = keras_run.both("save_load")
    assert rank0["after"] == rank1["after"]


def test_checkpoints_are_written_by_rank_0_and_loaded_from_its_file_alone(keras_run):
    """hvk.ModelCheckpoint and save_model on both ranks write each file once (no
    temporary left); load_model gives both ranks rank 0's model though rank 1 named a
    file that does not exist; failures on rank 0 stop both ranks with its error."""
    for report in keras_run.both("checkpoints"):
        assert report["files"] == ["best.weights.h5", "epoch1.keras", "epoch2.keras",
                                   "epoch3.keras", "final.keras"]
        assert report["loaded"] == report["saved"] and report["loaded_distributed"]
        assert report["iterations"] == 3 * STEPS_PER_EPOCH
        assert "rank 0 could not read checkpoint" in report["errors"]["missing"]
        assert "missing.keras does not exist" in report["errors"]["missing"]
        assert "rank 0 could not write checkpoint" in report["errors"]["unwritable"]


def test_resuming_from_a_saved_model_with_initial_epoch_continues_exactly(keras_run):
    straight_lrs = keras_run.both("sgd")[0]["lrs"]
    half = EPOCHS // 2 * STEPS_PER_EPOCH
    assert keras_run.both("resume")[0]["lrs"] == straight_lrs[half:]
    for rank in (0, 1):
        assert max_difference(keras_run.arrays("resume", rank),
                              keras_run.arrays("sgd", rank)) <= 1e-12


def test_a_nonfinite_gradient_stops_fit_on_every_rank_naming_the_step(keras_run):
    for report in keras_run.both("failures"):
        # the sixth row is in the second batch
        assert "NaN or Inf at optimizer step 1 (counting from 0)" in report["nonfinite"]


NONFINITE_ERRORS = {"keras_run": "InvalidArgumentError",  # a graph assertion, fit's too
                    "keras_torch_run": "NonFiniteGradientError"}


NONFINITE_CASES = pytest.mark.parametrize(("case", "raises"), [
    ("small", False),
    ("overflow", True),  # finite on each rank, Inf once summed
    ("cancel", False),  # huge on each rank, 0 on average
    ("one_large", False),  # close to overflow, and finite: applied
    ("nan", True),
    ("fp16_overflow", True),  # each rank's value fits float16, their sum does not
])


@NONFINITE_CASES
def test_the_nonfinite_policies_act_exactly_when_the_average_is_not_finite(
        keras_run, case, raises):
    """The torch optimizer's cases (test_torch_optimizer.py) on Keras's TensorFlow
    backend: "raise" stops every rank with hvdtrain's message naming the variable,
    "skip" skips the update on every rank, and both leave alone what is finite."""
    check_nonfinite_edges(keras_run, "keras_run", case, raises)


@NONFINITE_CASES
def test_the_nonfinite_policies_on_the_torch_backend(keras_torch_run, case, raises):
    check_nonfinite_edges(keras_torch_run, "keras_torch_run", case, raises)


def check_nonfinite_edges(run, backend_run: str, case: str, raises: bool) -> None:
    rank0, rank1 = (report["outcomes"][case] for report in run.both("nonfinite_edges"))
    for outcome in (rank0, rank1):
        assert outcome["finite"] is not raises, outcome
        if raises:
            assert outcome["error"]["type"] == NONFINITE_ERRORS[backend_run], outcome
            assert "the worker-averaged gradient of 'weight' holds NaN or Inf at optimizer " \
                   "step 0" in outcome["error"]["message"], outcome
        else:
            assert outcome["error"] is None, outcome
        assert outcome["skipped"] == int(raises), outcome
        assert outcome["applied_despite_skip"] is not raises, outcome
    expected = {"small": -0.5, "cancel": 0.0,
                "one_large": (0.75 * float(np.finfo(np.float32).max) + 1.0) / 2}
    if case in expected:
        assert rank0["averaged"] == pytest.approx(expected[case], rel=1e-6)
    assert rank0["averaged"] == rank1["averaged"] or case == "nan"


def test_skip_nonfinite_skips_the_update_on_every_rank(keras_run):
    for report in keras_run.both("failures"):
        assert report["skipped"] == 1  # one batch held rank 1's NaN row
        assert report["finite_after_skip"]  # and the replicas were then compared


def test_check_nonfinite_false_applies_the_update_as_horovod_does(keras_run):
    for report in keras_run.both("failures"):
        assert report["unchecked_error"] is None
        assert report["unchecked_nan"]  # the NaN reached the weights on every rank


@pytest.mark.parametrize(("arguments", "message"), [
    ({"compression": "int8"}, "compression must be None, 'fp16' or 'bf16'"),
    ({"backward_passes_per_step": 0}, "backward_passes_per_step must be an int > 0"),
    ({"op": hvk.Sum + 100}, "op must be Average or Sum"),
])
def test_distributed_optimizer_rejects_bad_arguments(arguments, message):
    with pytest.raises(ValueError, match=message):
        hvk.DistributedOptimizer(keras.optimizers.SGD(0.1), **arguments)


def test_distributed_optimizer_refuses_a_used_optimizer_and_keeps_the_config():
    optimizer = keras.optimizers.SGD(0.1, momentum=0.8, nesterov=True, clipnorm=1.0)
    wrapped = hvk.DistributedOptimizer(optimizer, backward_passes_per_step=3)
    assert isinstance(wrapped, keras.optimizers.SGD)
    config = wrapped.get_config()
    assert config == {**optimizer.get_config(), "gradient_accumulation_steps": 3}
    optimizer.build([keras.Variable(np.zeros(2))])
    with pytest.raises(ValueError, match="already been used"):
        hvk.DistributedOptimizer(optimizer)


def test_accumulating_across_workers_makes_a_plain_optimizer_distributed_or_says_why():
    """What DistributedGradientTape(backward_passes_per_step=N, optimizer=...) needs of
    the optimizer; the 2-rank behaviour is in test_tensorflow.py."""
    from hvdtrain.adapters.keras.optimizer import (
        accumulate_across_workers,
        gradient_compression,
    )

    plain = keras.optimizers.SGD(0.1, momentum=0.9, gradient_accumulation_steps=2)
    accumulate_across_workers(plain, 2, compression="fp16", op=hvk.Average,
                              check_nonfinite=True)
    distributed = type(plain)
    assert issubclass(distributed, keras.optimizers.SGD) and distributed.__name__ == "SGD"
    assert gradient_compression(plain) == "fp16"
    accumulate_across_workers(plain, 2, compression="fp16", op=hvk.Average,
                              check_nonfinite=True)
    assert type(plain) is distributed
    with pytest.raises(ValueError, match="give them to one of the two"):
        accumulate_across_workers(plain, 2, compression=None, op=hvk.Average,
                                  check_nonfinite=True)
    wrapped = hvk.DistributedOptimizer(keras.optimizers.SGD(0.1), backward_passes_per_step=3)
    accumulate_across_workers(wrapped, 3, compression=None, op=hvk.Average,
                              check_nonfinite=True)
    for optimizer, fix in [(keras.optimizers.SGD(0.1), "gradient_accumulation_steps=2"),
                           (wrapped, "gradient_accumulation_steps=2")]:
        with pytest.raises(ValueError, match=f"accumulates .* per update: make it with {fix}"):
            accumulate_across_workers(optimizer, 2, compression=None, op=hvk.Average,
                                      check_nonfinite=True)
    with pytest.raises(ValueError, match="not supported with loss scaling"):
        accumulate_across_workers(keras.optimizers.LossScaleOptimizer(
            keras.optimizers.SGD(0.1, gradient_accumulation_steps=2)), 2, compression=None,
            op=hvk.Average, check_nonfinite=True)
    with pytest.raises(TypeError, match="the Keras 3 optimizer that applies"):
        accumulate_across_workers(object(), 2, compression=None, op=hvk.Average,
                                  check_nonfinite=True)


def test_mixed_float16_ranks_take_the_loss_scaling_decision_together(keras_run):
    """Rank 1's share of step 2 overflows float16: with Keras's own wrapper rank 1 alone
    would skip the step and halve its scale (rank 0's allreduce then pairs with rank 1's
    next step). Here both skip it and halve, the step count stays in step, and the
    weights equal one plain-Keras process with loss scaling on the concatenated batch
    (which sees the overflow in its step 2 too)."""
    reference, recorder = reference_mixed_precision()
    runs = keras_run.both("mixed_precision")
    for run in runs:
        assert run["optimizer"] == "LossScaleOptimizer"
        assert run["scales"] == recorder.scales
        assert run["iterations"] == recorder.iterations
    assert recorder.scales[OVERFLOW_STEP] == recorder.scales[OVERFLOW_STEP - 1] / 2
    assert recorder.iterations[OVERFLOW_STEP] == recorder.iterations[OVERFLOW_STEP - 1]
    for rank in (0, 1):
        # float16 forward passes over 4 rows per rank vs 8 in one process.
        assert max_difference(keras_run.arrays("mixed_precision", rank), reference) <= 2e-3


def test_loss_scaling_is_distributed_when_asked_for_and_a_late_policy_is_refused():
    from hvdtrain.adapters.keras.optimizer import require_agreeing_loss_scaling

    wrapped = hvk.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(
        keras.optimizers.SGD(0.1), initial_scale=1024.0))
    assert isinstance(wrapped, keras.optimizers.LossScaleOptimizer)
    assert wrapped.initial_scale == 1024.0 and type(wrapped.inner_optimizer) is \
        keras.optimizers.SGD
    require_agreeing_loss_scaling(wrapped)
    with pytest.raises(ValueError, match="backward_passes_per_step"):
        hvk.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1)),
                                 backward_passes_per_step=2)
    # The policy set after wrapping: compile adds Keras's own wrapper around ours.
    late = keras.optimizers.LossScaleOptimizer(hvk.DistributedOptimizer(keras.optimizers.SGD(0.1)))
    with pytest.raises(ValueError, match="set the mixed_float16 policy before"):
        require_agreeing_loss_scaling(late)
    with pytest.raises(ValueError, match="already distributed"):
        hvk.DistributedOptimizer(late)


def test_horovods_names_keep_horovods_meaning(keras_run):
    """The Horovod-named callbacks and DistributedOptimizer arguments (the intents of
    Horovod's test_tensorflow2_keras.py, whose own code needs Keras 2; docs/keras.md, "Coming
    from Horovod")."""
    rank0, rank1 = keras_run.both("horovod_api")
    expected = [horovod_rate(epoch, batch) for epoch in range(EPOCHS)
                for batch in range(STEPS_PER_EPOCH)]
    for run in (rank0, rank1):
        assert run["lrs"] == pytest.approx(expected, rel=1e-12)
        # BroadcastGlobalVariablesCallback(root_rank=1, local_variables=first layer):
        # the first layer's kernel and bias keep each rank's value, the rest is rank 1's.
        assert run["broadcast"][2:] == [[1.0]] * (len(run["broadcast"]) - 2)
        arguments = run["arguments"]
        # backward_passes_per_step=2 alone sums the micro-batches (Horovod's default,
        # average_aggregated_gradients=False): the same step as their mean (True) at
        # twice the rate.
        assert arguments["sum_at_half_rate_vs_mean"] <= 1e-12
        assert arguments["predivided_vs_plain"] <= 1e-12
        assert arguments["fp16_object_vs_name"] == 0.0
    assert rank0["broadcast"][:2] == [[0.0], [0.0]] and rank1["broadcast"][:2] == [[1.0], [1.0]]
    assert rank0["averaged_logs"] == rank1["averaged_logs"]


@pytest.mark.parametrize("sparse_as_dense", [False, True])
def test_embedding_gradients_average_like_one_process(keras_run, sparse_as_dense):
    reference = reference_embedding_fit()
    for rank in (0, 1):
        trained = keras_run.arrays(f"embedding_sparse_as_dense_{sparse_as_dense}", rank)
        assert max_difference(trained, reference) <= FLOAT64_TOLERANCE


def check_sync_batch_norm(run, tolerance: float) -> None:
    """Weights and moving statistics after an epoch on 2 ranks equal one process with
    plain BatchNormalization on the concatenated batch; plain BatchNormalization on
    2 ranks (each worker's own statistics) does not."""
    run.both("sync_batch_norm")  # the scenario ran on both ranks
    reference = reference_batch_norm_fit()
    for rank in (0, 1):
        assert max_difference(run.arrays("sync_batch_norm", rank), reference) <= tolerance
    assert max_difference(run.arrays("local_batch_norm", 0), reference) > 1e-3


def test_sync_batch_normalization_normalizes_the_global_batch(keras_run):
    check_sync_batch_norm(keras_run, FLOAT64_TOLERANCE)


def test_sync_batch_normalization_on_the_torch_backend(keras_torch_run):
    """The torch backend's losses are float32 (see above)."""
    check_sync_batch_norm(keras_torch_run, 1e-5)


def test_partial_distributed_optimizer_keeps_local_layers_local(keras_run):
    """One SGD step with the first layer local: its gradient is each rank's own divided
    by size() (Horovod's scale_local_gradients), the others' the mean over ranks;
    each rank's gradients computed here in one process."""
    import tensorflow as tf

    keras_run.both("partial_distributed")
    use_floatx("float64")
    gradients = []
    for rank in (0, 1):
        x, y = shard(*make_data(), rank)
        model = make_model()
        with tf.GradientTape() as tape:
            value = loss()(y[:4], model(tf.constant(x[:4]), training=True))
        gradients.append([g.numpy() for g in tape.gradient(value, model.trainable_variables)])
    start = make_model().get_weights()
    for rank in (0, 1):
        trained = keras_run.arrays("partial_distributed", rank)
        for i, (before, after) in enumerate(zip(start, trained, strict=True)):
            step = (gradients[rank][i] / 2 if i < 2
                    else (gradients[0][i] + gradients[1][i]) / 2)
            assert np.allclose(after, before - ETA["sgd"] * step, rtol=0, atol=1e-12), i


def test_a_nonfinite_accumulation_window_is_skipped_and_the_next_starts_clean(keras_run):
    """backward_passes_per_step=2 with skip_nonfinite: the window holding rank 1's NaN
    micro-batch is skipped on both ranks, its accumulators are cleared, and the 4
    updates after it equal one process on the batches after the first."""
    reference = reference_accumulated_fit(skipped_updates=1)
    for rank in (0, 1):
        assert keras_run.both("accumulate_nonfinite")[rank]["skipped"] == 1
        assert max_difference(keras_run.arrays("accumulate_nonfinite", rank), reference) \
            <= FLOAT64_TOLERANCE


def check_tensor_collective(run) -> None:
    for rank, report in enumerate(run.both("tensor_collective")):
        report = {key: value for key, value in report.items() if key not in ("scenario", "rank")}
        assert report == expected_tensor_collective(2, rank)


def test_the_tensor_collective_moves_keras_tensors_as_the_core_expects(keras_run):
    """tensors(): the core's TensorCollective over horovod.tensorflow, each operation
    against the ranks' values combined here."""
    check_tensor_collective(keras_run)


def test_the_tensor_collective_on_the_torch_backend(keras_torch_run):
    check_tensor_collective(keras_torch_run)


STEP_EVENTS = [event for step in range(3) for event in (
    ["reduction_started", step], ["reduction_finished", step],
    ["step_finished", step, step != 1])]


def test_step_observers_hear_every_update_of_fit(keras_run):
    """hvdtrain.step_events' observers, called from fit's traced graph: each reduction,
    and each update applied or (the NaN batch, skip_nonfinite=True) skipped."""
    for report in keras_run.both("step_events"):
        assert report["events"] == STEP_EVENTS


def test_step_observers_on_the_torch_backend(keras_torch_run):
    for report in keras_torch_run.both("step_events"):
        assert report["events"] == STEP_EVENTS
