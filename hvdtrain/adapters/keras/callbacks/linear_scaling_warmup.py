"""``LinearScalingWarmup``: Goyal et al.'s linear scaling rule and gradual warmup in ``fit``."""

from __future__ import annotations

from collections.abc import Iterable

import keras
from keras import ops

from hvdtrain.adapters.keras import _internals, collectives
from hvdtrain.schedule import (
    DEFAULT_BASE_BATCH_SIZE,
    DEFAULT_GAMMA,
    DEFAULT_WARMUP_EPOCHS,
    LinearScalingSchedule,
)


class LinearScalingWarmup(keras.callbacks.Callback):
    """Goyal et al.'s linear scaling rule and gradual warmup for ``model.fit``.

    Before every batch it sets ``optimizer.learning_rate`` from
    :class:`hvdtrain.schedule.LinearScalingSchedule`: η (the optimizer's learning rate
    when training first begins, the rate tuned for ``base_batch_size``) rising by a
    constant amount per optimizer step to kη after ``warmup_epochs``, then kη times
    ``gamma`` at each milestone epoch, with k = batch_size_per_worker x world size x
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
        hvd = collectives.horovod()
        return LinearScalingSchedule(
            base_lr=base_lr, batch_size_per_worker=self.batch_size_per_worker,
            world_size=hvd.size() if hvd.is_initialized() else 1,
            steps_per_epoch=max(1, batches_per_epoch // passes),
            base_batch_size=self.base_batch_size, warmup_epochs=self.warmup_epochs,
            milestones=self.milestones, gamma=self.gamma, backward_passes_per_step=passes,
        )

    def on_train_begin(self, logs=None) -> None:
        """Fix η and the schedule and check that every rank has the same one."""
        collectives.require_initialized("LinearScalingWarmup")
        optimizer = self.model.optimizer
        if _internals.has_schedule(optimizer):
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
        """Remember the epoch: the step of a batch counts from the start of training."""
        self._epoch = epoch

    def on_train_batch_begin(self, batch: int, logs=None) -> None:
        """Set the rate of this batch's optimizer step (and correct the momentum)."""
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
        """Log the rate as ``learning_rate``."""
        if logs is not None:
            logs["learning_rate"] = _learning_rate(self.model.optimizer)


def _learning_rate(optimizer: keras.optimizers.Optimizer) -> float:
    return float(ops.convert_to_numpy(optimizer.learning_rate))


def _rescale_velocity(optimizer: keras.optimizers.Optimizer, factor: float) -> None:
    """Goyal et al.'s momentum correction for the v = m·v - lr·g form (Keras's SGD)."""
    if not isinstance(optimizer, keras.optimizers.SGD) or not optimizer.momentum \
            or not optimizer.built:
        return
    for velocity in optimizer.momentums:
        velocity.assign(velocity * factor)
