"""What every adapter's elastic mode shares: a bound on how long a worker waits in a
reset, framework-free.

After a worker is lost, the survivors shut Horovod down and start it again (the
reset); Horovod's elastic driver answers them once it has enough slots, or gives up
after ``horovodrun --elastic-timeout`` (``HOROVOD_ELASTIC_TIMEOUT``, 600 s by
default) and stops the job. Stopping the job is the launcher's work: it terminates
the ssh session of each worker. Should that termination not reach a worker (a
launcher or remote shell that does not pass it on), the worker would wait in the
reset forever. So ``hvt.elastic.run`` and ``hvk.elastic.run`` bound each reset with
:func:`bounded_reset`: after the elastic timeout plus :data:`RESET_MARGIN_SECONDS`
the worker prints why and exits with :data:`EXIT_CODE`.

hvdtrain's Horovod build (scripts/patches/horovod/0006-elastic-timeout-to-workers.patch)
gives every worker the launcher's elastic timeout as ``HOROVOD_ELASTIC_TIMEOUT``, so
the user sets nothing; on a Horovod without that patch the bound uses the variable
when the user exported it, else Horovod's default.

>>> reset_limit_seconds({"HOROVOD_ELASTIC_TIMEOUT": "30"})
60.0
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Mapping
from typing import TextIO

TIMEOUT_VARIABLE = "HOROVOD_ELASTIC_TIMEOUT"
# Horovod's own default (horovod.runner.elastic.driver.ELASTIC_TIMEOUT_SECS).
DEFAULT_ELASTIC_TIMEOUT_SECONDS = 600.0
# Past the driver's own deadline: time for it to stop the job and for the launcher to
# terminate the workers, which is the normal way a job below --min-np ends.
RESET_MARGIN_SECONDS = 30.0
EXIT_CODE = 75  # EX_TEMPFAIL: the job could go on with more workers


def elastic_timeout_seconds(environ: Mapping[str, str] = os.environ) -> float:
    """How long the elastic driver waits for enough workers after a reset, as the
    worker's environment says (see the module docstring)."""
    text = environ.get(TIMEOUT_VARIABLE)
    if text is None:
        return DEFAULT_ELASTIC_TIMEOUT_SECONDS
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise ValueError(f"{TIMEOUT_VARIABLE}={text!r} is not a number of seconds > 0; set it "
                         f"to e.g. {DEFAULT_ELASTIC_TIMEOUT_SECONDS:g} (Horovod's default) or "
                         "pass horovodrun --elastic-timeout N")
    return value


def reset_limit_seconds(environ: Mapping[str, str] = os.environ) -> float:
    """The longest a worker waits in one reset: the elastic timeout plus the margin."""
    return elastic_timeout_seconds(environ) + RESET_MARGIN_SECONDS


def reset_timeout_message(limit_s: float, elastic_timeout_s: float) -> str:
    """What a worker prints when its reset has lasted ``limit_s`` seconds."""
    return (f"hvdtrain: the job did not re-form within {limit_s:g} s: fewer than --min-np "
            f"workers left? Horovod's elastic driver waits {elastic_timeout_s:g} s "
            f"(horovodrun --elastic-timeout, or {TIMEOUT_VARIABLE}) for enough workers and "
            "then stops the job; this worker was not stopped by its launcher, so it ends "
            f"itself (exit code {EXIT_CODE}). Restart the job from its last checkpoint with "
            "enough hosts, or lower --min-np.")


def bounded_reset(reset: Callable[[], None], *,
                  environ: Mapping[str, str] = os.environ, stream: TextIO | None = None,
                  on_expiry: Callable[[], None] = lambda: os._exit(EXIT_CODE)
                  ) -> Callable[[], None]:
    """``reset`` (an adapter's shutdown-and-init), ended by ``on_expiry`` after printing
    :func:`reset_timeout_message` to ``stream`` (stderr) if it lasts longer than
    :func:`reset_limit_seconds`.

    The limit is read when the wrapper is made, so a malformed ``HOROVOD_ELASTIC_TIMEOUT``
    fails at start-up rather than in the middle of a recovery.
    """
    elastic_timeout_s = elastic_timeout_seconds(environ)
    limit_s = elastic_timeout_s + RESET_MARGIN_SECONDS

    def expire() -> None:
        print(reset_timeout_message(limit_s, elastic_timeout_s), file=stream or sys.stderr,
              flush=True)
        on_expiry()

    def run() -> None:
        # A timer rather than a check after reset(): the wait is inside Horovod's C++
        # init, which does not return to Python while it lasts.
        timer = threading.Timer(limit_s, expire)
        timer.daemon = True
        timer.name = "hvdtrain-reset-deadline"
        timer.start()
        try:
            reset()
        finally:
            timer.cancel()

    return run
