"""Process-level defaults every adapter applies in its ``init()`` (before MPI starts),
framework-free.

Horovod warns about a stalled collective after 60 s and, by default, waits forever:
a rank that skips a collective (a rank-dependent code path) hangs the whole job.
hvdtrain's defaults turn that into a report naming the tensor and the missing ranks
after :data:`RUNTIME_DEFAULTS` ``HOROVOD_STALL_CHECK_TIME_SECONDS`` and a shutdown
(an error on every rank, so the launcher ends the job) after
``HOROVOD_STALL_SHUTDOWN_TIME_SECONDS``. Override either by setting the variable, or
with ``horovodrun --stall-check-warning-time-seconds N
--stall-check-shutdown-time-seconds M``; ``--no-stall-check`` turns the check off.

Horovod runs its check once per check time and its shutdown comes later than the
setting, so :mod:`hvdtrain.watchdog` usually ends the job; under Gloo the check never
runs, and only the watchdog does. docs/failures.md has the timings.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from hvdtrain import allocator, horovod_patches, watchdog

RUNTIME_DEFAULTS = {
    "HOROVOD_STALL_CHECK_TIME_SECONDS": "10",
    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "30",
    # Speed (benchmarks/README.md). Open MPI's waits spin on the core by default; a rank's
    # background thread spinning for the other rank takes that core from its own backward
    # pass whenever the ranks have no spare core. Yielding leaves it to the compute.
    "OMPI_MCA_mpi_yield_when_idle": "1",
}
# Only on a Horovod with hvdtrain's idle-wait patch (scripts/patches/horovod/
# 0002-idle-wait.patch, hvdtrain.horovod_patches): with nothing to send, the background
# thread sleeps until a tensor arrives (at most this many ms) instead of synchronising
# with every other rank each cycle.
IDLE_WAIT_DEFAULTS = {"HVDTRAIN_IDLE_WAIT_MS": "100"}
# Only where no accelerator is visible, and only with the idle wait. With it an idle rank
# runs no cycles, so the cycle time only paces the negotiation of tensors already sent:
# a short one answers sooner (benchmarks/README.md). Without it a 0.1 ms cycle would
# make an idle rank synchronise ten times as often (measured under Gloo on a build
# without the patch: 1.14 s of CPU per idle 3 s against 0.15 s at 1 ms). On GPUs, where
# allreduces overlap the backward pass and the cycle decides how many gradients are
# fused together, Horovod's 1 ms stays.
CPU_ONLY_DEFAULTS = {"HOROVOD_CYCLE_TIME": "0.1"}
# Only in elastic jobs (Gloo). When a worker dies, a survivor whose Gloo receive was
# waiting on a live peer (not the dead one) notices only when the receive times out,
# 30 s by default: that wait is the whole time to recover (docs/elastic.md).
# Horovod's Gloo collectives run only once every rank is ready, so a
# healthy receive takes milliseconds; the rendezvous that admits a new worker is not
# bound by it.
ELASTIC_DEFAULTS = {"HOROVOD_GLOO_TIMEOUT_SECONDS": "10"}
# Read by mpirun (and so by `horovodrun --mpi`) itself, so they must be in the
# launcher's environment: `eval "$(hvdtrain env)"` puts them there. Open MPI's daemons
# talk over TCP links whose default keepalive notices a dead network only after
# minutes; these make mpirun notice a lost host within a minute and end the job
# (docs/failures.md). A healthy but quiet job is unaffected: the
# peer's kernel answers the probes.
LAUNCHER_DEFAULTS = {
    "OMPI_MCA_oob_tcp_keepalive_time": "10",
    "OMPI_MCA_oob_tcp_keepalive_intvl": "5",
    "OMPI_MCA_oob_tcp_keepalive_probes": "3",
}
# This process's rank and the job's size as horovodrun (Gloo), Open MPI, MPICH/Intel MPI
# and PMIx launchers set them.
_LAUNCHER_RANK_VARIABLES = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
_LAUNCHER_SIZE_VARIABLES = ("HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


def runtime_defaults(accelerator: bool, idle_wait: bool, elastic: bool) -> dict[str, str]:
    """The defaults for a process: :data:`RUNTIME_DEFAULTS`, with the idle wait
    :data:`IDLE_WAIT_DEFAULTS` and, without an accelerator, :data:`CPU_ONLY_DEFAULTS`, and
    in an elastic job :data:`ELASTIC_DEFAULTS`.

    >>> runtime_defaults(accelerator=False, idle_wait=False, elastic=False) == RUNTIME_DEFAULTS
    True
    """
    return {**RUNTIME_DEFAULTS,
            **(IDLE_WAIT_DEFAULTS if idle_wait else {}),
            **(CPU_ONLY_DEFAULTS if idle_wait and not accelerator else {}),
            **(ELASTIC_DEFAULTS if elastic else {})}


def apply_runtime_defaults(accelerator: bool = True, idle_wait: bool = True) -> None:
    """Set hvdtrain's Horovod and MPI defaults (:func:`runtime_defaults`), leaving any
    variable the user already set, and keep freed memory in the process
    (:func:`hvdtrain.allocator.keep_freed_memory`).

    Args:
        accelerator: whether this process can see an accelerator (GPU).
        idle_wait: whether the installed Horovod carries hvdtrain's idle-wait patch
            (:func:`hvdtrain.horovod_patches.has_patch`).
    """
    defaults = runtime_defaults(accelerator, idle_wait, elastic_job())
    for name, value in defaults.items():
        os.environ.setdefault(name, value)
    allocator.keep_freed_memory()


def missing_defaults(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """hvdtrain's runtime and launcher defaults that ``environ`` does not set yet."""
    return {name: value for name, value in {**RUNTIME_DEFAULTS, **LAUNCHER_DEFAULTS}.items()
            if name not in environ}


def launcher_rank() -> int | None:
    """This process's rank as its launcher set it (before any init), or None without one."""
    return _first_set(_LAUNCHER_RANK_VARIABLES)


def launcher_size() -> int | None:
    """How many processes the launcher started (before any init), or None without one."""
    return _first_set(_LAUNCHER_SIZE_VARIABLES)


def _first_set(names: tuple[str, ...]) -> int | None:
    for name in names:
        if name in os.environ:
            return int(os.environ[name])
    return None


def elastic_job(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether this process is a worker of a Horovod elastic job (``horovodrun`` with
    ``--min-np``/``--max-np`` or a host discovery script sets ``HOROVOD_ELASTIC=1``).

    In such a job a worker may join while the others train, so nothing at start-up
    may wait for all ranks: the elastic state's sync brings the newcomer in line.
    """
    return environ.get("HOROVOD_ELASTIC") == "1"


def under_launcher() -> bool:
    """True when a launcher (horovodrun, mpirun, srun with PMI) started this process."""
    return launcher_rank() is not None


def announce_single_worker() -> None:
    """Print the one-line notice a run without a launcher gets (it trains as size 1)."""
    if not under_launcher():
        print("hvdtrain: no launcher (horovodrun/mpirun) detected; running as a single worker",
              file=sys.stderr, flush=True)


def init_horovod(horovod_module, comm=None, process_sets=None, *,
                 accelerator: bool = True) -> None:
    """``horovod_module.init(comm, process_sets)`` with hvdtrain's defaults, notice and
    collective watchdog (:mod:`hvdtrain.watchdog`).

    ``comm`` is Horovod's: None (every process), a list of ranks, or an mpi4py
    communicator (for several independent data-parallel groups in one job).
    ``accelerator`` says whether the framework sees a GPU (:func:`apply_runtime_defaults`).
    On a Horovod without some of hvdtrain's patches, the defaults suit that build and
    each host's first worker says once what is missing (:mod:`hvdtrain.horovod_patches`).
    """
    global _horovod_finalized_mpi
    starts_horovod = not horovod_module.is_initialized()  # else Horovod's init() does nothing
    if _horovod_finalized_mpi and starts_horovod and uses_mpi():
        raise RuntimeError(MPI_REINIT_MESSAGE)
    apply_runtime_defaults(accelerator,
                           idle_wait=horovod_patches.has_patch(horovod_patches.IDLE_WAIT))
    watchdog.timeout_seconds()  # a malformed limit fails before any worker starts waiting
    mpi_started_before = mpi_started()
    horovod_module.init(comm=comm, process_sets=process_sets)
    if starts_horovod:  # Horovod finalizes at shutdown() an MPI it started itself
        _horovod_finalized_mpi = horovod_module.mpi_enabled() and not mpi_started_before
    announce_single_worker()
    horovod_patches.announce_missing(horovod_module.local_rank())
    report_failures_as_rank(horovod_module.rank())
    watchdog.start(horovod_module.rank(), horovod_module.size())


MPI_REINIT_MESSAGE = (
    "init() after shutdown() under MPI: Horovod started MPI in the first init() and "
    "finalized it at shutdown(), and MPI cannot start twice in one process. Start MPI "
    "yourself before the first init() (`from mpi4py import MPI`: Horovod then leaves it "
    "running and mpi4py finalizes it at exit), or launch with `horovodrun --gloo`")
# Set by init_horovod when Horovod started MPI itself, which its shutdown() finalizes
# (then a later init() would die in MPI).
_horovod_finalized_mpi = False


def uses_mpi(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether Horovod, built with MPI, will use it: as its controller (its default;
    ``horovodrun --gloo`` sets ``HOROVOD_CONTROLLER=gloo``) or for its CPU collectives."""
    return (environ.get("HOROVOD_CONTROLLER", "mpi").lower() == "mpi"
            or environ.get("HOROVOD_CPU_OPERATIONS", "").lower() == "mpi")


def mpi_started() -> bool:
    """Whether MPI runs in this process already (started through mpi4py), without
    starting it."""
    mpi = sys.modules.get("mpi4py.MPI")
    return bool(mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized())


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
