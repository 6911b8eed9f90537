"""The events of every averaged step and who observes them: where features that watch
training (the step timing of :mod:`hvdtrain.step_timing`, reports) plug in once for
every adapter (framework-free).

Each adapter tells :data:`step_observers` when a step's reduction starts and finishes
and when the step is over: the torch optimizer, the Keras optimizer
(``adapters/keras/step_events.py``, through the traced graph on TensorFlow),
``DistributedGradientTape`` and NumPy's ``DistributedSGD``. A process set's reductions
are left out (:func:`observers_of`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


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
