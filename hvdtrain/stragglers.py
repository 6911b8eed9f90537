"""Where the step's time goes on each rank, and which rank holds the others up
(framework-free).

The allreduce evens out the ranks' step times: every rank leaves it when the last one
has arrived, so a slow rank cannot be told from its step time. What differs is how long
each rank *computed* before it entered the reduction (data, forward, backward and the
update: everything outside the reduction) and how long it then waited. Over a window of
steps :mod:`hvdtrain.step_timing` measures, per rank, the compute and the reduction
time per step; from them:

- the communication per step is the shortest reduction of any rank (the last rank to
  arrive hardly waits: its reduction is the transfer itself);
- a rank's wait per step is its reduction time less that communication;
- the straggler is the rank with the most compute, when it exceeds the median of the
  other ranks' compute by at least :data:`EXCESS_SHARE` of it and by at least
  :data:`MIN_EXCESS_SECONDS` (smaller differences are the noise of a busy host).

A pure function builds the report line (:func:`straggler_line`), and
:class:`StragglerReport` prints it and appends the JSON records of
``HVDTRAIN_METRICS_FILE`` on rank 0.

Example::

    >>> window = TimingWindow(ranks=(RankTimes(0, "a", 0.020, 0.021, 100),
    ...                              RankTimes(1, "b", 0.041, 0.0005, 100)),
    ...                       world_size=2, seconds=6.2, time=0.0)
    >>> straggler = find_straggler(window)
    >>> straggler.rank, round(straggler.excess_s * 1e3, 1), round(straggler.share_of_step, 2)
    (1, 21.0, 0.5)
    >>> straggler_line(straggler)[:60]
    'hvdtrain: rank 1 (b) is the straggler: 41.0 ms of compute pe'
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TextIO

EXCESS_SHARE = 0.2
"""A straggler computes at least this share more than the other ranks' median."""
MIN_EXCESS_SECONDS = 0.001
"""... and at least this much more per step."""


@dataclass(frozen=True)
class RankTimes:
    """One rank's time per step over a window.

    Attributes:
        rank: the rank.
        host: its host name ("?" when unknown).
        compute_s: seconds per step from leaving one reduction to entering the next.
        reduction_s: seconds per step from entering the reduction to its result.
        steps: the reductions it took part in during the window.
        samples_per_step: the samples it trains on per step (0: not given).
    """

    rank: int
    host: str
    compute_s: float
    reduction_s: float
    steps: int
    samples_per_step: float = 0.0


@dataclass(frozen=True)
class TimingWindow:
    """Every rank's times over one window, the same on every rank (they are exchanged).

    Attributes:
        ranks: the ranks that took part (a rank that has called ``join()`` has not).
        world_size: the job's number of ranks.
        seconds: how long the window lasted.
        time: when it ended (seconds since the epoch).
    """

    ranks: tuple[RankTimes, ...]
    world_size: int
    seconds: float
    time: float

    @property
    def communication_s(self) -> float:
        """The reduction's own time per step: the shortest reduction of any rank."""
        return min(times.reduction_s for times in self.ranks)

    def wait_s(self, times: RankTimes) -> float:
        """How long ``times``' rank waited per step for the others to arrive."""
        return times.reduction_s - self.communication_s

    @property
    def step_s(self) -> float:
        """The median rank's compute plus reduction per step."""
        return statistics.median(t.compute_s + t.reduction_s for t in self.ranks)

    @property
    def steps(self) -> int:
        """The steps in the window."""
        return max(times.steps for times in self.ranks)

    @property
    def steps_per_second(self) -> float:
        """Steps per second over the window."""
        return self.steps / self.seconds if self.seconds > 0 else 0.0

    @property
    def samples_per_second(self) -> float | None:
        """Samples per second over every rank, or None when a rank did not say its batch
        (:func:`hvdtrain.step_timing.set_samples_per_step`)."""
        if any(times.samples_per_step <= 0 for times in self.ranks):
            return None
        return self.steps_per_second * sum(times.samples_per_step for times in self.ranks)

    def record(self) -> dict[str, Any]:
        """The window as one JSON object (a line of ``HVDTRAIN_METRICS_FILE``); times in
        milliseconds per step."""
        straggler = find_straggler(self)
        return {
            "time": round(self.time, 3),
            "seconds": round(self.seconds, 3),
            "world_size": self.world_size,
            "steps": self.steps,
            "steps_per_second": round(self.steps_per_second, 3),
            "samples_per_second": (None if self.samples_per_second is None
                                   else round(self.samples_per_second, 1)),
            "step_ms": _ms(self.step_s),
            "communication_ms": _ms(self.communication_s),
            "ranks": [{"rank": t.rank, "host": t.host, "compute_ms": _ms(t.compute_s),
                       "wait_ms": _ms(self.wait_s(t)), "reduction_ms": _ms(t.reduction_s),
                       "steps": t.steps} for t in self.ranks],
            "straggler": None if straggler is None else straggler.rank,
        }

    def scalars(self, per_rank: bool = False) -> dict[str, float]:
        """The window as named numbers for a metrics logger (Keras's ``logs``,
        TensorBoard), in milliseconds per step: the median rank's compute and wait, the
        communication, the slowest rank and its compute, and ``straggler`` (the named
        rank, -1 when none); with ``per_rank``, every rank's compute and wait too."""
        straggler = find_straggler(self)
        slowest = max(self.ranks, key=lambda times: times.compute_s)
        numbers = {
            "step_compute_ms": _ms(statistics.median(t.compute_s for t in self.ranks)),
            "step_wait_ms": _ms(statistics.median(self.wait_s(t) for t in self.ranks)),
            "step_communication_ms": _ms(self.communication_s),
            "slowest_rank": float(slowest.rank),
            "slowest_compute_ms": _ms(slowest.compute_s),
            "straggler": float(-1 if straggler is None else straggler.rank),
        }
        if per_rank:
            for times in self.ranks:
                numbers[f"rank{times.rank}_compute_ms"] = _ms(times.compute_s)
                numbers[f"rank{times.rank}_wait_ms"] = _ms(self.wait_s(times))
        return numbers

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> TimingWindow:
        """The window a :meth:`record` describes (as read back from the file)."""
        return cls(ranks=tuple(RankTimes(rank=r["rank"], host=r["host"],
                                         compute_s=r["compute_ms"] / 1e3,
                                         reduction_s=r["reduction_ms"] / 1e3, steps=r["steps"])
                               for r in record["ranks"]),
                   world_size=record["world_size"], seconds=record["seconds"],
                   time=record["time"])


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 3)


@dataclass(frozen=True)
class Straggler:
    """The rank that holds the others up, and what it costs them.

    Attributes:
        rank, host: which rank, where.
        compute_s: its compute per step.
        others_compute_s: the median of the other ranks' compute per step.
        others_wait_s: the median of the other ranks' wait per step.
        step_s: the step time (:attr:`TimingWindow.step_s`).
    """

    rank: int
    host: str
    compute_s: float
    others_compute_s: float
    others_wait_s: float
    step_s: float

    @property
    def excess_s(self) -> float:
        """How much longer it computes per step than the other ranks' median."""
        return self.compute_s - self.others_compute_s

    @property
    def share_of_step(self) -> float:
        """The others' wait for it as a share of the step."""
        return self.others_wait_s / self.step_s if self.step_s > 0 else 0.0


def find_straggler(window: TimingWindow) -> Straggler | None:
    """The rank computing noticeably longer than the others (see the module's rule), or
    None: all even, or fewer than two ranks in the window."""
    if len(window.ranks) < 2:
        return None
    slowest = max(window.ranks, key=lambda times: times.compute_s)
    others = [times for times in window.ranks if times is not slowest]
    others_compute = statistics.median(times.compute_s for times in others)
    excess = slowest.compute_s - others_compute
    if excess < max(EXCESS_SHARE * others_compute, MIN_EXCESS_SECONDS):
        return None
    return Straggler(rank=slowest.rank, host=slowest.host, compute_s=slowest.compute_s,
                     others_compute_s=others_compute,
                     others_wait_s=statistics.median(window.wait_s(t) for t in others),
                     step_s=window.step_s)


def straggler_line(straggler: Straggler, over: str = "") -> str:
    """The report's line for ``straggler``; ``over`` says the span (", over the whole
    run"), appended as is."""
    return (f"hvdtrain: rank {straggler.rank} ({straggler.host}) is the straggler: "
            f"{straggler.compute_s * 1e3:.1f} ms of compute per step against a median of "
            f"{straggler.others_compute_s * 1e3:.1f} ms for the other ranks; the other ranks "
            f"wait {straggler.others_wait_s * 1e3:.1f} ms per step for it "
            f"({straggler.share_of_step * 100:.0f} % of the step){over}")


def merge(windows: list[TimingWindow]) -> TimingWindow | None:
    """One window spanning ``windows`` (each rank's times weighted by its steps), or
    None when there are none; ranks missing from some windows count where present."""
    if not windows:
        return None
    by_rank: dict[int, list[RankTimes]] = {}
    for window in windows:
        for times in window.ranks:
            by_rank.setdefault(times.rank, []).append(times)
    merged = []
    for rank, parts in sorted(by_rank.items()):
        steps = sum(part.steps for part in parts)
        merged.append(RankTimes(
            rank=rank, host=parts[-1].host, steps=steps,
            compute_s=sum(p.compute_s * p.steps for p in parts) / max(steps, 1),
            reduction_s=sum(p.reduction_s * p.steps for p in parts) / max(steps, 1),
            samples_per_step=parts[-1].samples_per_step))
    return TimingWindow(ranks=tuple(merged), world_size=windows[-1].world_size,
                        seconds=sum(w.seconds for w in windows), time=windows[-1].time)


def read_records(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """The records of a metrics file, in order.

    Raises:
        ValueError: naming the line that is not a record.
    """
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                TimingWindow.from_record(record)
            except (ValueError, KeyError, TypeError) as error:
                raise ValueError(f"{path}, line {number}: not an hvdtrain metrics record "
                                 f"({error}); the file is written by training with "
                                 "HVDTRAIN_METRICS_FILE set") from None
            yield record


class StragglerReport:
    """Rank 0's report: a line per window with a straggler, a JSON record per window
    when ``metrics_path`` is given, and the line over the whole run at :meth:`finish`.

    Args:
        output: where the lines go (stderr).
        metrics_path: the JSON-lines file records are appended to, or None.
        lines: whether to print straggler lines at all.
    """

    def __init__(self, *, output: TextIO | None = None,
                 metrics_path: str | os.PathLike[str] | None = None, lines: bool = True) -> None:
        self._output = output
        self._metrics_path = metrics_path
        self._lines = lines
        self._windows: list[TimingWindow] = []

    def window(self, window: TimingWindow) -> None:
        """Report one window (called once per interval)."""
        if self._windows and self._windows[-1].world_size != window.world_size:
            self._windows = []  # an elastic reset: the run goes on with other ranks
        self._windows.append(window)
        straggler = find_straggler(window)
        if straggler is not None and self._lines:
            self._print(straggler_line(straggler, f", over the last {window.seconds:.0f} s"))
        if self._metrics_path is not None:
            with open(self._metrics_path, "a", encoding="utf-8") as file:
                file.write(json.dumps(window.record()) + "\n")

    def finish(self) -> None:
        """Print the line over every window reported so far, if a rank held the others
        up (at the end of training)."""
        run = merge(self._windows)
        straggler = None if run is None else find_straggler(run)
        if straggler is not None and self._lines:
            self._print(straggler_line(
                straggler, f", over {run.seconds:.0f} s of training ({run.steps} steps)"))

    def _print(self, line: str) -> None:
        print(line, file=self._output or sys.stderr, flush=True)
