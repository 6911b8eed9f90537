"""The settings of Goyal et al.'s warmup as every adapter's ``LinearScalingWarmup``
takes them: one list of arguments, one validation, one agreement across ranks.

The torch scheduler, the Keras callback, the TensorFlow schedule and the NumPy scheduler
differ in where η comes from (each param group's rate, the optimizer's, an argument) and
in how they apply the rate. What they take besides is :class:`WarmupArguments`;
:class:`WarmupSettings` validates it and, with η and the workers, makes the run's
:class:`~hvdtrain.schedule.LinearScalingSchedule`; :func:`check_warmup_agreement`
compares the schedule across ranks, every field and η included, so a rank started with
other settings stops every rank with the same message in every adapter.

Example::

    >>> from hvdtrain.warmup import WarmupSettings
    >>> settings = WarmupSettings.of(batch_size_per_worker=64, steps_per_epoch=100)
    >>> settings.schedule(base_lr=0.1, world_size=8).target_lr
    0.2
    >>> WarmupSettings.of(batch_size_per_worker=64, warmup_epoch=5)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    TypeError: LinearScalingWarmup got an unknown argument warmup_epoch; it takes ...
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Required, TypedDict

from hvdtrain.collective import Collective, require_initialized
from hvdtrain.consistency import check_ranks_agree
from hvdtrain.schedule import (
    DEFAULT_BASE_BATCH_SIZE,
    DEFAULT_GAMMA,
    DEFAULT_WARMUP_EPOCHS,
    LinearScalingSchedule,
)
from hvdtrain.validation import require_same_world_size

WHERE = "LinearScalingWarmup"
# The agreement's collective name, the same in every adapter.
AGREEMENT = "hvdtrain.warmup_agreement"


class WarmupArguments(TypedDict, total=False):
    """The keyword arguments of every adapter's ``LinearScalingWarmup``; what each means
    is in :class:`WarmupSettings`."""

    batch_size_per_worker: Required[int]
    steps_per_epoch: int | None
    base_batch_size: int
    warmup_epochs: float
    milestones: Iterable[int]
    gamma: float
    backward_passes_per_step: int | None
    world_size: int | None


@dataclass(frozen=True)
class WarmupSettings:
    """The warmup's settings, validated when made, before η and the workers are known.

    Args:
        batch_size_per_worker: examples each worker sees per forward pass.
        steps_per_epoch: optimizer steps per epoch (the Keras callback counts fit's
            batches, as fit does); None where the adapter can count them (the Keras
            callback, from ``fit``), required elsewhere.
        base_batch_size: the global batch η was tuned for (256 in the paper).
        warmup_epochs: epochs of gradual warmup (0 disables it).
        milestones: epochs, ascending, at which the rate is multiplied by ``gamma``.
        gamma: the decay factor at each milestone.
        backward_passes_per_step: gradient-accumulation steps per optimizer step; None
            means the optimizer's (1 where the adapter has no optimizer to ask).
        world_size: the number of workers; None means the launcher's, and a number
            must equal it.

    Raises:
        ValueError: naming the argument and the reason, for any invalid value.
    """

    batch_size_per_worker: int
    steps_per_epoch: int | None = None
    base_batch_size: int = DEFAULT_BASE_BATCH_SIZE
    warmup_epochs: float = DEFAULT_WARMUP_EPOCHS
    milestones: Sequence[int] = ()
    gamma: float = DEFAULT_GAMMA
    backward_passes_per_step: int | None = None
    world_size: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "milestones", tuple(self.milestones))
        # The schedule validates every setting; 1 stands in for those not known yet.
        self.schedule(base_lr=1.0, world_size=1 if self.world_size is None else self.world_size,
                      steps_per_epoch=self.steps_per_epoch)

    @classmethod
    def of(cls, **arguments: Any) -> WarmupSettings:
        """The settings from an adapter's keyword arguments, with an error naming any
        argument ``LinearScalingWarmup`` does not take."""
        names = [field.name for field in dataclasses.fields(cls)]
        unknown = [name for name in arguments if name not in names]
        if unknown:
            raise TypeError(f"{WHERE} got an unknown argument {', '.join(unknown)}; "
                            f"it takes {', '.join(names)}")
        if "batch_size_per_worker" not in arguments:
            raise TypeError(f"{WHERE} needs batch_size_per_worker=, the examples each worker "
                            "sees per forward pass")
        return cls(**arguments)

    def require_steps_per_epoch(self) -> int:
        """``steps_per_epoch``, which this adapter cannot count itself."""
        if self.steps_per_epoch is None:
            raise TypeError(f"{WHERE} needs steps_per_epoch=, the optimizer steps in one "
                            "epoch (e.g. len(loader) // backward_passes_per_step)")
        return self.steps_per_epoch

    def passes(self, optimizer_passes: int = 1) -> int:
        """The gradient-accumulation steps per optimizer step, given the optimizer's:
        a ``backward_passes_per_step`` that differs from it is an error, as k would not
        count the whole global batch."""
        if self.backward_passes_per_step not in (None, optimizer_passes):
            raise ValueError(
                f"the optimizer accumulates {optimizer_passes} backward passes per step but "
                f"{WHERE} got backward_passes_per_step={self.backward_passes_per_step}; pass "
                f"backward_passes_per_step={optimizer_passes} (or leave it out) so k counts "
                "the whole global batch")
        return optimizer_passes

    def workers(self, collective: Collective) -> int:
        """The world size: ``world_size`` when given (it must match the launcher's when the
        workers are connected), else the launcher's."""
        if self.world_size is None:
            require_initialized(collective, f"{WHERE} (world_size=None means the launcher's)")
            return collective.size()
        if collective.is_initialized():
            require_same_world_size(self.world_size, collective.size(),
                                    collective.init_call.replace("init()", "size()"))
        return self.world_size

    def schedule(self, base_lr: float, world_size: int, steps_per_epoch: int | None = None,
                 passes: int | None = None) -> LinearScalingSchedule:
        """The rule for η = ``base_lr`` on ``world_size`` workers; ``steps_per_epoch`` and
        ``passes`` where the adapter counted them, else the settings' own (1 where those
        are not known yet)."""
        if steps_per_epoch is None:
            steps_per_epoch = 1 if self.steps_per_epoch is None else self.steps_per_epoch
        if passes is None:
            passes = 1 if self.backward_passes_per_step is None else self.backward_passes_per_step
        return LinearScalingSchedule(
            base_lr=base_lr, batch_size_per_worker=self.batch_size_per_worker,
            world_size=world_size, steps_per_epoch=steps_per_epoch,
            base_batch_size=self.base_batch_size, warmup_epochs=self.warmup_epochs,
            milestones=self.milestones, gamma=self.gamma, backward_passes_per_step=passes)


def check_warmup_agreement(collective: Collective, schedule: LinearScalingSchedule,
                           base_lrs: Sequence[float] | None = None) -> None:
    """Raise :class:`~hvdtrain.consistency.RankDisagreementError` on every rank unless
    every rank has the same ``schedule``, every field included; ``base_lrs`` stands for
    its η where there is one per param group (torch)."""
    facts = dataclasses.asdict(schedule)
    if base_lrs is not None:
        facts["base_lr"] = [float(rate) for rate in base_lrs]
    check_ranks_agree(collective, facts, WHERE, name=AGREEMENT)
