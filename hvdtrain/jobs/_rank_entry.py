"""What each rank runs under :func:`hvdtrain.jobs.launch.run_workers`.

``python -m hvdtrain.jobs._rank_entry RANK_DIR SCRIPT [ARGS...]`` sends this process's
stdout and stderr (Python's and the C++ runtime's alike) to ``RANK_DIR/rank-N.log``,
runs SCRIPT as ``__main__``, and records its exit code in ``RANK_DIR/rank-N.exit``.
A crash in native code while the script runs (a segfault, an abort) writes the Python
stack of every thread to the log first (:mod:`faulthandler`).
"""

from __future__ import annotations

import faulthandler
import os
import runpy
import sys
from pathlib import Path

from hvdtrain.runtime import launcher_rank


def _redirect_output(log_path: Path) -> None:
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
        os.dup2(log_fd, stream.fileno())
    os.close(log_fd)
    sys.stdout.reconfigure(line_buffering=True)


def _run_script(script: str, args: list[str]) -> int:
    sys.argv = [script, *args]
    sys.path.insert(0, str(Path(script).parent))
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exit_request:
        code = exit_request.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        print(code, file=sys.stderr)
        return 1
    except BaseException:
        sys.excepthook(*sys.exc_info())  # as if uncaught: hvdtrain's rank report runs too
        return 1
    return 0


def main() -> None:
    rank_dir = Path(sys.argv[1])
    script, args = sys.argv[2], sys.argv[3:]
    rank = launcher_rank()
    if rank is None:
        raise RuntimeError("no rank in the environment: run this under horovodrun or mpirun")
    (rank_dir / f"rank-{rank}.pid").write_text(str(os.getpid()))
    _redirect_output(rank_dir / f"rank-{rank}.log")
    faulthandler.enable(all_threads=True)
    code = _run_script(script, args)
    sys.stdout.flush()
    sys.stderr.flush()
    (rank_dir / f"rank-{rank}.exit").write_text(str(code))
    sys.exit(code)


if __name__ == "__main__":
    main()
