"""Keras 3 on Horovod: ``import hvdtrain.adapters.keras as hvk``.

Horovod's own ``horovod.tensorflow.keras`` does not average gradients on Keras 3
(its optimizer wrapper overrides methods Keras 3 never calls) and its callbacks use
Keras 2 APIs. This adapter works with Keras 3 on the TensorFlow backend (through
``horovod.tensorflow``) and on the torch backend (through ``horovod.torch``):

- :func:`DistributedOptimizer`: any Keras 3 optimizer, gradients averaged across
  workers with one grouped allreduce per step.
- Callbacks: :class:`BroadcastInitialState`, :class:`LinearScalingWarmup`,
  :class:`MetricAverage`, :class:`ReplicaCheck`, :class:`CollectiveWatchdog`.
- :func:`verify_replicas`, :func:`load_model`, and Horovod's basics
  (:func:`init`, :func:`rank`, :func:`size`, ...).

Example (``horovodrun -np 2 python train.py``)::

    import keras
    import hvdtrain.adapters.keras as hvk

    hvk.init()
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(10)])
    model.compile(optimizer=hvk.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], jit_compile=False)
    model.fit(x_shard, y_shard, batch_size=32, epochs=5, verbose=int(hvk.rank() == 0),
              callbacks=[hvk.BroadcastInitialState(), hvk.MetricAverage(),
                         hvk.LinearScalingWarmup(batch_size_per_worker=32, base_batch_size=32),
                         hvk.ReplicaCheck(), hvk.CollectiveWatchdog()])

Rank-0 patterns: give ``verbose=1`` (the progress bar) and callbacks that write
files, such as ``ModelCheckpoint`` and ``TensorBoard``, to rank 0 only; put
:class:`MetricAverage` before any callback that reads the metrics (EarlyStopping,
ReduceLROnPlateau, ModelCheckpoint), so that every rank acts on the same values.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterable
from typing import Any

import keras
from keras import ops

from hvdtrain import watchdog
from hvdtrain.adapters import _keras_collectives as collectives
from hvdtrain.consistency import RankDisagreementError, software_versions
from hvdtrain.replicas import ReplicaMismatchError
from hvdtrain.runtime import init_horovod
from hvdtrain.schedule import (
    DEFAULT_BASE_BATCH_SIZE,
    DEFAULT_GAMMA,
    DEFAULT_WARMUP_EPOCHS,
    LinearScalingSchedule,
)
from hvdtrain.validation import require_instance, require_positive_int

__all__ = [
    "Average", "BroadcastInitialState", "CollectiveWatchdog", "DistributedOptimizer",
    "LinearScalingWarmup", "MetricAverage", "RankDisagreementError", "ReplicaCheck",
    "ReplicaMismatchError", "Sum", "init", "is_initialized", "load_model", "local_rank",
    "local_size", "rank", "shutdown", "size", "verify_replicas",
]

_hvd = collectives.horovod()
shutdown = _hvd.shutdown
is_initialized = _hvd.is_initialized
rank = _hvd.rank
size = _hvd.size
local_rank = _hvd.local_rank
local_size = _hvd.local_size
Average = _hvd.Average
Sum = _hvd.Sum


def init(comm=None, process_sets=None) -> None:
    """Horovod's ``init`` (of the Horovod matching Keras's backend) with hvdtrain's runtime
    defaults (see :mod:`hvdtrain.runtime`); ``comm`` may be an mpi4py communicator."""
    init_horovod(_hvd, comm, process_sets)


# --------------------------------------------------------------------------- optimizer


@functools.cache
def _distributed_class(base: type, compression: str | None, op: Any,
                       skip_nonfinite: bool) -> type:
    """A subclass of ``base`` that averages gradients just before clipping and the update.

    Keras 3 calls ``_clip_gradients`` once per optimizer update, with the final
    gradients: after unscaling a loss-scale factor and, with gradient accumulation,
    after averaging the micro-batches, so the allreduce runs once per update and
    clipping sees the worker-averaged gradient. With ``skip_nonfinite`` the weight
    decay and the update that follow run only when the averaged gradient is finite on
    every rank; otherwise ``skipped_steps`` counts the update.
    """

    class Distributed(base):
        def _clip_gradients(self, grads):
            averaged = collectives.average_gradients(grads, compression, op)
            if not skip_nonfinite:
                averaged = collectives.require_finite(averaged, self.iterations)
            else:
                self._hvdtrain_update = collectives.finite_on_every_rank(averaged)
            return super()._clip_gradients(averaged)

        def _apply_weight_decay(self, variables):
            parent = super()._apply_weight_decay
            if not skip_nonfinite:
                return parent(variables)
            return ops.cond(self._hvdtrain_update, lambda: parent(variables), lambda: None)

        def _backend_update_step(self, grads, trainable_variables, learning_rate):
            parent = super()._backend_update_step
            if not skip_nonfinite:
                return parent(grads, trainable_variables, learning_rate)

            def skip():
                self.skipped_steps.assign_add(1)

            return ops.cond(self._hvdtrain_update,
                            lambda: parent(grads, trainable_variables, learning_rate), skip)

        def build(self, variables):
            super().build(variables)
            if skip_nonfinite:
                self.skipped_steps = self.add_variable((), dtype="int64", name="skipped_steps",
                                                       initializer="zeros")

    Distributed.__name__ = Distributed.__qualname__ = base.__name__
    # Saved models name the wrapped optimizer's class: they load without hvdtrain.
    Distributed.__module__ = base.__module__
    Distributed.__doc__ = f"{base.__name__} with gradients averaged over Horovod workers."
    return Distributed


def DistributedOptimizer(
    optimizer: keras.optimizers.Optimizer,
    *,
    compression: str | None = None,
    backward_passes_per_step: int = 1,
    op: Any = None,
    skip_nonfinite: bool = False,
) -> keras.optimizers.Optimizer:
    """A copy of ``optimizer`` (same class and configuration) that averages gradients.

    Every update allreduces the gradients across workers in one grouped allreduce,
    then clips and applies them as the original would. An averaged gradient holding
    NaN or Inf stops training on every rank with an error naming the optimizer step.
    Use it in ``model.compile`` with ``jit_compile=False`` (Horovod's ops have no XLA
    kernels here).

    Args:
        optimizer: any Keras 3 optimizer, not yet used (wrap before ``fit``; to
            continue a saved model use :func:`load_model`).
        compression: None, "fp16", or "bf16" (bfloat16 through one allgather, since
            Horovod has no bfloat16 reduction; fewer bytes than float32 up to 3 workers).
        backward_passes_per_step: micro-batches per update, accumulated by Keras's own
            ``gradient_accumulation_steps``; the applied gradient is the mean over the
            micro-batches and the workers, with one allreduce per update.
        op: ``hvk.Average`` (default) or ``hvk.Sum``.
        skip_nonfinite: skip, on every rank alike, an update whose averaged gradient has
            a NaN or Inf (no weight decay, no change to weights or slots) and count it in
            ``optimizer.skipped_steps``; without it such an update stops training.

    Saving with ``model.save`` records the original optimizer class, so the file
    loads with plain ``keras.saving.load_model`` too.
    """
    op = Average if op is None else op
    collectives.check_compression(compression)
    collectives.check_op(op)
    require_positive_int("backward_passes_per_step", backward_passes_per_step)
    require_instance("optimizer", optimizer, keras.optimizers.Optimizer,
                     "a Keras 3 optimizer instance, e.g. keras.optimizers.SGD(0.1)")
    if optimizer.built:
        raise ValueError("the optimizer has already been used (built); wrap it before "
                         "compile/fit, or continue a saved model with hvk.load_model(path)")
    config = optimizer.get_config()
    configured = config.get("gradient_accumulation_steps") or 1
    if backward_passes_per_step > 1:
        if configured not in (1, backward_passes_per_step):
            raise ValueError(
                f"the optimizer already has gradient_accumulation_steps={configured}, which "
                f"contradicts backward_passes_per_step={backward_passes_per_step}; give one")
        config["gradient_accumulation_steps"] = backward_passes_per_step
    return _distributed_class(type(optimizer), compression, op, skip_nonfinite).from_config(
        config)


def load_model(path: str, *, compression: str | None = None, op: Any = None,
               skip_nonfinite: bool = False, **load_kwargs: Any) -> keras.Model:
    """Load a model saved with ``model.save`` and make its optimizer distributed.

    The optimizer keeps its loaded state (slots, iterations, learning rate);
    ``load_kwargs`` go to ``keras.saving.load_model`` (safe mode stays on unless you
    turn it off).
    """
    op = Average if op is None else op
    collectives.check_compression(compression)
    collectives.check_op(op)
    model = keras.saving.load_model(path, **load_kwargs)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None:
        optimizer.__class__ = _distributed_class(type(optimizer), compression, op, skip_nonfinite)
    return model


# --------------------------------------------------------------------------- callbacks


def _comparable_config(optimizer: keras.optimizers.Optimizer | None) -> dict | None:
    """The optimizer's configuration without what legitimately differs between ranks."""
    if optimizer is None:
        return None
    config = dict(optimizer.get_config())
    config.pop("name", None)  # auto-numbered ("SGD_3") by how many were made on each rank
    config.pop("learning_rate", None)  # set by schedules and callbacks; broadcast anyway
    return config


def _learning_rate(optimizer: keras.optimizers.Optimizer) -> float:
    return float(ops.convert_to_numpy(optimizer.learning_rate))


def _require_plain_compile(model: keras.Model) -> None:
    if getattr(model, "jit_compile", False):
        raise ValueError("compile the model with jit_compile=False: Horovod's collectives "
                         "have no XLA kernels in this build")


class BroadcastInitialState(keras.callbacks.Callback):
    """Start every replica from rank 0's weights and optimizer state.

    At ``on_train_begin`` it builds the optimizer's variables (if fit has not yet) and
    broadcasts the model's weights and the optimizer's variables from ``root_rank``,
    so the replicas are identical before the first step (Horovod's callback waits
    for the end of the first batch). Put it first in ``callbacks``.

    Example::

        model.fit(x, y, callbacks=[hvk.BroadcastInitialState()])
    """

    def __init__(self, root_rank: int = 0) -> None:
        super().__init__()
        self.root_rank = root_rank

    def on_train_begin(self, logs=None) -> None:
        collectives.require_initialized("BroadcastInitialState")
        _require_plain_compile(self.model)
        optimizer = self.model.optimizer
        variables = list(self.model.variables)
        if optimizer is not None:
            if not optimizer.built:
                optimizer.build(self.model.trainable_variables)
            variables += optimizer.variables
        collectives.check_ranks_agree({
            "variables (shape, dtype)": [(tuple(v.shape), str(v.dtype)) for v in variables],
            "optimizer class": type(optimizer).__name__ if optimizer is not None else None,
            "optimizer config": _comparable_config(optimizer),
            **software_versions("keras", "tensorflow", "torch", "horovod"),
        }, "BroadcastInitialState")
        collectives.broadcast_variables(variables, self.root_rank)


class LinearScalingWarmup(keras.callbacks.Callback):
    """Goyal et al.'s linear scaling rule and gradual warmup for ``model.fit``.

    Before every batch it sets ``optimizer.learning_rate`` from
    :class:`hvdtrain.schedule.LinearScalingSchedule`: η (the optimizer's learning rate
    when training first begins, the rate tuned for ``base_batch_size``) rising by a
    constant amount per optimizer step to kη after ``warmup_epochs``, then kη times
    ``gamma`` at each milestone epoch, with k = batch_size_per_worker x workers x
    gradient-accumulation steps / base_batch_size.

    Keras's SGD keeps the learning rate inside its velocity (v = m·v - lr·g), so with
    ``momentum_correction`` the velocity slots are multiplied by new_lr/old_lr whenever
    the rate changes (Goyal et al. §3, remark 2); other optimizers are left alone.
    Resumes with ``fit(initial_epoch=...)``; when continuing a model whose optimizer
    already holds a scaled rate, pass ``base_lr`` (η) explicitly.

    Example::

        model.fit(x, y, batch_size=32, epochs=20,
                  callbacks=[hvk.LinearScalingWarmup(batch_size_per_worker=32)])
    """

    def __init__(
        self,
        *,
        batch_size_per_worker: int,
        base_batch_size: int = DEFAULT_BASE_BATCH_SIZE,
        warmup_epochs: float = DEFAULT_WARMUP_EPOCHS,
        steps_per_epoch: int | None = None,
        milestones: Iterable[int] = (),
        gamma: float = DEFAULT_GAMMA,
        momentum_correction: bool = True,
        base_lr: float | None = None,
    ) -> None:
        super().__init__()
        self.batch_size_per_worker = batch_size_per_worker
        self.base_batch_size = base_batch_size
        self.warmup_epochs = warmup_epochs
        self.steps_per_epoch = steps_per_epoch
        self.milestones = tuple(milestones)
        self.gamma = gamma
        self.momentum_correction = momentum_correction
        self.base_lr = base_lr
        self.schedule: LinearScalingSchedule | None = None
        self._batches_per_epoch = 0
        self._passes = 1
        self._epoch = 0
        # Validate now, with placeholders where fit fills in later, so bad input fails early.
        self._make_schedule(base_lr or 1.0, steps_per_epoch or 1, passes=1)

    def _make_schedule(self, base_lr: float, batches_per_epoch: int,
                       passes: int) -> LinearScalingSchedule:
        return LinearScalingSchedule(
            base_lr=base_lr, batch_size_per_worker=self.batch_size_per_worker,
            workers=size() if is_initialized() else 1,
            steps_per_epoch=max(1, batches_per_epoch // passes),
            base_batch_size=self.base_batch_size, warmup_epochs=self.warmup_epochs,
            milestones=self.milestones, gamma=self.gamma, backward_passes_per_step=passes,
        )

    def on_train_begin(self, logs=None) -> None:
        collectives.require_initialized("LinearScalingWarmup")
        optimizer = self.model.optimizer
        if isinstance(optimizer._learning_rate, keras.optimizers.schedules.LearningRateSchedule):
            raise TypeError("the optimizer's learning rate is a LearningRateSchedule; give it a "
                            "float learning rate (η) for LinearScalingWarmup to drive")
        batches = self.steps_per_epoch or self.params.get("steps")
        if not batches:
            raise ValueError("LinearScalingWarmup needs steps_per_epoch: fit does not know the "
                             "number of batches per epoch for this data; pass steps_per_epoch=")
        if self.base_lr is None:
            self.base_lr = _learning_rate(optimizer)
            if not self.base_lr > 0:
                raise ValueError(
                    f"the optimizer's learning rate is {self.base_lr}: LinearScalingWarmup "
                    "scales it (η, tuned for base_batch_size); give the optimizer that rate, "
                    "or pass base_lr=")
        self._passes = optimizer.gradient_accumulation_steps or 1
        self._batches_per_epoch = batches
        self.schedule = self._make_schedule(self.base_lr, batches, self._passes)
        collectives.check_ranks_agree(
            {name: getattr(self.schedule, name) for name in (
                "base_lr", "batch_size_per_worker", "steps_per_epoch", "base_batch_size",
                "warmup_epochs", "milestones", "gamma", "backward_passes_per_step")},
            "LinearScalingWarmup")

    def on_epoch_begin(self, epoch: int, logs=None) -> None:
        self._epoch = epoch

    def on_train_batch_begin(self, batch: int, logs=None) -> None:
        step = (self._epoch * self._batches_per_epoch + batch) // self._passes
        optimizer = self.model.optimizer
        new = self.schedule.lr_at(step)
        old = _learning_rate(optimizer)
        if new == old:
            return
        optimizer.learning_rate = new
        if self.momentum_correction:
            _rescale_velocity(optimizer, new / old)

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        if logs is not None:
            logs["learning_rate"] = _learning_rate(self.model.optimizer)


def _rescale_velocity(optimizer: keras.optimizers.Optimizer, factor: float) -> None:
    """Goyal et al.'s momentum correction for the v = m·v - lr·g form (Keras's SGD)."""
    if not isinstance(optimizer, keras.optimizers.SGD) or not optimizer.momentum \
            or not optimizer.built:
        return
    for velocity in optimizer.momentums:
        velocity.assign(velocity * factor)


class MetricAverage(keras.callbacks.Callback):
    """Average every metric in ``logs`` over all workers at the end of each epoch.

    Validation metrics included. Put it before callbacks that read the metrics
    (EarlyStopping, ReduceLROnPlateau, ModelCheckpoint, the progress bar), so that they
    see, and act on, the same numbers on every rank.

    Example::

        model.fit(x, y, validation_data=(xv, yv), callbacks=[hvk.MetricAverage()])
    """

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        if logs:
            logs.update(collectives.average_numbers(logs))


class ReplicaCheck(keras.callbacks.Callback):
    """Raise ReplicaMismatchError as soon as the replicas' weights or optimizer state differ.

    Every ``every_n_epochs`` epochs it compares a checksum of every variable across
    ranks (one small allgather), naming the first variable and the ranks that differ.

    Example::

        model.fit(x, y, epochs=10, callbacks=[hvk.ReplicaCheck(every_n_epochs=1)])
    """

    def __init__(self, every_n_epochs: int = 1) -> None:
        super().__init__()
        require_positive_int("every_n_epochs", every_n_epochs)
        self.every_n_epochs = every_n_epochs

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        if (epoch + 1) % self.every_n_epochs == 0:
            verify_replicas(self.model)


class CollectiveWatchdog(keras.callbacks.Callback):
    """End this worker, instead of hanging, when a training step waits too long for the others.

    A rank that skips a step (a rank-dependent code path), dies, or loses its network
    leaves the other ranks blocked in the step's gradient allreduce; under Gloo and on
    a cut link nothing in Horovod ends that wait. With this callback each call of the
    model's train function runs under :mod:`hvdtrain.watchdog`: after
    ``HVDTRAIN_COLLECTIVE_TIMEOUT_SECONDS`` (default 45) the waiting rank prints which
    step it waited for and on which rank, and exits with code 124, so the launcher
    stops the job. The first call is not watched: it traces and compiles the step,
    which can legitimately take longer than the limit.

    Example::

        model.fit(x, y, epochs=10, callbacks=[hvk.CollectiveWatchdog()])
    """

    def on_train_begin(self, logs=None) -> None:
        train_function = self.model.train_function
        if getattr(train_function, "hvdtrain_watched", False):
            return  # a later fit() on the same model: already wrapped
        calls = itertools.count()

        def watched(*args, **kwargs):
            call = next(calls)
            if call == 0:
                return train_function(*args, **kwargs)
            with watchdog.guard(f"the gradient allreduce of training step {call} "
                                "(counting train-function calls from 0)"):
                return train_function(*args, **kwargs)

        watched.hvdtrain_watched = True
        self.model.train_function = watched


def verify_replicas(model: keras.Model) -> None:
    """Check that every rank holds bit-identical weights and optimizer variables
    (except gradient accumulators, which hold each worker's own micro-batch gradients).

    Raises:
        ReplicaMismatchError: on every rank, naming the ranks and the first variable
            that differs.
    """
    collectives.require_initialized("verify_replicas")
    require_instance("model", model, keras.Model, "a keras.Model")
    named = [(v.path, v) for v in model.variables]
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and optimizer.built:
        # Gradient accumulators hold each worker's own micro-batch gradients: they differ.
        local = {id(v) for v in getattr(optimizer, "_accumulated_gradients", None) or []}
        named += [(f"optimizer/{v.path}", v) for v in optimizer.variables if id(v) not in local]
    collectives.verify_variables(named)
