"""The rules of the averaged gradient step, shared by every adapter (framework-free).

Each adapter moves its framework's tensors through Horovod; what travels with them and
how the result is read is decided here, once:

- the tally: :data:`TALLY` numbers behind the gradients in one flat reduction. Each
  rank sends a 1 (:data:`COUNT`), which the sum turns into the number of ranks that sent
  gradients (a rank that called ``join()`` sends zeros), and the L2 norm of its
  gradients (:data:`BOUND`), whose sum bounds every reduced element and every partial
  sum of the reduction;
- the finiteness proof that reads that one bound instead of every gradient
  (:func:`finite_bound_limit`, :func:`read_tally`);
- the rescaling after ``join()``, from an average over every rank to one over the ranks
  that sent gradients (:func:`joined_rescale`);
- the vote that makes one rank's finding every rank's (:func:`any_rank`);
- what to do with a gradient that is not finite (:class:`NonFinitePolicy`);
- the formats gradients can travel in (:data:`WIRE_FORMATS`);
- the observers of every step (:data:`step_observers`), where features that watch
  training (timing, reports) plug in once for every adapter.

The functions that a graph adapter applies to tensors (:func:`joined_rescale`,
:func:`some_ranks_joined`, :func:`any_rank`) use only arithmetic and comparison, and take
the framework's ``maximum`` or its :class:`hvdtrain.collective.TensorCollective` as
arguments, so the same rule serves Python numbers and every framework's tensors.

Example::

    >>> reading = read_tally(2.0 * 0.5, 10.0 * 0.5, unit=0.5, prescale=1.0,
    ...                      largest=3.4028234663852886e38)
    >>> reading.contributors, reading.proves_finite
    (2, True)
    >>> joined_rescale(1, 2)
    2.0
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from hvdtrain import horovod_patches
from hvdtrain.collective import TensorCollective

TALLY = 2
"""How many numbers ride behind the gradients: the count, then the bound."""
COUNT = 0
"""The tally's position of each rank's 1 (after the reduction: the contributors)."""
BOUND = 1
"""The tally's position of each rank's gradient norm (after the reduction: the bound)."""


def finite_bound_limit(largest: float, *, prescale: float, unit: float) -> float:
    """The reduced bound (as the reduction leaves it) below which every reduced gradient
    element is finite, proved without reading them.

    Each rank's norm is at least the magnitude of each of its elements, so the sum of
    the norms bounds every element of the sum and every partial sum a ring or tree takes
    on the way, before and after the scalings. Half the wire's largest number leaves
    room for the rounding of those sums and of the norms themselves.

    Args:
        largest: the largest finite number of the dtype on the wire.
        prescale: the factor each rank's values were multiplied by before the sum.
        unit: what one rank's 1 became in the reduction (every scaling applied, over the
            number of ranks for an average).

    Returns:
        The limit, in the units of the reduced buffer (a bound exactly at it is not a
        proof; NaN and infinity are never below it).
    """
    return largest / 2 / max(1.0, prescale, abs(unit)) * abs(unit)


@dataclass(frozen=True)
class TallyReading:
    """What a reduced tally says.

    Attributes:
        contributors: the number of ranks that sent gradients.
        proves_finite: whether the reduced bound proves every reduced gradient finite;
            when False the gradients must be read to decide.
    """

    contributors: int
    proves_finite: bool


def read_tally(count: float, bound: float, *, unit: float, prescale: float,
               largest: float) -> TallyReading:
    """Read the reduced tally: its :data:`COUNT` and :data:`BOUND` numbers as the
    reduction left them (``unit``, ``prescale``: as in :func:`finite_bound_limit`;
    ``largest``: the wire's largest number)."""
    return TallyReading(
        contributors=round(count / unit),
        proves_finite=bool(abs(bound) < finite_bound_limit(largest, prescale=prescale,
                                                           unit=unit)))


def joined_rescale(contributors: Any, size: int, *, maximum: Callable[[Any, Any], Any] = max
                   ) -> Any:
    """The factor that turns an average over all ``size`` ranks into the average over
    the ``contributors`` that sent gradients (ranks that called ``join()`` sent zeros):
    1 when every rank did; ``size`` when none did (the gradients are then zeros).

    ``contributors`` may be a tensor; pass the framework's element-wise ``maximum``.
    """
    return size / maximum(contributors, 1)


def some_ranks_joined(contributors: Any, size: int) -> Any:
    """Whether fewer than ``size`` ranks sent gradients (a bool, or a boolean tensor),
    i.e. whether :func:`joined_rescale` is not 1 and the gradients need the pass."""
    return contributors < size - 0.5


def any_rank(flag: Any, tensors: TensorCollective, name: str) -> Any:
    """Whether some rank raised its ``flag``: a one-element tensor of the adapter's
    holding 1 where this rank's condition holds, 0 where not, summed over the ranks by
    one allreduce through ``tensors`` (named ``name``). The answer, a boolean tensor,
    is the same on every rank."""
    return tensors.wait(tensors.allreduce(flag, name, op="sum")) > 0


class NonFinitePolicy(enum.StrEnum):
    """What every adapter does when a worker-averaged gradient holds NaN or Inf; the
    same values on every rank, so every rank does the same.

    Users pass ``skip_nonfinite`` and ``check_nonfinite`` (:meth:`of`).
    """

    RAISE = "raise"
    """Stop training on every rank with the non-finite gradient error."""
    SKIP = "skip"
    """Skip the update on every rank (a NaN or Inf on any rank skips it everywhere) and
    count it."""
    IGNORE = "ignore"
    """Apply the update as it is (Horovod's behaviour): no check."""

    @classmethod
    def of(cls, skip_nonfinite: bool, check_nonfinite: bool) -> NonFinitePolicy:
        """The policy of the adapters' two arguments; skipping implies checking."""
        if skip_nonfinite:
            return cls.SKIP
        return cls.RAISE if check_nonfinite else cls.IGNORE

    @property
    def checks(self) -> bool:
        """Whether the averaged gradients are checked at all."""
        return self is not NonFinitePolicy.IGNORE

    @property
    def skips(self) -> bool:
        """Whether a non-finite step is skipped rather than raised."""
        return self is NonFinitePolicy.SKIP


@dataclass(frozen=True)
class WireFormat:
    """A format gradients travel in (hvdtrain's ``compression`` argument).

    Attributes:
        name: the ``compression`` value (None: the gradients' own dtype).
        dtype: the dtype on the wire, or None for the gradients' own.
        largest: the largest finite number on the wire, or None for the gradients' own
            dtype's.
        needs_patch: the hvdtrain patch to Horovod that reduces it (None: every Horovod
            does); on a Horovod without it the format travels through Horovod's allgather
            and is added up on every rank in rank order.
    """

    name: str | None
    dtype: str | None
    largest: float | None
    needs_patch: str | None = None

    @property
    def reduced_natively(self) -> bool:
        """Whether the installed Horovod reduces this format in its allreduce."""
        return self.needs_patch is None or horovod_patches.has_patch(self.needs_patch)

    @property
    def bytes_per_element(self) -> int | None:
        """The bytes one element takes on the wire (None: the gradients' own size)."""
        return None if self.dtype is None else 2

    def largest_for(self, gradient_largest: float) -> float:
        """The largest finite number on the wire for gradients whose dtype's is
        ``gradient_largest``."""
        return gradient_largest if self.largest is None else min(self.largest,
                                                                  gradient_largest)


WIRE_FORMATS: dict[str | None, WireFormat] = {
    None: WireFormat(None, None, None),
    "fp16": WireFormat("fp16", "float16", 65504.0),
    "bf16": WireFormat("bf16", "bfloat16", 3.3895313892515355e38,
                       needs_patch=horovod_patches.BFLOAT16),
}
"""Every ``compression`` hvdtrain accepts, by name."""


def require_bfloat16_reduction(what: str) -> None:
    """Raise RuntimeError, saying how to get it, when the installed Horovod cannot reduce
    bfloat16 (it lacks hvdtrain's patch 0011-bfloat16) and ``what`` needs it to."""
    if not WIRE_FORMATS["bf16"].reduced_natively:
        raise RuntimeError(horovod_patches.missing_patch_message(
            what, horovod_patches.BFLOAT16, "Horovod 0.28.1 has no bfloat16 reduction"))


def wire_format(name: object) -> WireFormat:
    """The wire format called ``name``; ValueError naming the choices for anything else."""
    try:
        return WIRE_FORMATS[name]  # type: ignore[index]
    except (KeyError, TypeError):
        *first, last = (repr(known) for known in WIRE_FORMATS)
        raise ValueError(f"compression must be {', '.join(first)} or {last}, got {name!r}"
                         ) from None


class StepObserver(Protocol):
    """Something that watches every averaged step (a timer, a report). Each adapter
    calls these on :data:`step_observers` in the order below; a step starts where the
    previous one finished. They run on the training thread: keep them short (the step
    timing of :mod:`hvdtrain.step_timing` adds one small allreduce per window).

    An observer whose ``takes_late_events`` is True may be told a batch of steps late,
    with ``at=`` the time each reduction started and finished (``time.perf_counter``'s
    clock): inside a TensorFlow graph, where calling Python costs about 0.1 ms per call,
    the Keras adapter then records the times in the graph and tells them every
    :data:`hvdtrain.adapters.keras.step_events.LATE_BATCH` steps, when every observer
    takes late events."""

    takes_late_events: bool

    def reduction_started(self, step: int, at: float | None = None) -> None:
        """This rank sends the gradients of optimizer step ``step`` (from 0; -1 where no
        optimizer is known, as a ``DistributedGradientTape`` without ``optimizer=``)."""

    def reduction_finished(self, step: int, at: float | None = None) -> None:
        """The averaged gradients of ``step`` are back on this rank."""

    def step_finished(self, step: int, applied: bool) -> None:
        """``step`` is over: its update was applied, or skipped (``applied`` False)."""


class StepObservers:
    """The observers of the averaged step, called in the order they were added. With
    none (the usual case) each event costs an adapter one truth test."""

    def __init__(self) -> None:
        self._observers: tuple[StepObserver, ...] = ()

    def add(self, observer: StepObserver) -> Callable[[], None]:
        """Start calling ``observer``; returns the function that stops it."""
        self._observers = (*self._observers, observer)
        return lambda: self.remove(observer)

    def remove(self, observer: StepObserver) -> None:
        """Stop calling ``observer`` (nothing if it is not there)."""
        self._observers = tuple(o for o in self._observers if o is not observer)

    def __bool__(self) -> bool:
        return bool(self._observers)

    @property
    def take_late_events(self) -> bool:
        """Whether every observer may be told late (:class:`StepObserver`)."""
        return all(getattr(o, "takes_late_events", False) for o in self._observers)

    def reduction_started(self, step: int, at: float | None = None) -> None:
        """Tell every observer (:meth:`StepObserver.reduction_started`; ``at`` only
        when given, to observers that take late events)."""
        for observer in self._observers:
            if at is None:
                observer.reduction_started(step)
            else:
                observer.reduction_started(step, at=at)

    def reduction_finished(self, step: int, at: float | None = None) -> None:
        """Tell every observer (:meth:`StepObserver.reduction_finished`)."""
        for observer in self._observers:
            if at is None:
                observer.reduction_finished(step)
            else:
                observer.reduction_finished(step, at=at)

    def step_finished(self, step: int, applied: bool) -> None:
        """Tell every observer (:meth:`StepObserver.step_finished`)."""
        for observer in self._observers:
            observer.step_finished(step, applied)


step_observers = StepObservers()
"""The process's observers of every adapter's averaged step over the whole job."""
_UNOBSERVED = StepObservers()


def observers_of(group_size: int, job_size: int) -> StepObservers:
    """Whom a reduction over ``group_size`` of the job's ``job_size`` workers tells:
    :data:`step_observers` when it spans the job, nobody for a process set's (its steps
    are not every rank's, and an observer such as the step timing pairs its own
    collective across every rank at a step they count alike)."""
    return step_observers if group_size == job_size else _UNOBSERVED
