"""Horovod's learning-rate callbacks, ``LearningRateScheduleCallback`` and
``LearningRateWarmupCallback``, with Horovod's meaning, on Keras 3."""

from __future__ import annotations

from collections.abc import Callable

import keras

from hvdtrain.adapters.keras import backend
from hvdtrain.adapters.keras.callbacks._rates import learning_rate, set_learning_rate


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Horovod's schedule: ``initial_lr x multiplier(epoch)`` from ``start_epoch`` up to
    ``end_epoch``.

    ``multiplier`` is a function of the epoch, or a number m meaning
    m ** (epoch - start_epoch). With ``staircase`` the rate changes at the start of each
    epoch; without, before every batch, at the fractional epoch. The momentum correction
    scales Keras SGD's velocity by new/old rate, which is what Horovod's temporary
    change of the momentum coefficient did on Keras 2 (Keras 3 compiles the coefficient
    into the step, so changing it would have no effect). Logs the rate as ``lr``.

    For Goyal et al.'s rule use :class:`~hvdtrain.adapters.keras.LinearScalingWarmup`.
    """

    def __init__(self, initial_lr: float, multiplier: float | Callable[[float], float],
                 start_epoch: int = 0, end_epoch: int | None = None, staircase: bool = True,
                 momentum_correction: bool = True, steps_per_epoch: int | None = None) -> None:
        super().__init__()
        if initial_lr is None:
            raise ValueError("initial_lr is required: the rate the multiplier scales")
        self.initial_lr = initial_lr
        self.multiplier = (multiplier if callable(multiplier)
                           else lambda epoch: multiplier ** (epoch - start_epoch))
        self.start_epoch, self.end_epoch = start_epoch, end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch = 0

    def on_train_begin(self, logs=None) -> None:
        """Find the batches per epoch when the rate changes within epochs."""
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = self.params.get("steps")
            if not self.steps_per_epoch:
                raise ValueError(f"{type(self).__name__} cannot tell the number of batches per "
                                 "epoch of this data: pass steps_per_epoch=")

    def on_epoch_begin(self, epoch: int, logs=None) -> None:
        """Remember the epoch."""
        self.current_epoch = epoch

    def on_train_batch_begin(self, batch: int, logs=None) -> None:
        """Set this batch's rate, inside [start_epoch, end_epoch)."""
        if self.current_epoch < self.start_epoch or (
                self.end_epoch is not None and self.current_epoch >= self.end_epoch):
            return
        if self.staircase:
            if batch == 0:
                self._set(self.current_epoch)
        else:
            self._set(self.current_epoch + batch / self.steps_per_epoch)

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        """Log the rate as ``lr`` (Horovod's key)."""
        if logs is not None:
            logs["lr"] = learning_rate(self.model.optimizer)

    def _set(self, epoch: float) -> None:
        set_learning_rate(self.model.optimizer, self.initial_lr * self.multiplier(epoch),
                          momentum_correction=self.momentum_correction)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Horovod's warmup: from ``initial_lr / size()`` to ``initial_lr`` over
    ``warmup_epochs``, changing before every batch.

    Horovod's ramp starts from the rate divided by the number of workers, whatever the
    global batch; Goyal et al.'s starts from η and scales by the global batch over the
    base batch (which counts gradient accumulation and per-worker batch size):
    :class:`~hvdtrain.adapters.keras.LinearScalingWarmup` does that.
    """

    def __init__(self, initial_lr: float, warmup_epochs: float = 5,
                 momentum_correction: bool = True, steps_per_epoch: int | None = None,
                 verbose: int = 0) -> None:
        super().__init__(initial_lr, self._ramp, start_epoch=0, end_epoch=warmup_epochs,
                         staircase=False, momentum_correction=momentum_correction,
                         steps_per_epoch=steps_per_epoch)
        self.warmup_epochs = warmup_epochs
        self.verbose = verbose

    def _ramp(self, epoch: float) -> float:
        # Horovod's: shifted by one batch so that each epoch ends on a round number.
        size = backend.horovod().size()
        epoch += 1.0 / self.steps_per_epoch
        return (epoch * (size - 1) / self.warmup_epochs + 1) / size

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        """Log the rate; say when the warmup is over (rank 0, with ``verbose``)."""
        super().on_epoch_end(epoch, logs)
        if (epoch == self.end_epoch - 1 and self.verbose > 0
                and backend.horovod().rank() == 0):
            print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to "
                  f"{learning_rate(self.model.optimizer):g}.")
