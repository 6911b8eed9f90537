"""Keras checkpoints: written by rank 0 atomically, read by rank 0 and handed to every
rank.

:func:`save_model` and the :class:`~hvdtrain.adapters.keras.ModelCheckpoint` callback
write Keras's own formats (``.keras``, or ``.weights.h5`` for weights only) through
:func:`hvdtrain.checkpoint.atomic_path`: a crash while writing leaves the previous
file whole. :func:`load_model` reads the file on rank 0 only and broadcasts its bytes,
so the other ranks need no shared storage, and makes the optimizer distributed again.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import keras

from hvdtrain.adapters.keras import backend
from hvdtrain.adapters.keras.optimizer import make_distributed
from hvdtrain.checkpoint import atomic_path, require_checkpoint_file
from hvdtrain.collective import broadcast, on_rank0_for_all, require_initialized
from hvdtrain.validation import require_instance

__all__ = ["load_model", "save_model", "write_model"]

def save_model(model: keras.Model, path: str | os.PathLike[str], *,
               weights_only: bool = False) -> None:
    """Write ``model`` (with its optimizer's state) from rank 0, atomically; every
    rank calls it.

    Args:
        model: the model.
        path: a ``.keras`` file (or ``.weights.h5`` with ``weights_only``); its folder
            is created if missing.
        weights_only: write ``model.save_weights`` instead of ``model.save``.

    Raises:
        RuntimeError: on every rank, when rank 0 could not write the file.
    """
    require_instance("model", model, keras.Model, "a keras.Model")
    require_initialized(backend.collective(), "save_model")
    on_rank0_for_all(backend.collective(),
                     lambda: write_model(model, path, weights_only=weights_only),
                     f"write checkpoint {os.fspath(path)}", "hvdtrain.keras_checkpoint.saved")


def write_model(model: keras.Model, path: str | os.PathLike[str], *,
                weights_only: bool = False) -> None:
    """Write ``model`` to ``path`` atomically from this process (no collective)."""
    destination = Path(path)
    destination.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(destination) as temporary:
        if weights_only:
            model.save_weights(temporary, overwrite=True)
        else:
            model.save(temporary, overwrite=True)


def load_model(path: str | os.PathLike[str], custom_optimizers: list[type] | None = None,
               custom_objects: dict[str, Any] | None = None, compression: Any = None, *,
               op: Any = None, skip_nonfinite: bool = False, check_nonfinite: bool = True,
               **load_kwargs: Any) -> keras.Model:
    """Load a model saved with ``model.save`` (or :func:`save_model`) on every rank, from
    rank 0's file, and make its optimizer distributed.

    Rank 0 reads the file and broadcasts its bytes (with one worker, or before
    ``init()``, the file is read directly). The optimizer keeps its loaded state
    (slots, iterations, learning rate, loss scale); ``custom_objects`` and
    ``load_kwargs`` go to ``keras.saving.load_model`` (safe mode stays on unless you
    turn it off), ``custom_optimizers`` (Horovod's argument: optimizer classes) join
    ``custom_objects`` under their names. The other arguments are
    :func:`~hvdtrain.adapters.keras.DistributedOptimizer`'s.

    Raises:
        RuntimeError: on every rank, when rank 0 could not read the file (missing,
            empty), naming it.
    """
    custom_objects = {**(custom_objects or {}),
                      **{cls.__name__: cls for cls in custom_optimizers or ()}}
    if custom_objects:
        load_kwargs["custom_objects"] = custom_objects
    collective = backend.collective()
    if collective.is_initialized() and collective.size() > 1:
        data = on_rank0_for_all(collective, lambda: require_checkpoint_file(path).read_bytes(),
                                f"read checkpoint {os.fspath(path)}",
                                "hvdtrain.keras_checkpoint.checked")
        data = broadcast(collective, data, "hvdtrain.keras_checkpoint.bytes")
        with tempfile.TemporaryDirectory(prefix="hvdtrain-load-") as folder:
            copy = Path(folder) / Path(path).name
            copy.write_bytes(data)
            model = keras.saving.load_model(copy, **load_kwargs)
    else:
        model = keras.saving.load_model(path, **load_kwargs)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None:
        make_distributed(optimizer, compression=compression, op=op,
                         skip_nonfinite=skip_nonfinite, check_nonfinite=check_nonfinite)
    return model
