"""Run a Python script on several ranks under ``horovodrun`` and collect each rank's result.

This is how hvdtrain's tests and ``hvdtrain doctor`` exercise real multi-process
Horovod: every rank's exit code and output are kept apart (``horovodrun`` itself
only reports the first failure), and a run that hangs is killed after ``timeout``
seconds and reported as timed out instead of stalling the caller.

Example::

    from hvdtrain.jobs.launch import run_workers

    result = run_workers("train.py", ["--epochs", "1"], np=2, controller="gloo", timeout=60)
    result.check()                 # raises LaunchError with every rank's output
    print(result.ranks[1].output)
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from hvdtrain.validation import require_positive_int

CONTROLLERS = ("gloo", "mpi")

# Open MPI refuses to start as root unless told twice; CI and containers run as root.
_MPI_AS_ROOT = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
_KILL_GRACE_SECONDS = 5.0


class LaunchError(RuntimeError):
    """A multi-rank run failed, hung, or a rank exited non-zero."""


@dataclass(frozen=True)
class RankResult:
    """What one rank did: its script's exit code and its output.

    ``exit_code`` is what the script returned or passed to ``sys.exit``, recorded before
    the interpreter ends; None when the script never got there (killed, crashed, timed
    out). A process that crashes while exiting after that keeps its code here; the
    launcher's return code and output show the crash.
    """

    rank: int
    exit_code: int | None
    output: str


@dataclass(frozen=True)
class LaunchResult:
    """The outcome of :func:`run_workers`."""

    command: tuple[str, ...]
    returncode: int | None
    timed_out: bool
    launcher_output: str
    ranks: tuple[RankResult, ...]

    @property
    def ok(self) -> bool:
        """True when the run finished in time and every rank exited with 0."""
        return (not self.timed_out and self.returncode == 0
                and all(r.exit_code == 0 for r in self.ranks))

    def check(self) -> LaunchResult:
        """Return self if :attr:`ok`, else raise :class:`LaunchError` showing all output."""
        if not self.ok:
            raise LaunchError(self.report())
        return self

    def report(self) -> str:
        """A readable account of the run: status, then every rank's output."""
        status = "timed out" if self.timed_out else f"horovodrun exited {self.returncode}"
        parts = [f"{' '.join(self.command)}\n{status}"]
        for rank in self.ranks:
            code = ("its script did not return" if rank.exit_code is None
                    else f"its script exited {rank.exit_code}")
            parts.append(f"--- rank {rank.rank} ({code}) ---\n{rank.output.rstrip()}")
        parts.append(f"--- horovodrun ---\n{self.launcher_output.rstrip()}")
        return "\n".join(parts)


def horovodrun_path() -> str:
    """The ``horovodrun`` beside this interpreter, else the one on PATH."""
    beside = Path(sys.executable).with_name("horovodrun")
    if beside.exists():
        return str(beside)
    found = shutil.which("horovodrun")
    if found is None:
        raise LaunchError(
            "horovodrun not found; run `bash scripts/setup.sh` and activate .venv"
        )
    return found


def run_workers(
    script: str | os.PathLike[str],
    args: Sequence[str] = (),
    *,
    np: int = 2,
    controller: str = "gloo",
    timeout: float = 120.0,
    env: Mapping[str, str] | None = None,
) -> LaunchResult:
    """Run ``python script *args`` on ``np`` ranks with ``horovodrun --<controller>``.

    Args:
        script: path of the Python file every rank runs as ``__main__``.
        args: its command-line arguments.
        np: number of ranks (all on this host).
        controller: "gloo" or "mpi".
        timeout: seconds after which the whole run is killed and reported as timed out.
        env: extra environment variables for every rank.

    Returns:
        A :class:`LaunchResult`; call ``.check()`` to turn any failure into an error.
    """
    if controller not in CONTROLLERS:
        raise ValueError(f"controller must be one of {CONTROLLERS}, got {controller!r}")
    require_positive_int("np", np)
    script = Path(script).resolve()
    if not script.is_file():
        raise FileNotFoundError(f"worker script not found: {script}")

    with tempfile.TemporaryDirectory(prefix="hvdtrain-launch-") as rank_dir:
        command = (
            horovodrun_path(), "-np", str(np), f"--{controller}",
            sys.executable, "-m", "hvdtrain.jobs._rank_entry", rank_dir, str(script), *args,
        )
        run_env = {**os.environ, **_MPI_AS_ROOT, **(env or {})}
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env=run_env, start_new_session=True,
        )
        timed_out = False
        try:
            launcher_output, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_run(process, Path(rank_dir))
            launcher_output, _ = process.communicate()
        ranks = tuple(_read_rank(Path(rank_dir), rank) for rank in range(np))
    return LaunchResult(command, None if timed_out else process.returncode,
                        timed_out, launcher_output, ranks)


def _read_rank(rank_dir: Path, rank: int) -> RankResult:
    log = rank_dir / f"rank-{rank}.log"
    exit_file = rank_dir / f"rank-{rank}.exit"
    output = log.read_text(errors="replace") if log.exists() else ""
    exit_code = int(exit_file.read_text()) if exit_file.exists() else None
    return RankResult(rank, exit_code, output)


def _kill_run(process: subprocess.Popen[str], rank_dir: Path) -> None:
    """Stop horovodrun, its process group and every rank it started."""
    rank_pids = [int(p.read_text()) for p in rank_dir.glob("rank-*.pid")]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in rank_pids:
            _signal_quietly(pid, sig)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        deadline = time.monotonic() + _KILL_GRACE_SECONDS
        while time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.1)
        if process.poll() is not None and not any(process_alive(pid) for pid in rank_pids):
            return


def _signal_quietly(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def process_alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie (dead, not yet reaped) counts as gone.

    In containers whose first process does not reap orphans, a killed rank can stay a
    zombie indefinitely; it holds no memory, ports or devices.
    """
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("State:"):
                    return line.split()[1] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
