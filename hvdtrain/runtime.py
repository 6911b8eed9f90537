"""Process-level defaults every adapter applies in its ``init()``, framework-free.

Horovod warns about a stalled collective after 60 s and, by default, waits forever:
a rank that skips a collective (a rank-dependent code path) hangs the whole job.
hvdtrain's defaults turn that into a report naming the tensor and the missing ranks
after :data:`RUNTIME_DEFAULTS` ``HOROVOD_STALL_CHECK_TIME_SECONDS`` and a shutdown
(an error on every rank, so the launcher ends the job) after
``HOROVOD_STALL_SHUTDOWN_TIME_SECONDS``. Override either by setting the variable, or
with ``horovodrun --stall-check-warning-time-seconds N
--stall-check-shutdown-time-seconds M``; ``--no-stall-check`` turns the check off.
"""

from __future__ import annotations

import os
import sys

RUNTIME_DEFAULTS = {
    "HOROVOD_STALL_CHECK_TIME_SECONDS": "20",
    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "40",
}
# This process's rank as horovodrun (Gloo), Open MPI, MPICH/Intel MPI and PMIx launchers set it.
_LAUNCHER_RANK_VARIABLES = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")


def apply_runtime_defaults() -> None:
    """Set hvdtrain's Horovod defaults, leaving any variable the user already set."""
    for name, value in RUNTIME_DEFAULTS.items():
        os.environ.setdefault(name, value)


def launcher_rank() -> int | None:
    """This process's rank as its launcher set it (before any init), or None without one."""
    for name in _LAUNCHER_RANK_VARIABLES:
        if name in os.environ:
            return int(os.environ[name])
    return None


def under_launcher() -> bool:
    """True when a launcher (horovodrun, mpirun, srun with PMI) started this process."""
    return launcher_rank() is not None


def announce_single_worker() -> None:
    """Print the one-line notice a run without a launcher gets (it trains as size 1)."""
    if not under_launcher():
        print("hvdtrain: no launcher (horovodrun/mpirun) detected; running as a single worker",
              file=sys.stderr, flush=True)


def init_horovod(horovod_module, comm=None, process_sets=None) -> None:
    """``horovod_module.init(comm, process_sets)`` with hvdtrain's defaults and notice.

    ``comm`` is Horovod's: None (every process), a list of ranks, or an mpi4py
    communicator (for several independent data-parallel groups in one job).
    """
    apply_runtime_defaults()
    horovod_module.init(comm=comm, process_sets=process_sets)
    announce_single_worker()
    report_failures_as_rank(horovod_module.rank())


def report_failures_as_rank(rank: int) -> None:
    """Make an uncaught exception end with one line naming this rank and the cause.

    Launchers name the first process to *exit*, which is often a healthy rank whose
    collective was cut short; this line says which rank actually failed, and marks
    the ranks that only stopped because another one did.
    """
    previous = sys.excepthook

    def report(kind, error, traceback) -> None:
        previous(kind, error, traceback)
        if kind.__name__ == "HorovodInternalError":
            line = (f"hvdtrain: rank {rank} stopped because another rank failed or left "
                    "(its own message names it)")
        else:
            line = f"hvdtrain: rank {rank} failed: {kind.__name__}: {error}"
        print(line, file=sys.stderr, flush=True)

    sys.excepthook = report
