"""Runs on each of 2 ranks: the checks of hvdtrain.adapters.keras (and, on the TensorFlow
backend, hvdtrain.adapters.tensorflow) in one launch.

``python keras_adapter.py OUTDIR``. Each scenario prints ``REPORT {json}`` lines and
saves weights as OUTDIR/<name>-rank<r>.npz; tests/adapters/test_keras_*.py and
test_tensorflow.py compare them with one plain-Keras process. Run with
KERAS_BACKEND=torch it runs the backend-independent fit scenarios only.
"""

import functools
import sys
from pathlib import Path

import keras
import numpy as np
from keras_common import (
    BATCH_PER_WORKER,
    EPOCHS,
    ETA,
    HOROVOD_LR,
    JOIN_EPOCHS,
    STEPS_PER_EPOCH,
    WARMUP_EPOCHS,
    LossScaleRecorder,
    join_shares,
    loss,
    make_batch_norm_model,
    make_data,
    make_embedding_data,
    make_embedding_model,
    make_model,
    make_optimizer,
    make_overflowing_data,
    make_validation_data,
    shard,
    use_floatx,
)
from scenarios import EventRecorder, exercise_tensor_collective, run_scenarios
from scenarios import report as report_for_rank

import hvdtrain.adapters.keras as hvk
from hvdtrain.adapters.keras import tally
from hvdtrain.adapters.keras.backend import tensors
from hvdtrain.replicas import checksums
from hvdtrain.step_events import step_observers

OUT = Path(sys.argv[1])
TENSORFLOW = keras.backend.backend() == "tensorflow"


def report(scenario: str, **values) -> None:
    report_for_rank(hvk.rank(), scenario, **values)


def weights_checksum(model: keras.Model) -> str:
    return str(checksums((str(i), w) for i, w in enumerate(model.get_weights())))


def save(name: str, model: keras.Model) -> None:
    """The model's weights, bfloat16 ones widened (exactly) to float32, which .npz holds."""
    weights = [w.astype(np.float32) if w.dtype.name == "bfloat16" else w
               for w in model.get_weights()]
    np.savez(OUT / f"{name}-rank{hvk.rank()}.npz", *weights)


class Recorder(keras.callbacks.Callback):
    """Records what the callbacks before it left behind."""

    def __init__(self):
        super().__init__()
        self.lrs, self.epoch_sums, self.logs, self.first, self.velocity = [], [], [], None, {}

    def on_train_batch_begin(self, batch, logs=None):
        optimizer = self.model.optimizer
        self.lrs.append(float(keras.ops.convert_to_numpy(optimizer.learning_rate)))
        if self.first is None:
            self.first = weights_checksum(self.model)
        if len(self.lrs) == 4 and getattr(optimizer, "momentums", None):
            self.velocity = [keras.ops.convert_to_numpy(v).tolist() for v in optimizer.momentums]

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_sums.append(weights_checksum(self.model))
        # Keras leaves a bfloat16 model's losses as tensors in the logs.
        self.logs.append({key: float(value) for key, value in logs.items()})


def fit(name: str, kind: str, passes: int = 1, compression=None, floatx="float64") -> None:
    use_floatx(floatx)
    x, y = shard(*make_data(passes, hvk.size()), hvk.rank(), hvk.size())
    model = make_model(seed=123 if hvk.rank() == 0 else 999)  # different until broadcast
    optimizer = hvk.DistributedOptimizer(make_optimizer(kind), compression=compression,
                                         backward_passes_per_step=passes,
                                         average_aggregated_gradients=True)
    model.compile(optimizer=optimizer, loss=loss(), jit_compile=False)
    before, raw, after = Recorder(), Recorder(), Recorder()
    model.fit(
        x, y, batch_size=BATCH_PER_WORKER, epochs=EPOCHS, shuffle=False, verbose=0,
        callbacks=[
            hvk.BroadcastInitialState(), before,
            hvk.LinearScalingWarmup(batch_size_per_worker=BATCH_PER_WORKER,
                                    base_batch_size=BATCH_PER_WORKER,
                                    warmup_epochs=WARMUP_EPOCHS),
            raw, hvk.MetricAverage(), after, hvk.ReplicaCheck(),
        ],
    )
    report(name, lrs=after.lrs, first=after.first, epoch_sums=after.epoch_sums,
           raw_logs=raw.logs, averaged_logs=after.logs,
           lr_before=before.lrs[3], lr_after=after.lrs[3],
           velocity_before=before.velocity, velocity_after=after.velocity)
    save(name, model)


def scenario_save_and_load() -> None:
    use_floatx("float64")
    x, y = shard(*make_data(), hvk.rank())
    model = make_model()
    model.compile(optimizer=hvk.DistributedOptimizer(make_optimizer("sgd")), loss=loss(),
                  jit_compile=False)
    model.fit(x, y, batch_size=BATCH_PER_WORKER, epochs=1, shuffle=False, verbose=0,
              callbacks=[hvk.BroadcastInitialState()])
    path = OUT / "model.keras"
    if hvk.rank() == 0:
        model.save(path)
    hvk.verify_replicas(model)  # also a barrier: rank 0 has written the file
    plain = keras.saving.load_model(path)
    loaded = hvk.load_model(path)
    iterations = int(keras.ops.convert_to_numpy(loaded.optimizer.iterations))
    loaded.fit(x, y, batch_size=BATCH_PER_WORKER, epochs=1, shuffle=False, verbose=0,
               callbacks=[hvk.BroadcastInitialState(), hvk.ReplicaCheck()])
    report("save_load", plain_class=type(plain.optimizer).__name__,
           plain_is_base=type(plain.optimizer) is keras.optimizers.SGD,
           loaded_class=type(loaded.optimizer).__name__,
           loaded_is_subclass=isinstance(loaded.optimizer, keras.optimizers.SGD)
           and type(loaded.optimizer) is not keras.optimizers.SGD,
           iterations=iterations, after=weights_checksum(loaded))


def scenario_checkpoints() -> None:
    """ModelCheckpoint on every rank, save_model, load_model from rank 0's file only."""
    use_floatx("float64")
    x, y = shard(*make_data(), hvk.rank())
    model = make_model()
    model.compile(optimizer=hvk.DistributedOptimizer(make_optimizer("sgd")), loss=loss(),
                  jit_compile=False)
    folder = OUT / "checkpoints"  # not there yet: rank 0 creates it
    model.fit(x, y, batch_size=BATCH_PER_WORKER, epochs=3, shuffle=False, verbose=0,
              callbacks=[hvk.BroadcastInitialState(), hvk.MetricAverage(),
                         hvk.ModelCheckpoint(str(folder / "epoch{epoch}.keras")),
                         hvk.ModelCheckpoint(str(folder / "best.weights.h5"), monitor="loss",
                                             save_best_only=True, save_weights_only=True)])
    hvk.save_model(model, folder / "final.keras")
    hvk.verify_replicas(model)  # a barrier too
    files = sorted(p.name for p in folder.iterdir())
    # Only rank 0 reads: rank 1 names a file that does not exist.
    path = folder / "final.keras" if hvk.rank() == 0 else OUT / "nowhere" / "final.keras"
    loaded = hvk.load_model(path)
    loaded_distributed = type(loaded.optimizer) is not keras.optimizers.SGD
    errors = {}
    for what, action in (
            ("missing", lambda: hvk.load_model(folder / "missing.keras")),
            ("unwritable", lambda: hvk.save_model(model, folder / "final.keras" / "x.keras"))):
        try:
            action()
            errors[what] = None
        except RuntimeError as error:
            errors[what] = str(error)
    report("checkpoints", files=files, saved=weights_checksum(model),
           loaded=weights_checksum(loaded), loaded_distributed=loaded_distributed,
           iterations=int(keras.ops.convert_to_numpy(loaded.optimizer.iterations)),
           errors=errors)


def scenario_resume() -> None:
    """Fit 2 epochs, save, load in a new model object and fit on from initial_epoch=2."""
    use_floatx("float64")
    x, y = shard(*make_data(), hvk.rank())
    model = make_model()
    model.compile(optimizer=hvk.DistributedOptimizer(make_optimizer("sgd")), loss=loss(),
                  jit_compile=False)
    warmup = dict(batch_size_per_worker=BATCH_PER_WORKER, base_batch_size=BATCH_PER_WORKER,
                  warmup_epochs=WARMUP_EPOCHS)
    model.fit(x, y, batch_size=BATCH_PER_WORKER, epochs=2, shuffle=False, verbose=0,
              callbacks=[hvk.BroadcastInitialState(), hvk.LinearScalingWarmup(**warmup)])
    path = OUT / "resume.keras"
    if hvk.rank() == 0:
        model.save(path)
    hvk.verify_replicas(model)  # also a barrier: rank 0 has written the file
    resumed = hvk.load_model(path)
    recorder = Recorder()
    resumed.fit(x, y, batch_size=BATCH_PER_WORKER, initial_epoch=2, epochs=EPOCHS,
                shuffle=False, verbose=0,
                callbacks=[hvk.BroadcastInitialState(),
                           hvk.LinearScalingWarmup(base_lr=ETA["sgd"], **warmup),
                           recorder, hvk.ReplicaCheck()])
    report("resume", lrs=recorder.lrs)
    save("resume", resumed)


def scenario_mixed_precision() -> None:
    """mixed_float16 with one rank's batch overflowing: both ranks skip that step."""
    use_floatx("mixed_float16")
    x, y = shard(*make_overflowing_data(), hvk.rank())
    model = make_model(seed=123 if hvk.rank() == 0 else 999)
    model.compile(optimizer=hvk.DistributedOptimizer(keras.optimizers.SGD(ETA["sgd"])),
                  loss=loss(), jit_compile=False)
    recorder = LossScaleRecorder()
    model.fit(x, y, batch_size=BATCH_PER_WORKER, epochs=1, shuffle=False, verbose=0,
              callbacks=[hvk.BroadcastInitialState(), recorder, hvk.ReplicaCheck()])
    report("mixed_precision", scales=recorder.scales, iterations=recorder.iterations,
           optimizer=type(model.optimizer).__name__)
    save("mixed_precision", model)


def scenario_join_twice() -> None:
    """hvk.join() twice in one process (each rank once per call, no training between)."""
    first = hvk.join()
    second = hvk.join()
    report("join_twice", last_joined=[first, second])


def scenario_horovod_api() -> None:
    """Horovod's names with Horovod's meaning: its learning-rate and broadcast callbacks,
    DistributedOptimizer's arguments, sparse gradients."""
    use_floatx("float64")
    x, y = shard(*make_data(), hvk.rank())
    model = make_model(seed=123 if hvk.rank() == 0 else 999)
    model.compile(optimizer=hvk.DistributedOptimizer(keras.optimizers.SGD(HOROVOD_LR,
                                                                          momentum=0.9)),
                  loss=loss(), jit_compile=False)
    recorder = Recorder()
    model.fit(x, y, batch_size=BATCH_PER_WORKER, epochs=EPOCHS, shuffle=False, verbose=0,
              callbacks=[hvk.callbacks.BroadcastGlobalVariablesCallback(0),
                         hvk.callbacks.MetricAverageCallback(),
                         hvk.callbacks.LearningRateWarmupCallback(initial_lr=HOROVOD_LR,
                                                                  warmup_epochs=2),
                         hvk.callbacks.LearningRateScheduleCallback(
                             initial_lr=HOROVOD_LR, multiplier=0.5, start_epoch=2,
                             end_epoch=EPOCHS), recorder])
    # Worker-local variables keep their own values; the rest takes root rank 1's.
    local = make_model()
    for variable in local.variables:
        variable.assign(np.full(variable.shape, float(hvk.rank())))
    local.compile(optimizer=keras.optimizers.SGD(0.0), loss=loss(), jit_compile=False)
    keep = list(local.layers[0].variables)
    local.fit(x[:BATCH_PER_WORKER], y[:BATCH_PER_WORKER], epochs=1, verbose=0,
              callbacks=[hvk.callbacks.BroadcastGlobalVariablesCallback(
                  root_rank=1, local_variables=keep)])
    values = [sorted({float(v) for v in np.ravel(keras.ops.convert_to_numpy(w))})
              for w in local.variables]
    save_embedding_fits()
    report("horovod_api", lrs=recorder.lrs, averaged_logs=recorder.logs, broadcast=values,
           arguments=_horovod_optimizer_arguments())


def largest_difference(first: list, second: list) -> float:
    return float(max(np.max(np.abs(a - b)) for a, b in zip(first, second, strict=True)))


def _fit_once(optimizer: keras.optimizers.Optimizer, passes: int = 1) -> list:
    """Weights after one epoch of plain fit from make_model's weights."""
    x, y = shard(*make_data(passes), hvk.rank())
    model = make_model()
    model.compile(optimizer=optimizer, loss=loss(), jit_compile=False)
    model.fit(x, y, batch_size=BATCH_PER_WORKER, epochs=1, shuffle=False, verbose=0)
    return model.get_weights()


def _horovod_optimizer_arguments() -> dict:
    """Largest differences between runs that Horovod's meaning says are equal."""
    sgd = keras.optimizers.SGD
    summed = _fit_once(hvk.DistributedOptimizer(sgd(0.05), backward_passes_per_step=2), 2)
    averaged = _fit_once(hvk.DistributedOptimizer(sgd(0.1), backward_passes_per_step=2,
                                                  average_aggregated_gradients=True), 2)
    predivided = _fit_once(hvk.DistributedOptimizer(sgd(0.1), gradient_predivide_factor=4.0))
    plain = _fit_once(hvk.DistributedOptimizer(sgd(0.1)))
    fp16_object = _fit_once(hvk.DistributedOptimizer(sgd(0.1), compression=hvk.Compression.fp16))
    fp16_name = _fit_once(hvk.DistributedOptimizer(sgd(0.1), compression="fp16"))
    return {"sum_at_half_rate_vs_mean": largest_difference(summed, averaged),
            "predivided_vs_plain": largest_difference(predivided, plain),
            "fp16_object_vs_name": largest_difference(fp16_object, fp16_name)}


def save_embedding_fits() -> None:
    """Embedding gradients (tf.IndexedSlices) with and without sparse_as_dense; saved."""
    x, y = shard(*make_embedding_data(), hvk.rank())
    for sparse_as_dense in (False, True):
        model = make_embedding_model()
        model.compile(optimizer=hvk.DistributedOptimizer(keras.optimizers.SGD(ETA["sgd"]),
                                                         sparse_as_dense=sparse_as_dense),
                      loss="mse", jit_compile=False)
        model.fit(x, y, batch_size=BATCH_PER_WORKER, epochs=1, shuffle=False, verbose=0)
        save(f"embedding_sparse_as_dense_{sparse_as_dense}", model)


def scenario_sync_batch_norm() -> None:
    """SyncBatchNormalization and, for contrast, plain BatchNormalization, one epoch."""
    use_floatx("float64")
    x, y = shard(*make_data(), hvk.rank())
    for name, layer in (("sync_batch_norm", hvk.SyncBatchNormalization),
                        ("local_batch_norm", keras.layers.BatchNormalization)):
        model = make_batch_norm_model(layer)
        model.compile(optimizer=hvk.DistributedOptimizer(keras.optimizers.SGD(ETA["sgd"])),
                      loss=loss(), jit_compile=False)
        model.fit(x, y, batch_size=BATCH_PER_WORKER, epochs=1, shuffle=False, verbose=0)
        save(name, model)
    report("sync_batch_norm")


def scenario_replica_check_and_metrics() -> None:
    use_floatx("float64")
    model = make_model()
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=loss(), jit_compile=False)
    hvk.verify_replicas(model)
    if hvk.rank() == 1:
        model.layers[1].bias.assign(model.layers[1].bias + 1e-12)
    try:
        hvk.verify_replicas(model)
        message = None
    except hvk.ReplicaMismatchError as error:
        message = str(error)
    try:
        hvk.MetricAverage().on_epoch_end(0, {"loss": 1.0} if hvk.rank() == 0
                                         else {"loss": 1.0, "val_loss": 2.0})
        key_error = None
    except ValueError as error:
        key_error = str(error)
    report("replica_check", message=message, key_error=key_error)


def scenario_failures() -> None:
    """A NaN on rank 1 (stops fit; skipped with skip_nonfinite; applied with
    check_nonfinite=False), and ranks that start with different settings: errors
    everywhere."""
    use_floatx("float64")
    x, y = shard(*make_data(), hvk.rank())
    if hvk.rank() == 1:
        x = x.copy()
        x[5] = np.nan
    model = make_model()
    model.compile(optimizer=hvk.DistributedOptimizer(make_optimizer("sgd")), loss=loss(),
                  jit_compile=False)
    try:
        model.fit(x, y, batch_size=BATCH_PER_WORKER, epochs=1, shuffle=False, verbose=0)
        nonfinite = None
    except Exception as error:  # TensorFlow's InvalidArgumentError from the graph assertion
        nonfinite = f"{type(error).__name__}: {error}"
    model = make_model()
    optimizer = hvk.DistributedOptimizer(make_optimizer("sgd"), skip_nonfinite=True)
    model.compile(optimizer=optimizer, loss=loss(), jit_compile=False)
    recorder = Recorder()
    model.fit(x, y, batch_size=BATCH_PER_WORKER, epochs=1, shuffle=False, verbose=0,
              callbacks=[recorder])
    skipped = int(keras.ops.convert_to_numpy(optimizer.skipped_steps))
    finite_after_skip = bool(np.all([np.isfinite(w).all() for w in model.get_weights()]))
    hvk.verify_replicas(model)
    model = make_model()
    model.compile(optimizer=hvk.DistributedOptimizer(make_optimizer("sgd"),
                                                     check_nonfinite=False),
                  loss=loss(), jit_compile=False)
    try:  # Horovod's way: the NaN update is applied and training goes on
        model.fit(x, y, batch_size=BATCH_PER_WORKER, epochs=1, shuffle=False, verbose=0)
        unchecked_error = None
    except Exception as error:
        unchecked_error = f"{type(error).__name__}: {error}"
    unchecked_nan = bool(np.any([np.isnan(w).any() for w in model.get_weights()]))
    errors = {}
    built_ops = tally.native_ops
    for check, optimizer, batch, without_ops in (
            ("optimizer", "adam" if hvk.rank() == 1 else "sgd", 4, False),
            ("batch size", "sgd", 4 if hvk.rank() == 0 else 8, False),
            ("flat buffer", "sgd", 4, hvk.rank() == 1)):  # as if rank 1 lacked the ops
        model = make_model()
        model.compile(optimizer=hvk.DistributedOptimizer(make_optimizer(optimizer)),
                      loss=loss(), jit_compile=False)
        tally.native_ops = (lambda: None) if without_ops else built_ops
        try:
            model.fit(x[:8], y[:8], batch_size=BATCH_PER_WORKER, epochs=1, verbose=0,
                      callbacks=[hvk.BroadcastInitialState(),
                                 hvk.LinearScalingWarmup(batch_size_per_worker=batch)])
            errors[check] = None
        except hvk.RankDisagreementError as error:
            errors[check] = str(error)
        finally:
            tally.native_ops = built_ops
    report("failures", nonfinite=nonfinite, disagreements=errors, skipped=skipped,
           finite_after_skip=finite_after_skip, unchecked_error=unchecked_error,
           unchecked_nan=unchecked_nan)


def tape_step(model: keras.Model, optimizer: keras.optimizers.Optimizer, passes: int = 1):
    """A tf.function training step through DistributedGradientTape, with ``passes``
    micro-batches per update: (x, y) -> None."""
    import tensorflow as tf

    import hvdtrain.adapters.tensorflow as hvtf

    @tf.function
    def train_step(xb, yb):
        with tf.GradientTape() as tape:
            value = loss()(yb, model(xb, training=True))
        grads = hvtf.DistributedGradientTape(
            tape, optimizer=optimizer, backward_passes_per_step=passes
        ).gradient(value, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)

    return train_step


def scenario_custom_loop() -> None:
    import tensorflow as tf

    import hvdtrain.adapters.tensorflow as hvtf

    use_floatx("float64")
    x, y = shard(*make_data(), hvk.rank())
    model = make_model(seed=123 if hvtf.rank() == 0 else 999)
    optimizer = keras.optimizers.SGD(
        hvtf.LinearScalingWarmup(0.05, batch_size_per_worker=BATCH_PER_WORKER,
                                 steps_per_epoch=STEPS_PER_EPOCH,
                                 base_batch_size=BATCH_PER_WORKER, warmup_epochs=WARMUP_EPOCHS),
        momentum=0.9)
    optimizer.build(model.trainable_variables)
    hvtf.broadcast_variables(model.variables + optimizer.variables)
    first = weights_checksum(model)

    train_step = tape_step(model, optimizer)
    lrs = []
    for step in range(EPOCHS * STEPS_PER_EPOCH):
        lrs.append(float(optimizer.learning_rate.numpy()))
        batch = step % STEPS_PER_EPOCH
        rows = slice(batch * BATCH_PER_WORKER, (batch + 1) * BATCH_PER_WORKER)
        train_step(tf.constant(x[rows]), tf.constant(y[rows]))
    hvtf.verify_replicas(model.variables + optimizer.variables)
    report("custom_loop", first=first, lrs=lrs, after=weights_checksum(model))
    save("custom_loop", model)


def scenario_custom_loop_join() -> None:
    """DistributedGradientTape on shares of 3 and 2 batches, at η: after its last batch of
    each epoch a rank joins, then every rank takes the state of the last rank to join."""
    import tensorflow as tf

    import hvdtrain.adapters.tensorflow as hvtf

    use_floatx("float64")
    x, y = join_shares(hvtf.rank())
    model = make_model(seed=123 if hvtf.rank() == 0 else 999)
    optimizer = make_optimizer("sgd")
    optimizer.build(model.trainable_variables)
    hvtf.broadcast_variables(model.variables + optimizer.variables)

    train_step = tape_step(model, optimizer)
    for _ in range(JOIN_EPOCHS):
        for start in range(0, len(x), BATCH_PER_WORKER):
            rows = slice(start, start + BATCH_PER_WORKER)
            train_step(tf.constant(x[rows]), tf.constant(y[rows]))
        hvtf.broadcast_variables(model.variables + optimizer.variables,
                                 root_rank=int(hvtf.join()))
    hvtf.verify_replicas(model.variables + optimizer.variables)
    report("custom_loop_join", after=weights_checksum(model))
    save("custom_loop_join", model)


def scenario_uneven_validation() -> None:
    """Validation shares of 11 and 10 examples, averaged by MetricAverage with and
    without validation_examples; the final weights are saved for a one-process check."""
    use_floatx("float64")
    x, y = shard(*make_data(), hvk.rank())
    xv, yv = make_validation_data()
    xv, yv = xv[hvk.rank()::hvk.size()], yv[hvk.rank()::hvk.size()]
    logs = {}
    for weighted in (True, False):
        model = make_model()
        model.compile(optimizer=hvk.DistributedOptimizer(keras.optimizers.SGD(ETA["sgd"])),
                      loss=loss(), metrics=["accuracy"], jit_compile=False)
        average = hvk.MetricAverage(examples=len(x), validation_examples=len(xv)) \
            if weighted else hvk.MetricAverage()
        history = model.fit(x, y, batch_size=BATCH_PER_WORKER, epochs=1, shuffle=False,
                            verbose=0, validation_data=(xv, yv), callbacks=[average])
        logs[str(weighted)] = {key: values[-1] for key, values in history.history.items()}
    save("uneven_validation", model)
    report("uneven_validation", shares=len(xv), weighted=logs["True"], unweighted=logs["False"])


def scenario_join_uneven() -> None:
    """Shares of 3 and 2 batches with JoinAtEpochEnd, put last in callbacks (it joins
    after the last batch, before any on_epoch_end), with the schedule, the metric average
    weighted by examples and the replica check."""
    use_floatx("float64")
    x, y = join_shares(hvk.rank())
    model = make_model(seed=123 if hvk.rank() == 0 else 999)
    model.compile(optimizer=hvk.DistributedOptimizer(make_optimizer("sgd")), loss=loss(),
                  jit_compile=False)
    recorder = Recorder()
    history = model.fit(
        x, y, batch_size=BATCH_PER_WORKER, epochs=JOIN_EPOCHS, shuffle=False, verbose=0,
        callbacks=[hvk.BroadcastInitialState(),
                   hvk.LinearScalingWarmup(batch_size_per_worker=BATCH_PER_WORKER,
                                           base_batch_size=BATCH_PER_WORKER,
                                           warmup_epochs=WARMUP_EPOCHS),
                   hvk.MetricAverage(examples=len(x)), recorder, hvk.ReplicaCheck(),
                   hvk.JoinAtEpochEnd()])
    save("join_uneven", model)
    report("join_uneven", lrs=recorder.lrs, loss=history.history["loss"],
           epoch_sums=recorder.epoch_sums,
           steps=int(keras.ops.convert_to_numpy(model.optimizer.iterations)))


def scenario_partial_distributed() -> None:
    """PartialDistributedOptimizer with the first layer local: one SGD step."""
    use_floatx("float64")
    x, y = shard(*make_data(), hvk.rank())
    model = make_model()
    model.compile(optimizer=hvk.PartialDistributedOptimizer(
        keras.optimizers.SGD(ETA["sgd"]), local_layers=[model.layers[0]]),
        loss=loss(), jit_compile=False)
    model.fit(x[:BATCH_PER_WORKER], y[:BATCH_PER_WORKER], batch_size=BATCH_PER_WORKER,
              epochs=1, shuffle=False, verbose=0)
    save("partial_distributed", model)
    report("partial_distributed")


def scenario_accumulate_nonfinite() -> None:
    """Accumulating 2 micro-batches with skip_nonfinite; rank 1's first micro-batch
    holds a NaN, so the first update's averaged gradient does."""
    use_floatx("float64")
    x, y = shard(*make_data(passes=2), hvk.rank())
    if hvk.rank() == 1:
        x = x.copy()
        x[0] = np.nan
    model = make_model()
    optimizer = hvk.DistributedOptimizer(keras.optimizers.SGD(ETA["sgd"]),
                                         backward_passes_per_step=2, skip_nonfinite=True,
                                         average_aggregated_gradients=True)
    model.compile(optimizer=optimizer, loss=loss(), jit_compile=False)
    model.fit(x, y, batch_size=BATCH_PER_WORKER, epochs=1, shuffle=False, verbose=0)
    report("accumulate_nonfinite",
           skipped=int(keras.ops.convert_to_numpy(optimizer.skipped_steps)))
    save("accumulate_nonfinite", model)


def scenario_step_events() -> None:
    """fit with skip_nonfinite=True, 3 batches, a NaN in rank 1's share of the second:
    the core's step observers hear each reduction and whether each update was applied
    (on TensorFlow through the traced graph)."""
    use_floatx("float64")
    x, y = shard(*make_data(), hvk.rank())
    x, y = x[:3 * BATCH_PER_WORKER].copy(), y[:3 * BATCH_PER_WORKER]
    if hvk.rank() == 1:
        x[BATCH_PER_WORKER] = np.nan
    events = []
    stop_observing = step_observers.add(EventRecorder(events))
    model = make_model()
    model.compile(optimizer=hvk.DistributedOptimizer(make_optimizer("sgd"), skip_nonfinite=True),
                  loss=loss(), jit_compile=False)
    model.fit(x, y, batch_size=BATCH_PER_WORKER, epochs=1, shuffle=False, verbose=0)
    stop_observing()
    report("step_events", events=events)


def scenario_tensor_collective() -> None:
    report("tensor_collective", **exercise_tensor_collective(
        tensors(), hvk.rank(), keras.ops.convert_to_tensor,
        lambda t: keras.ops.convert_to_numpy(t).tolist()))


# One gradient element per case, set on each rank (rank 0's value, rank 1's value, the
# compression); the same cases as tests/workers/torch_adapter.py's nonfinite_edges.
LARGE = 0.75 * float(np.finfo(np.float32).max)
NONFINITE_EDGES = {
    "small": (1.0, -2.0, None), "overflow": (LARGE, LARGE, None),
    "cancel": (LARGE, -LARGE, None), "one_large": (LARGE, 1.0, None),
    "nan": (0.0, float("nan"), None), "fp16_overflow": (6e4, 6e4, "fp16"),
}


def scenario_nonfinite_edges() -> None:
    """Each case applied by a distributed SGD(1.0) under each non-finite policy (the
    update inside a tf.function on TensorFlow, as fit runs it; eagerly on torch):
    "ignore" shows what the averaged gradient was (the variable's new value, negated),
    "raise" whether training stopped and with which message, "skip" whether the update
    was skipped."""
    use_floatx("float32")
    outcomes = {}
    for case, (*values, compression) in NONFINITE_EDGES.items():
        outcome = {}
        for policy in ("ignore", "raise", "skip"):
            weight = keras.Variable(np.zeros((2, 3), "float32"), name="weight")
            bias = keras.Variable(np.zeros(2, "float32"), name="bias")
            optimizer = hvk.DistributedOptimizer(
                keras.optimizers.SGD(1.0), compression=compression,
                skip_nonfinite=policy == "skip", check_nonfinite=policy != "ignore")
            optimizer.build([weight, bias])
            gradient = np.ones((2, 3), "float32")
            gradient[1, 2] = values[hvk.rank()]
            grads = [keras.ops.convert_to_tensor(gradient),
                     keras.ops.convert_to_tensor(np.ones(2, "float32"))]
            apply = functools.partial(optimizer.apply, grads, [weight, bias])
            if TENSORFLOW:
                import tensorflow as tf

                apply = tf.function(lambda step=apply: step())  # the variables captured
            try:
                apply()
                error = None
            except Exception as failure:  # InvalidArgumentError (TF), NonFiniteGradientError
                error = {"type": type(failure).__name__,
                         "message": getattr(failure, "message", None) or str(failure)}
            updated = keras.ops.convert_to_numpy(weight)
            if policy == "ignore":
                outcome["averaged"] = -float(updated[1, 2])
            elif policy == "raise":
                outcome["error"] = error
            else:
                outcome["skipped"] = int(keras.ops.convert_to_numpy(optimizer.skipped_steps))
                outcome["applied_despite_skip"] = bool(updated[0, 0] != 0.0)  # its gradient: 1
        outcome["finite"] = bool(np.isfinite(outcome["averaged"]))
        outcomes[case] = outcome
    report("nonfinite_edges", outcomes=outcomes)


def scenario_custom_loop_checks() -> None:
    """DistributedGradientTape's non-finite check (rank 1's batch holds a NaN), and
    micro-batch accumulation in a custom loop through DistributedOptimizer."""
    import tensorflow as tf

    import hvdtrain.adapters.tensorflow as hvtf

    use_floatx("float64")
    x, y = shard(*make_data(), hvk.rank())
    model = make_model()
    optimizer = keras.optimizers.SGD(ETA["sgd"])
    optimizer.build(model.trainable_variables)
    xb = x[:BATCH_PER_WORKER].copy()
    if hvk.rank() == 1:
        xb[0] = np.nan

    def gradients(check: bool):
        with tf.GradientTape() as tape:
            value = loss()(y[:BATCH_PER_WORKER], model(tf.constant(xb), training=True))
        return hvtf.DistributedGradientTape(tape, check_nonfinite=check, optimizer=optimizer
                                            ).gradient(value, model.trainable_variables)

    try:
        tf.function(lambda: gradients(True))()
        error = None
    except tf.errors.InvalidArgumentError as failure:
        error = failure.message
    unchecked = tf.function(lambda: gradients(False))()
    passed_through = not all(bool(tf.reduce_all(tf.math.is_finite(g))) for g in unchecked)

    x, y = shard(*make_data(passes=2), hvk.rank())
    model = make_model()
    accumulating = hvk.DistributedOptimizer(keras.optimizers.SGD(ETA["sgd"]),
                                            backward_passes_per_step=2,
                                            average_aggregated_gradients=True)
    accumulating.build(model.trainable_variables)

    @tf.function
    def micro_step(xb, yb):
        with tf.GradientTape() as tape:
            value = loss()(yb, model(xb, training=True))
        accumulating.apply(tape.gradient(value, model.trainable_variables),
                           model.trainable_variables)

    for micro in range(len(x) // BATCH_PER_WORKER):
        rows = slice(micro * BATCH_PER_WORKER, (micro + 1) * BATCH_PER_WORKER)
        micro_step(tf.constant(x[rows]), tf.constant(y[rows]))
    report("custom_loop_checks", error=error, passed_through=passed_through,
           updates=int(accumulating.iterations.numpy()))
    save("custom_loop_accumulate", model)


def scenario_tape_accumulate() -> None:
    """DistributedGradientTape(backward_passes_per_step=2) with a plain SGD made with
    gradient_accumulation_steps=2: 10 micro-batches, with Horovod's timeline on (rank 0
    writes OUT/tape_accumulate_timeline.json); then a NaN in rank 1's second
    micro-batch, which must stop both ranks at update 0."""
    import tensorflow as tf

    use_floatx("float64")
    x, y = shard(*make_data(passes=2), hvk.rank())
    model = make_model()
    optimizer = keras.optimizers.SGD(ETA["sgd"], gradient_accumulation_steps=2)
    optimizer.build(model.trainable_variables)
    micro_step = tape_step(model, optimizer, passes=2)
    timeline = OUT / "tape_accumulate_timeline.json"
    hvk.start_timeline(str(timeline))
    for micro in range(len(x) // BATCH_PER_WORKER):
        rows = slice(micro * BATCH_PER_WORKER, (micro + 1) * BATCH_PER_WORKER)
        micro_step(tf.constant(x[rows]), tf.constant(y[rows]))
    hvk.stop_timeline()
    save("tape_accumulate", model)
    updates = int(optimizer.iterations.numpy())

    model = make_model()
    optimizer = keras.optimizers.SGD(ETA["sgd"], gradient_accumulation_steps=2)
    micro_step = tape_step(model, optimizer, passes=2)
    error = None
    for micro in range(2):
        xb = x[micro * BATCH_PER_WORKER:(micro + 1) * BATCH_PER_WORKER].copy()
        if micro == 1 and hvk.rank() == 1:
            xb[0] = np.nan
        try:
            micro_step(tf.constant(xb), tf.constant(y[:BATCH_PER_WORKER]))
        except tf.errors.InvalidArgumentError as failure:
            error = f"micro-batch {micro}: {failure.message}"
    report("tape_accumulate", updates=updates, optimizer_class=type(optimizer).__name__,
           error=error)


def main() -> None:
    hvk.init()
    scenarios = {
        "sgd": functools.partial(fit, "sgd", "sgd"),
        "adam": functools.partial(fit, "adam", "adam"),
        "sgd_accumulate": functools.partial(fit, "sgd_accumulate", "sgd", passes=2),
        "sync_batch_norm": scenario_sync_batch_norm,
        "join_uneven": scenario_join_uneven,
        "join_twice": scenario_join_twice,
        "nonfinite_edges": scenario_nonfinite_edges,
        "tensor_collective": scenario_tensor_collective,
        "step_events": scenario_step_events,
        "sgd_float32": functools.partial(fit, "sgd_float32", "sgd", floatx="float32"),
        # bfloat16 on the wire, and bfloat16 computation (patch 0011 reduces the
        # gradients of bfloat16 variables)
        "sgd_bf16": functools.partial(fit, "sgd_bf16", "sgd", compression="bf16",
                                      floatx="float32"),
        "sgd_mixed_bfloat16": functools.partial(fit, "sgd_mixed_bfloat16", "sgd",
                                                floatx="mixed_bfloat16"),
        "sgd_bfloat16": functools.partial(fit, "sgd_bfloat16", "sgd", floatx="bfloat16"),
    }
    if TENSORFLOW:
        scenarios.update({
            "sgd_fp16": functools.partial(fit, "sgd_fp16", "sgd", compression="fp16",
                                          floatx="float32"),
            "save_load": scenario_save_and_load,
            "resume": scenario_resume,
            "mixed_precision": scenario_mixed_precision,
            "checkpoints": scenario_checkpoints,
            "horovod_api": scenario_horovod_api,
            "replica_check": scenario_replica_check_and_metrics,
            "failures": scenario_failures,
            "custom_loop": scenario_custom_loop,
            "custom_loop_checks": scenario_custom_loop_checks,
            "custom_loop_join": scenario_custom_loop_join,
            "tape_accumulate": scenario_tape_accumulate,
            "uneven_validation": scenario_uneven_validation,
            "partial_distributed": scenario_partial_distributed,
            "accumulate_nonfinite": scenario_accumulate_nonfinite,
        })
    run_scenarios(hvk.rank, scenarios)
    hvk.shutdown()


if __name__ == "__main__":
    main()
