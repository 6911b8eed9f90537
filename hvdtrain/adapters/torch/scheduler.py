"""``LinearScalingWarmup``: Goyal et al.'s linear scaling rule and gradual warmup
(:mod:`hvdtrain.schedule`) as a torch learning-rate scheduler."""

from __future__ import annotations

import dataclasses
from typing import Any, Unpack

import horovod.torch as _hvd
import torch

from hvdtrain.adapters.torch._horovod import collective
from hvdtrain.runtime import elastic_job
from hvdtrain.schedule import LinearScalingSchedule, WarmupProgress
from hvdtrain.warmup import WarmupArguments, WarmupSettings, check_warmup_agreement

__all__ = ["LinearScalingWarmup"]

# What state_dict() holds of the WarmupProgress, beside torch's own keys.
PROGRESS_KEYS = ("world_size", "samples_per_epoch", "resized_at")


class LinearScalingWarmup(torch.optim.lr_scheduler.LRScheduler):
    """Goyal et al.'s linear scaling rule with gradual warmup, for any torch optimizer.

    Step it once per optimizer step. Each param group's learning rate when the
    scheduler is made is its η, the rate tuned for ``base_batch_size``; the group then
    follows :class:`hvdtrain.schedule.LinearScalingSchedule`: η at step 0, rising by a
    constant amount per step to kη after ``warmup_epochs``, then kη times ``gamma`` at
    each milestone epoch, where k = batch_size_per_worker x world_size x
    backward_passes_per_step / base_batch_size. With micro-batches, k assumes the step
    applies their mean: wrap with ``average_aggregated_gradients=True``, or divide the
    loss by the number of passes (Horovod's way, whose optimizer sums them).

    PyTorch's SGD keeps the learning rate out of its momentum buffer (v = μv + g;
    p -= lr·v), so changing the rate needs no momentum correction here (Goyal et al.'s
    remark 2 applies to the v = μv + lr·g form, which Keras uses).

    ``state_dict()`` holds only the progress (step count, base rates, the world size
    and where training stands in samples); resuming with ``load_state_dict`` continues
    the exact sequence. When the number of workers changes (an elastic job, or a
    checkpoint resumed on another world size), :meth:`set_world_size` continues the
    rule for the new k from the samples seen so far. Example::

        scheduler = hvt.LinearScalingWarmup(optimizer, batch_size_per_worker=32,
                                            steps_per_epoch=len(loader))
        ...
        optimizer.step()
        scheduler.step()
    """

    def __init__(self, optimizer: torch.optim.Optimizer,
                 **settings: Unpack[WarmupArguments]) -> None:
        """Args: the optimizer (each param group's rate is its η), and the settings of
        :class:`hvdtrain.warmup.WarmupSettings` (``steps_per_epoch`` required)."""
        self.settings = WarmupSettings.of(**settings)
        passes = self.settings.passes(getattr(optimizer, "backward_passes_per_step", 1))
        # η is per param group (lr_at's base_lr); 1.0 stands in for it in the schedule.
        self.progress = WarmupProgress.begin(self.settings.schedule(
            base_lr=1.0, world_size=self.settings.workers(collective()),
            steps_per_epoch=self.settings.require_steps_per_epoch(), passes=passes))
        rates = [group.get("initial_lr", group["lr"]) for group in optimizer.param_groups]
        if not any(float(rate) > 0 for rate in rates):
            raise ValueError(
                f"every param group's learning rate is 0 ({rates}): LinearScalingWarmup scales "
                "each group's rate (η, tuned for base_batch_size); give the optimizer that rate")
        # In an elastic job a worker that joins builds this while the others train; the
        # elastic state's sync gives it rank 0's progress instead.
        if _hvd.is_initialized() and not elastic_job():
            check_warmup_agreement(collective(), self.progress.schedule, base_lrs=rates)
        super().__init__(optimizer)

    def schedule_for(self, base_lr: float) -> LinearScalingSchedule:
        """The schedule one param group follows, given its η (at the current world size)."""
        return dataclasses.replace(self.progress.schedule, base_lr=base_lr)

    @property
    def world_size(self) -> int:
        """The number of workers the rule counts now."""
        return self.progress.world_size

    @property
    def resized_at(self) -> tuple[int, int] | None:
        """``(step, samples seen)`` when the world size last changed; None if never."""
        return self.progress.resized_at

    @property
    def samples_seen(self) -> int:
        """Examples consumed by the optimizer steps taken so far, over all workers."""
        return self.progress.samples_seen(max(self.last_epoch, 0))

    def set_world_size(self, world_size: int) -> None:
        """Continue with k for ``world_size`` workers from the samples seen so far.

        From here on each step counts ``world_size`` workers' batches, and the rate is
        the rule for the new k at the current point of training in epochs
        (:class:`hvdtrain.schedule.WarmupProgress`): the warmup still ends after
        ``warmup_epochs`` epochs and milestones stay at their epochs. Called by
        ``hvdtrain.adapters.torch.elastic.TorchState`` after every reset; call it
        yourself after loading a checkpoint written by a different number of workers.
        """
        progress = self.progress.resized(max(self.last_epoch, 0), world_size)
        if progress is not self.progress:
            self.progress = progress
            self._apply_rates()

    def get_lr(self) -> list[float]:
        """Each param group's rate for the current step (torch's scheduler protocol)."""
        step = max(self.last_epoch, 0)
        return [self.progress.lr_at(step, eta) if eta > 0 else 0.0 for eta in self.base_lrs]

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume the progress in ``state_dict`` and set the optimizer's rates to it."""
        state = dict(state_dict)
        progress = {key: state.pop(key) for key in PROGRESS_KEYS}
        super().load_state_dict(state)
        self.progress = WarmupProgress.from_state_dict(self.progress.schedule, progress)
        self._apply_rates()

    def _apply_rates(self) -> None:
        rates = self.get_lr()
        for group, rate in zip(self.optimizer.param_groups, rates, strict=True):
            group["lr"] = rate
        self._last_lr = rates

    def state_dict(self) -> dict[str, Any]:
        """Progress only, as plain values (a checkpoint loads with ``weights_only=True``),
        not the configuration, so a resumed run keeps its own arguments."""
        state = super().state_dict()
        state.pop("settings", None)
        state.update(state.pop("progress").state_dict())
        return state
