"""Per-rank step timing, on by default in every adapter (framework-free).

Every adapter's ``init()`` starts a :class:`StepTimer`, one of the averaged step's
observers (:data:`hvdtrain.step_events.step_observers`). On each rank it measures the
compute of each step (from leaving one reduction to entering the next) and the
reduction (entering it until the averaged gradients are back), as sums over a window.
Every so many steps the ranks exchange those sums in one small allreduce (a few numbers
per rank), from which each rank holds the same :class:`~hvdtrain.stragglers.TimingWindow`
and rank 0 reports (:class:`~hvdtrain.stragglers.StragglerReport`). The exchange rides on
no gradient; it is the only collective added, about once per report interval, and it is
an allreduce because a rank that has called ``join()`` takes part in allreduces with
zeros (Horovod refuses an allgather then).

Every rank must exchange at the same step, so the ranks count reductions and agree on
when the next exchange comes from the numbers of the last one, which all of them hold.
The first :data:`SETTLING_STEPS` reductions after a start, a ``join()`` or an elastic
reset are not timed (tracing, warm-up); their exchange also carries the host names.

Settings (the same on every rank):

- ``HVDTRAIN_STRAGGLER_REPORT_SECONDS``: the window, and so the report's interval
  (default 60); 0 turns the straggler lines off;
- ``HVDTRAIN_METRICS_FILE``: rank 0 appends each window's JSON record there
  (``hvdtrain report FILE`` reads it). With the lines off and no file, no timer starts.

Example::

    >>> pack(rank=1, size=2, numbers=[3.0, 0.5], host=None)
    [0.0, 0.0, 3.0, 0.5]
"""

from __future__ import annotations

import atexit
import math
import os
import socket
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from hvdtrain.collective import Collective
from hvdtrain.step_events import step_observers
from hvdtrain.stragglers import RankTimes, StragglerReport, TimingWindow

REPORT_SECONDS_VARIABLE = "HVDTRAIN_STRAGGLER_REPORT_SECONDS"
METRICS_FILE_VARIABLE = "HVDTRAIN_METRICS_FILE"
DEFAULT_REPORT_SECONDS = 60.0
SETTLING_STEPS = 3
"""Reductions after a start, join or reset that are not timed."""
HOST_BYTES = 64
"""The bytes of each rank's host name that the first exchange carries."""

SumNumbers = Callable[[list[float], str], list[float]]
"""An adapter's sum over every rank of a list of float64 numbers, in one allreduce
named by the second argument."""

# What each rank sends per exchange, in this order.
_COMPUTE_STEPS, _COMPUTE_S, _REDUCTIONS, _REDUCTION_S, _SAMPLES, _ELAPSED_S = range(6)
_NUMBERS = 6


@dataclass(frozen=True)
class TimingSettings:
    """What the environment asks of the timing.

    Attributes:
        window_s: the window's length in seconds (the report's interval).
        lines: whether rank 0 prints straggler lines.
        metrics_path: where rank 0 appends each window's record, or None.
    """

    window_s: float
    lines: bool
    metrics_path: str | None

    @property
    def enabled(self) -> bool:
        """Whether anything is reported, and so whether a timer runs at all."""
        return self.lines or self.metrics_path is not None

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ) -> TimingSettings:
        """The settings from ``HVDTRAIN_STRAGGLER_REPORT_SECONDS`` and
        ``HVDTRAIN_METRICS_FILE``.

        Raises:
            ValueError: when the interval is not a number of seconds >= 0.
        """
        text = environ.get(REPORT_SECONDS_VARIABLE, str(DEFAULT_REPORT_SECONDS))
        try:
            seconds = float(text)
        except ValueError:
            seconds = -1.0
        if not 0 <= seconds < math.inf:
            raise ValueError(f"{REPORT_SECONDS_VARIABLE}={text!r} is not a number of seconds "
                             f">= 0; set it to e.g. {DEFAULT_REPORT_SECONDS:g}, or 0 to turn "
                             "the straggler report off")
        return cls(window_s=seconds or DEFAULT_REPORT_SECONDS, lines=seconds > 0,
                   metrics_path=environ.get(METRICS_FILE_VARIABLE) or None)


def pack(rank: int, size: int, numbers: Sequence[float], host: str | None) -> list[float]:
    """The vector this rank adds to the exchange: ``numbers`` (then the bytes of ``host``,
    when given) in its own slot, zeros in the others' (the sum is every rank's)."""
    slot = [float(n) for n in numbers]
    if host is not None:
        encoded = host.encode("utf-8")[:HOST_BYTES]
        slot += [float(b) for b in encoded] + [0.0] * (HOST_BYTES - len(encoded))
    return [0.0] * (rank * len(slot)) + slot + [0.0] * ((size - rank - 1) * len(slot))


def unpack(summed: Sequence[float], size: int, hosts: bool
           ) -> list[tuple[list[float], str | None]]:
    """Each rank's numbers (and host, when ``hosts``) from the exchange's sum."""
    per_rank = len(summed) // size
    slots = [list(summed[r * per_rank:(r + 1) * per_rank]) for r in range(size)]
    if not hosts:
        return [(slot, None) for slot in slots]
    return [(slot[:-HOST_BYTES], bytes(int(b) for b in slot[-HOST_BYTES:] if b)
             .decode("utf-8", "replace") or None) for slot in slots]


def this_host(environ: Mapping[str, str] = os.environ) -> str:
    """This rank's host as the launcher names it (``horovodrun -H``'s names, which
    ``HOROVOD_HOSTNAME`` carries), or the machine's name where that says only
    "localhost" or is not set (``mpirun``, ``srun``)."""
    named = environ.get("HOROVOD_HOSTNAME", "")
    return named if named not in ("", "localhost", "127.0.0.1") else socket.gethostname()


def steps_until(seconds: float, per_step_s: float) -> int:
    """How many steps of ``per_step_s`` cover ``seconds`` (at least 1)."""
    if per_step_s <= 0:
        return 1
    return max(1, math.ceil(seconds / per_step_s))


class StepTimer:
    """A step observer timing this rank's compute and reduction, exchanging them with
    the other ranks once per window (see the module).

    Args:
        collective: the workers (their rank and number, read at each exchange, so an
            elastic reset is followed).
        sum_numbers: the adapter's allreduce of a few float64 numbers.
        settings: the window and what rank 0 reports.
        report: rank 0's report (made from ``settings`` when None).
        clock: a monotonic clock in seconds; ``wall``: the time of day (for records).
        host: this rank's host name (:func:`this_host` when None).
    """

    def __init__(self, collective: Collective, sum_numbers: SumNumbers,
                 settings: TimingSettings, *, report: StragglerReport | None = None,
                 clock: Callable[[], float] = time.perf_counter,
                 wall: Callable[[], float] = time.time, host: str | None = None) -> None:
        self._collective = collective
        self._sum_numbers = sum_numbers
        self.settings = settings
        self.report = report or StragglerReport(metrics_path=settings.metrics_path,
                                                lines=settings.lines)
        self._clock = clock
        self._wall = wall
        self._host = host or this_host()
        self.samples_per_step = 0.0
        self.latest: TimingWindow | None = None
        """The last complete window, the same on every rank (None before the first)."""
        self._hosts: list[str] | None = None
        self.restart(new_workers=True)

    def restart(self, *, new_workers: bool = False) -> None:
        """Start counting anew, as every rank does after a ``join()`` (all at once) or an
        elastic reset (``new_workers``: the ranks' hosts are asked again)."""
        if new_workers:
            self._hosts = None
        self._reductions = 0
        self._next_exchange = SETTLING_STEPS
        self._settled = False
        self._entered: float | None = None
        self._left: float | None = None
        self._clear_window()

    takes_late_events = True
    """Events may come late with their times (:class:`hvdtrain.step_events.StepObserver`)."""

    def resume(self) -> None:
        """Time passed unobserved (:func:`paused`): the next step's compute is not timed."""
        self._entered = self._left = None

    def _clear_window(self, now: float | None = None) -> None:
        self._sums = [0.0] * _NUMBERS
        self._window_started = self._clock() if now is None else now

    def reduction_started(self, step: int, at: float | None = None) -> None:
        """Close this step's compute
        (:meth:`hvdtrain.step_events.StepObserver.reduction_started`)."""
        now = self._clock() if at is None else at
        if self._left is not None:
            self._sums[_COMPUTE_STEPS] += 1
            self._sums[_COMPUTE_S] += now - self._left
        self._entered = now

    def reduction_finished(self, step: int, at: float | None = None) -> None:
        """Close this step's reduction; exchange when the window's step has come."""
        now = self._clock() if at is None else at
        if self._entered is not None:
            self._sums[_REDUCTIONS] += 1
            self._sums[_REDUCTION_S] += now - self._entered
            self._entered = None
        self._reductions += 1
        if self._reductions >= self._next_exchange:
            self._exchange(now)
            if at is None:  # told as it happens: the exchange is not the next compute
                now = self._clock()
        self._left = now

    def step_finished(self, step: int, applied: bool) -> None:
        """Nothing: the compute runs on until the next reduction."""

    def _exchange(self, now: float) -> None:
        rank, size = self._collective.rank(), self._collective.size()
        with_hosts = self._hosts is None or len(self._hosts) != size
        mine = [*self._sums]
        mine[_SAMPLES] = self.samples_per_step
        mine[_ELAPSED_S] = now - self._window_started
        summed = self._sum_numbers(pack(rank, size, mine, self._host if with_hosts else None),
                                   "hvdtrain.step_times" + (".hosts" if with_hosts else ""))
        slots = unpack(summed, size, with_hosts)
        if with_hosts:
            self._hosts = [host or "?" for _, host in slots]
        ranks = tuple(RankTimes(
            rank=r, host=self._hosts[r], steps=int(n[_REDUCTIONS]),
            compute_s=n[_COMPUTE_S] / n[_COMPUTE_STEPS] if n[_COMPUTE_STEPS] else 0.0,
            reduction_s=n[_REDUCTION_S] / n[_REDUCTIONS], samples_per_step=n[_SAMPLES])
            for r, (n, _) in enumerate(slots) if n[_REDUCTIONS] > 0)
        if not ranks:  # no rank timed a reduction since the window began (a pause)
            self._next_exchange = self._reductions + 1
            return
        window = TimingWindow(ranks=ranks, world_size=size, time=self._wall(),
                              seconds=max(n[_ELAPSED_S] for n, _ in slots))
        per_step_s = window.seconds / max(window.steps, 1)
        if not self._settled:  # the settling steps are dropped
            self._settled = True
            self._clear_window(now)
            self._next_exchange = self._reductions + steps_until(self.settings.window_s,
                                                                 per_step_s)
            return
        if window.seconds < self.settings.window_s:
            self._next_exchange = self._reductions + steps_until(
                self.settings.window_s - window.seconds, per_step_s)
            return
        self.latest = window
        if rank == 0:
            self.report.window(window)
        self._clear_window(now)
        self._next_exchange = self._reductions + steps_until(self.settings.window_s,
                                                             per_step_s)


_timer: StepTimer | None = None
_stop: Callable[[], None] | None = None


def start(collective: Collective, sum_numbers: SumNumbers,
          environ: Mapping[str, str] = os.environ) -> StepTimer | None:
    """Time every averaged step from now on (each adapter's ``init()`` calls this),
    unless the environment turns the report off; returns the timer, or None."""
    global _timer, _stop
    stop()
    settings = TimingSettings.from_environment(environ)
    if not settings.enabled:
        return None
    _timer = StepTimer(collective, sum_numbers, settings)
    _stop = step_observers.add(_timer)
    return _timer


def stop() -> None:
    """Stop timing (the report's end line is still printed at exit)."""
    global _timer, _stop
    if _stop is not None:
        _stop()
    _timer, _stop = None, None


@contextmanager
def paused() -> Iterator[None]:
    """Time no step inside (every rank must pause around the same steps: the ranks count
    the steps they time alike). In a TensorFlow graph what is traced while paused is
    never timed: the timing adds its calls to a graph only while it runs."""
    global _stop
    if _timer is None or _stop is None:
        yield
        return
    _stop()
    try:
        yield
    finally:
        _stop = step_observers.add(_timer)
        _timer.resume()


def restart(*, new_workers: bool = False) -> None:
    """Start the window anew on this rank (every rank does it at the same point: after
    ``join()`` returns, after an elastic reset with ``new_workers``)."""
    if _timer is not None:
        _timer.restart(new_workers=new_workers)


def step_times() -> TimingWindow | None:
    """The last complete window of the running timer (identical on every rank), or None
    (no timer, or no window complete yet)."""
    return None if _timer is None else _timer.latest


def set_samples_per_step(samples: float) -> None:
    """Tell the timer how many samples this rank trains on per step (its batch), so the
    records carry samples per second."""
    if not samples > 0:
        raise ValueError(f"samples per step must be > 0 (this rank's batch size), got "
                         f"{samples!r}")
    if _timer is not None:
        _timer.samples_per_step = float(samples)


def _finish_report() -> None:
    if _timer is not None:
        _timer.report.finish()


atexit.register(_finish_report)
