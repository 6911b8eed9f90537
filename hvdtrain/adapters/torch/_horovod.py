"""What every module of the torch adapter needs from Horovod: the init check and the
watched object allgather (Horovod's ``allgather_object`` under :mod:`hvdtrain.watchdog`)."""

from __future__ import annotations

import functools
import pickle
from typing import Any

import horovod.torch as hvd
import torch

from hvdtrain import runtime, watchdog


def require_initialized(what: str) -> None:
    """Raise RuntimeError naming ``what`` unless ``hvt.init()`` has run."""
    runtime.require_initialized(hvd.is_initialized(), what, "hvt.init()")


def allgather_object(value: Any, name: str,
                     process_set: hvd.ProcessSet = hvd.global_process_set) -> list[Any]:
    """Every rank's ``value`` (of ``process_set``), in rank order (one Horovod
    ``allgather_object``, watched)."""
    gather = hvd.allgather_object if process_set == hvd.global_process_set else \
        functools.partial(_allgather_object_in, process_set)
    return watchdog.watched_allgather(gather, value, name)


def _allgather_object_in(process_set: hvd.ProcessSet, value: Any, name: str) -> list[Any]:
    """Horovod's ``allgather_object`` within ``process_set`` (Horovod's own has no
    ``process_set`` argument): the pickled bytes and their lengths, by two allgathers."""
    data = torch.frombuffer(bytearray(pickle.dumps(value)), dtype=torch.uint8)
    lengths = hvd.allgather(torch.tensor([data.numel()]), name=f"{name}.lengths",
                            process_set=process_set)
    gathered = hvd.allgather(data, name=f"{name}.data", process_set=process_set)
    return [pickle.loads(part.numpy().tobytes())
            for part in torch.split(gathered, lengths.tolist())]
