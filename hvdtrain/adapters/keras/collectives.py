"""Collectives on Keras 3 variables and on the workers themselves: broadcasting
variables from one rank, checking that replicas are identical, and Horovod's ``join``.

Shared by the Keras adapter's modules and by :mod:`hvdtrain.adapters.tensorflow`;
gradient reduction is in :mod:`.reduction`, the choice of Horovod in :mod:`.backend`,
and Python-object collectives (gather, agreement, metrics) in the core
(:mod:`hvdtrain.collective`) over :func:`.backend.collective`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
import numpy as np
from keras import ops

from hvdtrain import horovod_patches, step_timing, watchdog
from hvdtrain.adapters.keras import step_events
from hvdtrain.adapters.keras.backend import UNSCOPED, bitcast16, collective, horovod
from hvdtrain.replicas import checksums, verify_checksums
from hvdtrain.validation import require_root_rank

_joined = False  # whether this process has called join()


def join(device: int | None = None) -> int:
    """Horovod's ``join``: wait until every rank has joined (meanwhile send zeros to the
    others' allreduces); returns the last rank to join. Afterwards the step timing's
    window starts anew, on every rank at once (:mod:`hvdtrain.step_timing`). ``device``
    is passed on to ``horovod.torch.join`` on the torch backend (TensorFlow's takes none).

    On Keras's TensorFlow backend a Horovod without hvdtrain's patch 0005 runs only the
    first join of a process (:mod:`hvdtrain.horovod_patches`); a second one raises
    RuntimeError there instead of returning at once and hanging the job.
    """
    global _joined
    if (_joined and keras.backend.backend() == "tensorflow"
            and not horovod_patches.has_patch(horovod_patches.STATEFUL_JOIN)):
        raise RuntimeError(horovod_patches.missing_patch_message(
            "A second join() in one process on Keras's TensorFlow backend",
            horovod_patches.STATEFUL_JOIN,
            "without it TensorFlow would not run it, it would return at once while the other "
            "ranks still train, and the job would hang"))
    _joined = True
    last = int(horovod().join() if device is None else horovod().join(device))
    step_timing.restart()
    step_events.discard_pending()
    return last


def broadcast_variables(variables: Sequence[Any], root_rank: int = 0) -> None:
    """Assign ``root_rank``'s value to each variable on every rank, eagerly.

    One Horovod broadcast per dtype: the variables of a dtype are concatenated,
    broadcast and split back; bfloat16 ones travel as their bits (int16), which every
    Horovod broadcasts. (``horovod.tensorflow.broadcast_variables`` fails on Keras 3
    variables.)
    """
    hvd = horovod()
    require_root_rank(root_rank, hvd.size())
    by_dtype: dict[str, list[Any]] = {}
    for variable in variables:
        by_dtype.setdefault(str(variable.dtype), []).append(variable)
    for dtype, group in sorted(by_dtype.items()):
        flat = ops.concatenate([ops.reshape(ops.convert_to_tensor(v), [-1]) for v in group])
        bits = dtype == "bfloat16"
        with watchdog.guard(f"the broadcast of the {dtype} variables from rank {root_rank}"):
            received = hvd.broadcast(bitcast16(flat, "int16") if bits else flat, root_rank,
                                     name=f"hvdtrain.broadcast.{dtype}", **UNSCOPED)
        if bits:
            received = bitcast16(received, "bfloat16")
        sizes = [int(np.prod(v.shape)) for v in group]
        pieces = ops.split(received, np.cumsum(sizes)[:-1].tolist()) if len(group) > 1 \
            else [received]
        for variable, piece in zip(group, pieces, strict=True):
            variable.assign(ops.reshape(piece, variable.shape))


def verify_variables(named_variables: Sequence[tuple[str, Any]]) -> None:
    """Raise ReplicaMismatchError on every rank unless all ranks' variables are bit-identical.

    Variables are compared by position: their names carry per-process counters
    ("sgd_3/momentum") that differ between ranks which built different objects.
    """
    keys = [f"variable {i}" for i in range(len(named_variables))]
    mine = checksums((key, ops.convert_to_numpy(v))
                     for key, (_, v) in zip(keys, named_variables, strict=True))
    labels = {key: name for key, (name, _) in zip(keys, named_variables, strict=True)}
    verify_checksums(collective(), mine, labels)
