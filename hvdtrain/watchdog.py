"""A watchdog that ends a worker whose collective never completes, instead of hanging.

Horovod's stall check (:mod:`hvdtrain.runtime`) covers a rank that skips a collective
under MPI only: under Gloo, Horovod 0.28.1's stall inspector never runs while a tensor
waits. And nothing in Horovod or MPI notices a network that stops delivering: the
ranks stay blocked in the transport for good. So every adapter's ``init()`` starts
this watchdog (when there is more than one worker): a daemon thread that watches the
waits entered with :func:`guard`. When one lasts longer than the limit, it prints
what this rank waited for and on which ranks, then the Python stack of every thread,
and ends the process with exit code :data:`EXIT_CODE`; the launcher then stops the
other ranks.

The torch and NumPy adapters guard their own waits (gradient allreduces, broadcasts,
agreement checks), as do the Keras adapters for their eager collectives; ``model.fit``
steps need the ``hvk.CollectiveWatchdog()`` callback;
anything else, such as a custom TensorFlow training step, can be wrapped::

    from hvdtrain import watchdog

    with watchdog.guard("train step"):
        loss = train_step(x, y)

The limit is ``HVDTRAIN_COLLECTIVE_TIMEOUT_SECONDS`` (default 45; ``0`` turns the
watchdog off). It must exceed the longest time one rank can legitimately wait for the
others, e.g. while rank 0 alone evaluates or writes a checkpoint. The default is
longer than Horovod's stall check with hvdtrain's defaults (:mod:`hvdtrain.runtime`), so
that under MPI Horovod's report of the missing ranks comes first, and short enough
that a stalled job ends within a minute (docs/failures.md).
"""

from __future__ import annotations

import faulthandler
import itertools
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TextIO

TIMEOUT_VARIABLE = "HVDTRAIN_COLLECTIVE_TIMEOUT_SECONDS"
DEFAULT_TIMEOUT_SECONDS = 45.0
EXIT_CODE = 124

Description = str | Callable[[], str]


def timeout_seconds() -> float:
    """The limit from ``HVDTRAIN_COLLECTIVE_TIMEOUT_SECONDS`` (0 means off)."""
    text = os.environ.get(TIMEOUT_VARIABLE, str(DEFAULT_TIMEOUT_SECONDS))
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"{TIMEOUT_VARIABLE}={text!r} is not a number of seconds >= 0; "
                         f"set it to e.g. {DEFAULT_TIMEOUT_SECONDS:g}, or 0 to turn the "
                         "watchdog off")
    return value


class Watchdog:
    """Watches the waits entered with :meth:`guard` and ends the process when one
    outlasts ``timeout_s``. Use the module's :func:`start` and :func:`guard`; this class
    is public for tests and for embedding with a custom ``on_expiry``."""

    def __init__(self, rank: int, size: int, timeout_s: float, *, poll_s: float = 0.5,
                 stream: TextIO | None = None,
                 on_expiry: Callable[[], None] = lambda: os._exit(EXIT_CODE),
                 on_report: Callable[[str], None] | None = None) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0 seconds, got {timeout_s}")
        self.rank, self.size, self.timeout_s = rank, size, timeout_s
        self._poll_s = poll_s
        self._stream = stream
        self._on_expiry = on_expiry
        self._on_report = on_report
        self._waits: dict[int, tuple[Description, float]] = {}
        self._tokens = itertools.count()
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="hvdtrain-watchdog",
                                        daemon=True)
        self._thread.start()

    @contextmanager
    def guard(self, what: Description) -> Iterator[None]:
        """Count the block as a wait for the other ranks, described by ``what`` (a
        string, or a function returning one, called only if the wait is reported)."""
        token = next(self._tokens)
        with self._lock:
            self._waits[token] = (what, time.monotonic())
        try:
            yield
        finally:
            with self._lock:
                del self._waits[token]

    def stop(self) -> None:
        """Stop watching (the thread ends within one poll interval)."""
        self._stopped.set()

    def oldest_wait(self) -> tuple[Description, float] | None:
        """The longest-running wait: its description and how long it has lasted."""
        with self._lock:
            if not self._waits:
                return None
            what, since = min(self._waits.values(), key=lambda wait: wait[1])
        return what, time.monotonic() - since

    def report(self, what: Description, waited_s: float) -> str:
        """The message printed when ``what`` has waited ``waited_s`` seconds."""
        description = what() if callable(what) else what
        others = [r for r in range(self.size) if r != self.rank]
        missing = (f"rank {others[0]}" if len(others) == 1
                   else f"at least one of ranks {', '.join(map(str, others))}")
        return (
            f"hvdtrain: rank {self.rank} of {self.size} waited {waited_s:.0f} s (limit "
            f"{self.timeout_s:g} s) for {description}; {missing} did not complete it. "
            f"Either that rank skipped this collective (a rank-dependent code path), died "
            f"or hung, or the network between the workers stopped delivering. Ending rank "
            f"{self.rank} so that the launcher stops the job; raise {TIMEOUT_VARIABLE} if "
            f"the wait is legitimate (e.g. rank 0 alone evaluating or saving)."
        )

    def _watch(self) -> None:
        while not self._stopped.wait(self._poll_s):
            oldest = self.oldest_wait()
            if oldest is not None and oldest[1] > self.timeout_s:
                self._expire(*oldest)
                return

    def _expire(self, what: Description, waited_s: float) -> None:
        stream = self._stream or sys.stderr
        report = self.report(what, waited_s)
        print(report, file=stream, flush=True)
        if self._on_report is not None:
            try:
                self._on_report(report)
            except Exception as error:  # the process must still end
                print(f"hvdtrain: could not forward the watchdog's report: {error}",
                      file=stream, flush=True)
        print(f"hvdtrain: the Python stacks of rank {self.rank}:", file=stream, flush=True)
        faulthandler.dump_traceback(file=stream, all_threads=True)
        stream.flush()
        self._on_expiry()


_active: Watchdog | None = None
_report_sink: Callable[[str], None] | None = None


def forward_reports(sink: Callable[[str], None] | None) -> None:
    """Also hand this process's watchdog report to ``sink`` before the process ends
    (hvdtrain.jobs.ray sends it to the driver); takes effect at the next :func:`start`."""
    global _report_sink
    _report_sink = sink


def start(rank: int, size: int) -> None:
    """Start (or restart, after a re-init) this process's watchdog; adapters call it
    from ``init()``. Nothing runs for a single worker or with the limit set to 0."""
    global _active
    if _active is not None:
        _active.stop()
        _active = None
    limit = timeout_seconds()
    if size > 1 and limit > 0:
        _active = Watchdog(rank, size, limit, on_report=_report_sink)


def guard(what: Description) -> AbstractContextManager[None]:
    """A context manager that counts its block as a wait for the other ranks (see the
    module docstring); does nothing when the watchdog is not running."""
    return _active.guard(what) if _active is not None else nullcontext()
