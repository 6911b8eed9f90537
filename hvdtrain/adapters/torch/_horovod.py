"""What every module of the torch adapter needs from Horovod: the init check and the
watched object allgather (Horovod's ``allgather_object`` under :mod:`hvdtrain.watchdog`)."""

from __future__ import annotations

from typing import Any

import horovod.torch as hvd

from hvdtrain import runtime, watchdog


def require_initialized(what: str) -> None:
    """Raise RuntimeError naming ``what`` unless ``hvt.init()`` has run."""
    runtime.require_initialized(hvd.is_initialized(), what, "hvt.init()")


def allgather_object(value: Any, name: str) -> list[Any]:
    """Every rank's ``value``, in rank order (one Horovod ``allgather_object``, watched)."""
    return watchdog.watched_allgather(hvd.allgather_object, value, name)
