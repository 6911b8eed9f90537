"""``LinearScalingWarmup``: Goyal et al.'s linear scaling rule and gradual warmup in ``fit``."""

from __future__ import annotations

from typing import Any, Unpack

import keras

from hvdtrain.adapters.keras import _internals, backend
from hvdtrain.adapters.keras.callbacks._rates import learning_rate, set_learning_rate
from hvdtrain.collective import gather, require_initialized
from hvdtrain.runtime import elastic_job
from hvdtrain.schedule import LinearScalingSchedule, WarmupProgress
from hvdtrain.validation import require_positive_int
from hvdtrain.warmup import WarmupArguments, WarmupSettings, check_warmup_agreement


class LinearScalingWarmup(keras.callbacks.Callback):
    """Goyal et al.'s linear scaling rule and gradual warmup for ``model.fit``.

    Before every batch it sets ``optimizer.learning_rate`` from
    :class:`hvdtrain.schedule.LinearScalingSchedule`: η (the optimizer's learning rate
    when training first begins, the rate tuned for ``base_batch_size``) rising by a
    constant amount per optimizer step to kη after ``warmup_epochs``, then kη times
    ``gamma`` at each milestone epoch, with k = batch_size_per_worker x world size x
    gradient-accumulation steps / base_batch_size. With accumulation, k assumes the
    update applies the mean of the micro-batches: make the optimizer with
    ``hvk.DistributedOptimizer(opt, backward_passes_per_step=N,
    average_aggregated_gradients=True)`` (Horovod's default sums them).

    Keras's SGD keeps the learning rate inside its velocity (v = m·v - lr·g), so with
    ``momentum_correction`` the velocity slots are multiplied by new_lr/old_lr whenever
    the rate changes (Goyal et al. §3, remark 2); other optimizers are left alone.
    Resumes with ``fit(initial_epoch=...)``; when continuing a model whose optimizer
    already holds a scaled rate, pass ``base_lr`` (η) explicitly. When the workers'
    shares give them different numbers of batches (:class:`JoinAtEpochEnd`), an epoch
    is the longest share's.

    In an elastic job (:mod:`hvdtrain.adapters.keras.elastic`) the callback keeps its
    progress across ``fit`` calls and resets: give it to the ``KerasState``, which
    commits, restores and syncs it and calls :meth:`set_world_size` after every
    reset, so the rate follows the rule for the new k from the samples seen so far.

    Example::

        model.fit(x, y, batch_size=32, epochs=20,
                  callbacks=[hvk.LinearScalingWarmup(batch_size_per_worker=32)])
    """

    def __init__(self, *, base_lr: float | None = None, momentum_correction: bool = True,
                 **settings: Unpack[WarmupArguments]) -> None:
        """Args: η (``base_lr``; None: the optimizer's rate when training begins), whether
        to correct the momentum, and the settings of
        :class:`hvdtrain.warmup.WarmupSettings`. Here ``steps_per_epoch`` counts fit's
        steps, the batches (micro-batches with accumulation), as fit does; None: fit's
        own count."""
        super().__init__()
        self.settings = WarmupSettings.of(**settings)
        if base_lr is not None:
            self.settings.schedule(base_lr, world_size=1, steps_per_epoch=1)  # validates it
        self.base_lr = base_lr
        self.momentum_correction = momentum_correction
        # Where training stands once it has begun (None before).
        self.progress: WarmupProgress | None = None
        self._batches_per_epoch = 0
        self._passes = 1
        # Micro-batches trained since training began (the batch about to run, once
        # on_train_batch_begin has set its rate).
        self._batches_done = 0

    def _make_schedule(self, batches_per_epoch: int, world_size: int) -> LinearScalingSchedule:
        return self.settings.schedule(self.base_lr, world_size,
                                      steps_per_epoch=max(1, batches_per_epoch // self._passes),
                                      passes=self._passes)

    def on_train_begin(self, logs=None) -> None:
        """Fix η and the schedule and check that every rank has the same one."""
        collective = backend.collective()
        require_initialized(collective, "LinearScalingWarmup")
        if self.progress is not None and elastic_job():
            # A later fit of an elastic job (after a reset, or after a partial epoch), or
            # a worker that joined and was given rank 0's progress: keep the schedule,
            # whatever this fit's epoch length.
            return
        optimizer = self.model.optimizer
        if _internals.has_schedule(optimizer):
            raise TypeError("the optimizer's learning rate is a LearningRateSchedule; give it a "
                            "float learning rate (η) for LinearScalingWarmup to drive")
        batches = self.settings.steps_per_epoch or self.params.get("steps")
        if not self.settings.steps_per_epoch and not elastic_job():
            # Shares may give the workers different numbers of batches (JoinAtEpochEnd):
            # the job's epoch is the longest.
            shares = gather(collective, batches, "hvdtrain.warmup.batches")
            batches = None if None in shares else max(shares)
        if not batches:
            raise ValueError("LinearScalingWarmup needs steps_per_epoch: fit does not know the "
                             "number of batches per epoch for this data; pass steps_per_epoch=")
        if self.base_lr is None:
            self.base_lr = learning_rate(optimizer)
            if not self.base_lr > 0:
                raise ValueError(
                    f"the optimizer's learning rate is {self.base_lr}: LinearScalingWarmup "
                    "scales it (η, tuned for base_batch_size); give the optimizer that rate, "
                    "or pass base_lr=")
        self._passes = self.settings.passes(optimizer.gradient_accumulation_steps or 1)
        self._batches_per_epoch = batches
        self.progress = WarmupProgress.begin(
            self._make_schedule(batches, self.settings.workers(collective)))
        if elastic_job():
            # A worker that joins an elastic job starts this fit later than the others;
            # the elastic state's sync has given it rank 0's schedule and progress.
            return
        check_warmup_agreement(collective, self.schedule)

    def on_epoch_begin(self, epoch: int, logs=None) -> None:
        """Count the batches of the epochs before: a step counts from the start of
        training. In an elastic job the count is the elastic state's once training has
        begun (an epoch may have been cut short by a reset)."""
        if not elastic_job() or (self._batches_done == 0 and self.resized_at is None):
            self._batches_done = epoch * self._batches_per_epoch

    def on_train_batch_begin(self, batch: int, logs=None) -> None:
        """Set the rate of this batch's optimizer step (and correct the momentum)."""
        self._set_rate(self.lr)
        self._batches_done += 1

    @property
    def step(self) -> int:
        """Optimizer steps taken so far (the step the next batch belongs to)."""
        return self._batches_done // self._passes

    @property
    def schedule(self) -> LinearScalingSchedule | None:
        """The rule at the current world size (None until training begins)."""
        return self.progress.schedule if self.progress else None

    @property
    def world_size(self) -> int | None:
        """The number of workers the rule counts now (None until training begins)."""
        return self.progress.world_size if self.progress else None

    @property
    def resized_at(self) -> tuple[int, int] | None:
        """``(step, samples seen)`` when the world size last changed; None if never."""
        return self.progress.resized_at if self.progress else None

    @property
    def lr(self) -> float:
        """The rule's rate for :attr:`step`, at the current world size."""
        return self.progress.lr_at(self.step)

    @property
    def samples_seen(self) -> int:
        """Examples consumed by the optimizer steps taken so far, over all workers."""
        return self.progress.samples_seen(self.step)

    def set_world_size(self, world_size: int) -> None:
        """Continue with k for ``world_size`` workers from the samples seen so far.

        The next batch gets the rule for the new k at that point in epochs
        (:class:`hvdtrain.schedule.WarmupProgress`), and the momentum is corrected for
        the change of rate. Called by the elastic ``KerasState`` after every reset;
        before training begins there is nothing to continue (``on_train_begin`` takes
        the world size then).
        """
        require_positive_int("world_size", world_size)
        if self.progress is not None:
            self.progress = self.progress.resized(self.step, world_size)

    def state_dict(self) -> dict[str, Any]:
        """The progress an elastic job commits and syncs (plain Python values)."""
        progress = self.progress.state_dict() if self.progress else \
            {"world_size": None, "samples_per_epoch": None, "resized_at": None}
        return {"base_lr": self.base_lr, "batches_per_epoch": self._batches_per_epoch,
                "passes": self._passes, "batches_done": self._batches_done, **progress}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (from :meth:`state_dict`, maybe another rank's)."""
        if state["base_lr"] is None:  # saved before training began: nothing to continue
            return
        self.base_lr = state["base_lr"]
        self._batches_per_epoch = state["batches_per_epoch"]
        self._passes = state["passes"]
        self._batches_done = state["batches_done"]
        schedule = self._make_schedule(self._batches_per_epoch, state["world_size"])
        self.progress = WarmupProgress.from_state_dict(schedule, state)

    def _set_rate(self, new: float) -> None:
        set_learning_rate(self.model.optimizer, new, momentum_correction=self.momentum_correction)

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        """Log the rate as ``learning_rate``."""
        if logs is not None:
            logs["learning_rate"] = learning_rate(self.model.optimizer)
