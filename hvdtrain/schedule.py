"""The learning-rate rules of Goyal et al. 2017, as pure math (no framework).

*Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour* (arXiv:1706.02677):

- **Linear scaling rule**: when the minibatch grows by a factor k, multiply the
  learning rate by k. Here k = global batch / base batch, where the global batch is
  per-worker batch x world size x gradient-accumulation steps, and the base batch is the
  one the learning rate η was tuned for (256 in the paper).
- **Gradual warmup**: start at η and add a constant amount every iteration so that
  the rate reaches kη after W = warmup epochs x steps per epoch iterations:
  ``LR(t) = η + (kη - η)·t/W`` for ``t < W`` and ``LR(W) = kη``.
- Afterwards the original schedule resumes: kη, multiplied by ``gamma`` at each
  milestone epoch (the paper: epochs 30, 60, 80 and gamma 0.1).

Conventions where the paper is silent:

- Warmup only ever ramps *up*. When k <= 1 (a global batch no larger than the base
  batch) the rate is kη from the first step: there is nothing to warm up to.
- A milestone that falls inside the warmup multiplies the ramp as well, so the
  rate is always ``ramp(t) * gamma ** (milestones passed)``.
- Epoch of step t is ``t // steps_per_epoch``; a milestone m applies from step
  ``m * steps_per_epoch`` on.

Unlike Horovod's ``LearningRateWarmupCallback`` (which ramps from ``η/size`` to a
pre-scaled rate and starts one increment above its floor), this schedule starts
exactly at η and takes k from the global batch, so gradient accumulation and the
per-worker batch size are accounted for.

Example::

    >>> from hvdtrain.schedule import LinearScalingSchedule
    >>> s = LinearScalingSchedule(base_lr=0.1, batch_size_per_worker=64, world_size=8,
    ...                           steps_per_epoch=100)
    >>> s.scale, s.target_lr, s.warmup_steps
    (2.0, 0.2, 500)
    >>> s.lr_at(0), s.lr_at(250), s.lr_at(500)
    (0.1, 0.15000000000000002, 0.2)
"""

from __future__ import annotations

import itertools
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from hvdtrain.validation import is_finite_number, require_positive_int, require_positive_number

DEFAULT_BASE_BATCH_SIZE = 256
DEFAULT_WARMUP_EPOCHS = 5
DEFAULT_GAMMA = 0.1


@dataclass(frozen=True)
class EpochRow:
    """The learning rate over one epoch: at its first step and at its last step."""

    epoch: int
    first_step: int
    last_step: int
    first_lr: float
    last_lr: float


@dataclass(frozen=True)
class LinearScalingSchedule:
    """Goyal et al.'s linear scaling rule with gradual warmup and step decay.

    Use it to compute the learning rate of every optimizer step of a data-parallel
    run; the framework adapters apply it to their optimizers.

    Args:
        base_lr: η, the learning rate tuned for ``base_batch_size``.
        batch_size_per_worker: examples each worker sees per forward pass.
        world_size: number of data-parallel workers (Horovod's ``size()``).
        steps_per_epoch: optimizer steps per epoch.
        base_batch_size: the global batch η was tuned for (256 in the paper).
        warmup_epochs: epochs of gradual warmup (5 in the paper; 0 disables it).
            Fractional values are allowed; W is rounded to whole steps.
        milestones: epochs, ascending, at which the rate is multiplied by ``gamma``.
        gamma: the decay factor at each milestone.
        backward_passes_per_step: gradient-accumulation steps per optimizer step.

    Raises:
        ValueError: naming the argument and the reason, for any invalid input.
    """

    base_lr: float
    batch_size_per_worker: int
    world_size: int
    steps_per_epoch: int
    base_batch_size: int = DEFAULT_BASE_BATCH_SIZE
    warmup_epochs: float = DEFAULT_WARMUP_EPOCHS
    milestones: Sequence[int] = field(default=())
    gamma: float = DEFAULT_GAMMA
    backward_passes_per_step: int = 1

    def __post_init__(self) -> None:
        require_positive_number("base_lr", self.base_lr)
        for name in ("batch_size_per_worker", "world_size", "steps_per_epoch",
                     "base_batch_size", "backward_passes_per_step"):
            require_positive_int(name, getattr(self, name))
        if not is_finite_number(self.warmup_epochs) or self.warmup_epochs < 0:
            raise ValueError(
                f"warmup_epochs must be a finite number >= 0 (0 disables warmup), "
                f"got {self.warmup_epochs!r}"
            )
        require_positive_number("gamma", self.gamma)
        object.__setattr__(self, "milestones", _validated_milestones(self.milestones))

    @property
    def global_batch_size(self) -> int:
        """Examples per optimizer step over all workers and accumulation steps."""
        return self.batch_size_per_worker * self.world_size * self.backward_passes_per_step

    @property
    def scale(self) -> float:
        """k, the factor by which the global batch exceeds the base batch."""
        return self.global_batch_size / self.base_batch_size

    @property
    def target_lr(self) -> float:
        """kη, the rate the warmup reaches."""
        return self.scale * self.base_lr

    @property
    def warmup_steps(self) -> int:
        """W, the number of warmup iterations (0 when there is nothing to ramp)."""
        if self.scale <= 1:
            return 0
        return round(self.warmup_epochs * self.steps_per_epoch)

    def lr_at(self, step: int) -> float:
        """The learning rate of optimizer step ``step`` (0-based)."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be an int >= 0, got {step!r}")
        if step < self.warmup_steps:
            return self._rate(step, self.warmup_steps, step // self.steps_per_epoch)
        return self._rate(None, None, step // self.steps_per_epoch)

    def lr_at_epoch(self, epoch: float) -> float:
        """The rule at a point of training measured in epochs (fractions allowed).

        This is the form that survives a change of world size: an elastic job that
        shrinks or grows mid-training keeps its place in epochs (samples seen over
        samples per epoch), and the rate there follows this schedule's k. It equals
        ``lr_at(step)`` at ``epoch = step / steps_per_epoch`` whenever the warmup
        is a whole number of steps (up to rounding in the last place).
        """
        if isinstance(epoch, bool) or not is_finite_number(epoch) or epoch < 0:
            raise ValueError(f"epoch must be a finite number >= 0, got {epoch!r}")
        if self.scale > 1 and epoch < self.warmup_epochs:
            return self._rate(epoch, self.warmup_epochs, int(epoch))
        return self._rate(None, None, int(epoch))

    def _rate(self, ramp_done: float | None, ramp_length: float | None, epoch: int) -> float:
        """The rule itself: η plus ``ramp_done / ramp_length`` of the way to kη (kη once
        the ramp is over: ``None``), times ``gamma`` per milestone up to ``epoch``."""
        if ramp_done is None:
            lr = self.target_lr
        else:
            eta = self.base_lr
            lr = eta + (self.target_lr - eta) * ramp_done / ramp_length
        decays = bisect_right(self.milestones, epoch)
        return lr * self.gamma**decays if decays else lr

    def epoch_table(self, epochs: int) -> list[EpochRow]:
        """One row per epoch for ``epochs`` epochs, for printing or checking a plan."""
        require_positive_int("epochs", epochs)
        rows = []
        for epoch in range(epochs):
            first = epoch * self.steps_per_epoch
            last = first + self.steps_per_epoch - 1
            rows.append(EpochRow(epoch, first, last, self.lr_at(first), self.lr_at(last)))
        return rows


@dataclass(frozen=True)
class WarmupProgress:
    """Where a run stands in the rule when its number of workers can change.

    An elastic job that shrinks or grows, or a checkpoint resumed on another world
    size, keeps its place in epochs: the samples seen so far over ``samples_per_epoch``
    (fixed when training began). Until the first change the rate is exactly the step
    rule (:meth:`LinearScalingSchedule.lr_at`); after one it is
    :meth:`LinearScalingSchedule.lr_at_epoch` for the new k at that point, so the warmup
    keeps its length in epochs and milestones stay at their epochs. The torch
    scheduler and the Keras callback both keep their progress in one of these.

    Args:
        schedule: the rule at the current world size.
        samples_per_epoch: the examples in one epoch of the data set, as the schedule
            counts them (steps per epoch x global batch when training began).
        resized_at: ``(step, samples seen)`` when the number of workers last changed
            to ``schedule.world_size``; None when it never changed.

    Example::

        >>> from hvdtrain.schedule import LinearScalingSchedule, WarmupProgress
        >>> s = LinearScalingSchedule(base_lr=0.1, batch_size_per_worker=64, world_size=8,
        ...                           steps_per_epoch=100)
        >>> progress = WarmupProgress.begin(s).resized(step=250, world_size=6)
        >>> progress.samples_seen(260), round(progress.lr_at(260), 6)
        (131840, 0.12575)
    """

    schedule: LinearScalingSchedule
    samples_per_epoch: int
    resized_at: tuple[int, int] | None = None

    @classmethod
    def begin(cls, schedule: LinearScalingSchedule) -> WarmupProgress:
        """The progress at the start of training under ``schedule``."""
        return cls(schedule, schedule.steps_per_epoch * schedule.global_batch_size)

    @property
    def world_size(self) -> int:
        """The number of workers the rule counts now."""
        return self.schedule.world_size

    def samples_seen(self, step: int) -> int:
        """Examples consumed over all workers by the first ``step`` optimizer steps:
        each step since the last change counts the current global batch."""
        if self.resized_at is None:
            return step * self.schedule.global_batch_size
        resized_step, resized_samples = self.resized_at
        return resized_samples + (step - resized_step) * self.schedule.global_batch_size

    def lr_at(self, step: int, base_lr: float | None = None) -> float:
        """The rate of optimizer step ``step`` (counted from the start of training).

        Args:
            step: the step, 0-based.
            base_lr: η for this rate, when it is not the schedule's (torch gives each
                param group its own).
        """
        schedule = self.schedule if base_lr is None else replace(self.schedule, base_lr=base_lr)
        if self.resized_at is None:
            return schedule.lr_at(step)
        return schedule.lr_at_epoch(self.samples_seen(step) / self.samples_per_epoch)

    def resized(self, step: int, world_size: int) -> WarmupProgress:
        """The progress after the number of workers becomes ``world_size`` at ``step``."""
        require_positive_int("world_size", world_size)
        if world_size == self.world_size:
            return self
        return WarmupProgress(replace(self.schedule, world_size=world_size),
                              self.samples_per_epoch, (step, self.samples_seen(step)))

    def state_dict(self) -> dict[str, Any]:
        """The progress as plain values (what a checkpoint or an elastic sync carries)."""
        return {"world_size": self.world_size, "samples_per_epoch": self.samples_per_epoch,
                "resized_at": self.resized_at}

    @classmethod
    def from_state_dict(cls, schedule: LinearScalingSchedule,
                        state: dict[str, Any]) -> WarmupProgress:
        """The progress in ``state`` (from :meth:`state_dict`) of a run configured as
        ``schedule`` (whose world size is taken from ``state``)."""
        resized_at = state["resized_at"]
        return cls(replace(schedule, world_size=state["world_size"]),
                   state["samples_per_epoch"],
                   tuple(resized_at) if resized_at is not None else None)


def _validated_milestones(milestones: Sequence[int]) -> tuple[int, ...]:
    values = tuple(milestones)
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"milestones must be epochs (ints >= 0), got {value!r} in {values}")
    if any(b <= a for a, b in itertools.pairwise(values)):
        raise ValueError(f"milestones must be strictly ascending, got {values}")
    return values
