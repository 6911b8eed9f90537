"""TensorFlow custom training loops on Horovod: ``import hvdtrain.adapters.tensorflow as hvtf``.

For ``model.fit`` use :mod:`hvdtrain.adapters.keras`; for a loop of your own
(a ``tf.function`` train step with a ``tf.GradientTape``) use this module:

- :class:`DistributedGradientTape`: ``gradient()`` returns worker-averaged gradients.
- :func:`broadcast_variables`: every rank takes ``root_rank``'s values.
- :class:`LinearScalingWarmup`: :mod:`hvdtrain.schedule` as a
  ``keras.optimizers.schedules.LearningRateSchedule`` for any Keras optimizer.
- :func:`verify_replicas`, :func:`save_model` / :func:`load_model` (the Keras
  adapter's atomic rank-0 checkpoints; a custom loop's optimizer state is saved when
  the model was compiled with it), and Horovod's basics from ``horovod.tensorflow``.

Example (``horovodrun -np 2 python train.py``)::

    import tensorflow as tf, keras
    import hvdtrain.adapters.tensorflow as hvtf

    hvtf.init()
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(10)])
    optimizer = keras.optimizers.SGD(hvtf.LinearScalingWarmup(
        0.05, batch_size_per_worker=32, steps_per_epoch=100, base_batch_size=32))
    hvtf.broadcast_variables(model.variables)

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = hvtf.DistributedGradientTape(tape).gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return loss
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Unpack

import keras
import numpy as np
import tensorflow as tf

if keras.backend.backend() != "tensorflow":
    raise ImportError(
        f"hvdtrain.adapters.tensorflow needs Keras's TensorFlow backend, but KERAS_BACKEND is "
        f"{keras.backend.backend()!r}; for Keras on torch use hvdtrain.adapters.keras"
    )

# Horovod's basics: those the Keras adapter re-exports (horovod.tensorflow's, on this
# backend), and horovod.tensorflow's collectives.
from horovod.tensorflow import (
    Adasum,
    Compression,
    allgather,
    allgather_object,
    allreduce,
    broadcast,
    broadcast_object,
)

from hvdtrain.adapters.keras import (
    Average,
    Sum,
    backend,
    collectives,
    init,
    is_initialized,
    load_model,
    local_rank,
    local_size,
    rank,
    reduction,
    save_model,
    set_samples_per_step,
    shutdown,
    size,
    step_times,
)
from hvdtrain.adapters.keras.collectives import join
from hvdtrain.adapters.keras.optimizer import accumulate_across_workers
from hvdtrain.collective import require_initialized
from hvdtrain.nonfinite import TAPE_REMEDY
from hvdtrain.replicas import ReplicaMismatchError
from hvdtrain.runtime import elastic_job
from hvdtrain.validation import require_instance, require_positive_int
from hvdtrain.warmup import WarmupArguments, WarmupSettings, check_warmup_agreement

__all__ = [
    "Adasum", "Average", "Compression", "DistributedGradientTape", "LinearScalingWarmup",
    "ReplicaMismatchError", "Sum", "allgather", "allgather_object", "allreduce", "broadcast",
    "broadcast_object", "broadcast_variables", "init", "is_initialized", "join", "load_model",
    "local_rank", "local_size", "rank", "save_model", "set_samples_per_step", "shutdown",
    "size", "step_times", "verify_replicas",
]


class DistributedGradientTape:
    """Wraps a finished ``tf.GradientTape`` so that ``gradient()`` averages across workers.

    All gradients of one ``gradient()`` call go through one collective: one flat buffer
    on TensorFlow's CPU, else one grouped allreduce (with ``compression="bf16"``, one
    allgather). Works eagerly and inside ``tf.function``.
    An averaged gradient holding NaN or Inf stops training on every rank (an
    ``InvalidArgumentError`` naming the optimizer step when ``optimizer`` is given),
    unless ``check_nonfinite=False``.

    Micro-batches: with ``backward_passes_per_step=N`` and ``optimizer=`` the Keras
    optimizer that applies the gradients, made with ``gradient_accumulation_steps=N``,
    ``gradient()`` returns this worker's own gradients and the optimizer applies the
    mean over the N micro-batches and all workers, with one allreduce per update (a
    tape lives for one pass; Keras keeps the accumulation in the optimizer, which the
    first ``gradient()`` call makes distributed in place; an optimizer from
    ``hvk.DistributedOptimizer(opt, backward_passes_per_step=N)`` is used as it is, and
    sums the micro-batches unless made with ``average_aggregated_gradients=True``). The
    non-finite check then runs on each averaged update. Clip with the optimizer's
    ``clipnorm`` / ``global_clipnorm``, which see the averaged gradient, not between
    ``gradient()`` and ``apply``.

    Shares of different lengths: a rank that runs out calls :func:`join` and sends zeros
    to the others' allreduces, whose average then divides by the ranks that sent
    gradients; afterwards broadcast the state of the last rank to join
    (``broadcast_variables(variables, root_rank=int(join()))``).

    Example::

        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        tape = hvtf.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)

    Args:
        tape: the finished ``tf.GradientTape``.
        compression: None, "fp16" or "bf16" (see ``hvk.DistributedOptimizer``).
        op: ``Average`` (default) or ``Sum``.
        check_nonfinite: stop training when an averaged gradient holds NaN or Inf.
        optimizer: the optimizer that applies the gradients: names the step in errors
            and to the core's step observers (:data:`hvdtrain.step_events.step_observers`
            hear of the reduction's start and end either way, as step -1 without it; a
            plain optimizer's update is not observed), and is needed when
            ``backward_passes_per_step`` > 1.
        backward_passes_per_step: micro-batches per update (see above).
    """

    def __init__(self, tape: tf.GradientTape, *, compression: str | None = None,
                 op: Any = Average, check_nonfinite: bool = True,
                 optimizer: keras.optimizers.Optimizer | None = None,
                 backward_passes_per_step: int = 1) -> None:
        self.reduction = reduction.checked_reduction(compression, op, 1.0, None, 1)
        require_instance("tape", tape, tf.GradientTape, "a tf.GradientTape")
        require_positive_int("backward_passes_per_step", backward_passes_per_step)
        if backward_passes_per_step > 1 and optimizer is None:
            raise ValueError(
                f"backward_passes_per_step={backward_passes_per_step} needs optimizer=, the "
                "Keras optimizer that applies these gradients (made with "
                f"gradient_accumulation_steps={backward_passes_per_step}): it accumulates "
                "the micro-batches and averages them over the workers once per update")
        self.tape = tape
        self.compression = compression
        self.op = op
        self.check_nonfinite = check_nonfinite
        self.optimizer = optimizer
        self.backward_passes_per_step = backward_passes_per_step

    def gradient(self, target: Any, sources: Any, output_gradients: Any = None,
                 unconnected_gradients: tf.UnconnectedGradients = tf.UnconnectedGradients.NONE
                 ) -> Any:
        """``tape.gradient(...)``, with every gradient averaged over all workers (with
        ``backward_passes_per_step`` > 1: this worker's own, dense, for the optimizer to
        accumulate and average)."""
        require_initialized(backend.collective(), "DistributedGradientTape.gradient")
        grads = self.tape.gradient(target, sources, output_gradients, unconnected_gradients)
        flat = tf.nest.flatten(grads)
        if self.backward_passes_per_step > 1:
            accumulate_across_workers(
                self.optimizer, self.backward_passes_per_step, compression=self.compression,
                op=self.op, check_nonfinite=self.check_nonfinite)
            return tf.nest.pack_sequence_as(
                grads, [None if g is None else reduction.dense(g) for g in flat])
        step = None
        if self.check_nonfinite:
            step = self.optimizer.iterations if self.optimizer is not None else "(unknown)"
        averaged, _ = self.reduction.observed(
            flat, self.optimizer.iterations if self.optimizer is not None else -1,
            check_step=step, remedy=TAPE_REMEDY, last=True,
            names=reduction.variable_names(tf.nest.flatten(sources), unnamed="sources"))
        return tf.nest.pack_sequence_as(grads, averaged)


def broadcast_variables(variables: Iterable[Any], root_rank: int = 0) -> None:
    """Give every rank ``root_rank``'s value of each variable (tf.Variable or Keras), eagerly.

    Call it once after building the model (and the optimizer, e.g. with
    ``optimizer.build(model.trainable_variables)``) and before the first step.
    """
    require_initialized(backend.collective(), "broadcast_variables")
    collectives.broadcast_variables(list(variables), root_rank)


def verify_replicas(variables: Sequence[Any]) -> None:
    """Raise ReplicaMismatchError on every rank unless all ranks' variables are bit-identical."""
    require_initialized(backend.collective(), "verify_replicas")
    collectives.verify_variables([(getattr(v, "path", None) or v.name, v) for v in variables])


@keras.saving.register_keras_serializable(package="hvdtrain")
class LinearScalingWarmup(keras.optimizers.schedules.LearningRateSchedule):
    """Goyal et al.'s linear scaling rule and warmup as a Keras learning-rate schedule.

    ``schedule(step)`` is :meth:`hvdtrain.schedule.LinearScalingSchedule.lr_at` for
    optimizer step ``step``: η at step 0, rising by a constant amount per step to kη
    after ``warmup_epochs``, then kη times ``gamma`` at each milestone epoch, with
    k = batch_size_per_worker x world_size x backward_passes_per_step / base_batch_size.
    Give it to any Keras optimizer as its ``learning_rate``; works in ``fit`` and in
    custom loops. It computes the rate with hvdtrain.schedule itself (through
    ``tf.numpy_function``), so it is exactly the documented schedule.

    It does no momentum correction (the optimizer reads the rate each step); with
    Keras's SGD and momentum use :class:`hvdtrain.adapters.keras.LinearScalingWarmup`
    in ``fit`` for that.
    """

    def __init__(self, base_lr: float, **settings: Unpack[WarmupArguments]) -> None:
        """Args: η, and the settings of :class:`hvdtrain.warmup.WarmupSettings`
        (``steps_per_epoch`` required). Every rank must make it with the same ones."""
        self._configure(base_lr, settings, training=True)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> LinearScalingWarmup:
        """The schedule a saved model holds; the ranks are not asked to agree, as one rank
        may load a model alone."""
        schedule = cls.__new__(cls)
        arguments = dict(config)
        schedule._configure(arguments.pop("base_lr"), arguments, training=False)
        return schedule

    def _configure(self, base_lr: float, settings: dict[str, Any], training: bool) -> None:
        warmup = WarmupSettings.of(**settings)
        connected = backend.horovod().is_initialized()
        if connected or training:
            world_size = warmup.workers(backend.collective())
        else:  # loaded for evaluation, without workers
            world_size = warmup.world_size
        self.schedule = warmup.schedule(base_lr, world_size,
                                        steps_per_epoch=warmup.require_steps_per_epoch())
        if training and connected and not elastic_job():
            check_warmup_agreement(backend.collective(), self.schedule)

    def __call__(self, step: Any) -> tf.Tensor:
        def lr_at(value: np.ndarray) -> np.ndarray:
            return np.asarray(self.schedule.lr_at(int(value)), dtype=np.float64)

        rate = tf.numpy_function(lr_at, [tf.cast(step, tf.int64)], tf.float64, stateful=False)
        rate.set_shape([])
        return tf.cast(rate, keras.config.floatx())

    def get_config(self) -> dict[str, Any]:
        s = self.schedule
        return dict(base_lr=s.base_lr, batch_size_per_worker=s.batch_size_per_worker,
                    steps_per_epoch=s.steps_per_epoch, base_batch_size=s.base_batch_size,
                    warmup_epochs=s.warmup_epochs, milestones=list(s.milestones), gamma=s.gamma,
                    backward_passes_per_step=s.backward_passes_per_step, world_size=s.world_size)
