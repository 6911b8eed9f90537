"""Checkpoints of a torch training run: one file written atomically by rank 0, read
by rank 0 and handed to every rank.

The file is ``torch.save`` of a dict: ``format`` (:data:`CHECKPOINT_FORMAT`),
``model``, ``optimizer`` and ``scheduler`` (their ``state_dict()`` or None) and
``extra`` (the keyword arguments given to :func:`save_checkpoint`). It holds only
tensors and plain data, so it loads with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import horovod.torch as _hvd
import torch

from hvdtrain.adapters.torch._horovod import collective
from hvdtrain.adapters.torch.replicas import broadcast_state, broadcast_tree
from hvdtrain.adapters.torch.scheduler import LinearScalingWarmup
from hvdtrain.adapters.torch.sharding import is_sharded
from hvdtrain.checkpoint import atomic_write, require_checkpoint_file
from hvdtrain.collective import on_rank0_for_all, require_initialized
from hvdtrain.trees import leaves

__all__ = ["CHECKPOINT_FORMAT", "load_checkpoint", "save_checkpoint"]

CHECKPOINT_FORMAT = "hvdtrain.torch/1"
_SAVEABLE_LEAVES = (type(None), bool, int, float, str, torch.Tensor)


def save_checkpoint(
    path: str | os.PathLike[str],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    **extra: Any,
) -> None:
    """Write a checkpoint from rank 0, atomically; every rank calls it.

    The file is written to a temporary file in the same folder, fsynced and renamed
    over ``path`` (:func:`hvdtrain.checkpoint.atomic_write`), so a crash mid-write
    leaves the previous checkpoint intact. ``extra`` (epoch=..., step=...) must be
    plain data.

    Raises:
        RuntimeError: on every rank, when rank 0 could not write the file (instead of
            the other ranks running on into a hang).
    """
    require_initialized(collective(), "save_checkpoint")
    # A sharded optimizer's state_dict() gathers every rank's slice: all ranks call it.
    gathered = optimizer.state_dict() if is_sharded(optimizer) else None

    def write() -> None:
        payload = {
            "format": CHECKPOINT_FORMAT,
            "model": model.state_dict(),
            "optimizer": gathered if gathered is not None else
            optimizer.state_dict() if optimizer is not None else None,
            "scheduler": scheduler.state_dict() if scheduler is not None else None,
            "extra": extra,
        }
        _require_saveable(payload)
        with atomic_write(path) as file:
            torch.save(payload, file)

    on_rank0_for_all(collective(), write, f"write checkpoint {os.fspath(path)}",
                     "hvdtrain.checkpoint.saved")


def load_checkpoint(
    path: str | os.PathLike[str],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
) -> dict[str, Any]:
    """Read a checkpoint on rank 0 and give its state to every rank; every rank calls it.

    Rank 0 reads ``path`` with ``torch.load(weights_only=True)`` and loads it into
    its model, optimizer and scheduler; :func:`broadcast_state` then copies them to
    the other ranks. A :class:`LinearScalingWarmup` saved by a different number of
    workers continues with k for this job's, from the samples seen
    (:meth:`LinearScalingWarmup.set_world_size`).

    Returns:
        The extras saved with the checkpoint, on every rank.

    Raises:
        RuntimeError: on every rank, when the file is missing, unreadable or does not
            fit what was passed (the message says which).
    """
    require_initialized(collective(), "load_checkpoint")
    sharded = is_sharded(optimizer)
    optimizer_state = None

    def read() -> dict[str, Any]:
        nonlocal optimizer_state
        payload = _read_checkpoint(path)
        model.load_state_dict(payload["model"])
        if sharded:  # every rank takes its slice of the whole state, below
            optimizer_state = payload["optimizer"]
        else:
            _load_part(optimizer, payload["optimizer"], "optimizer")
        _load_part(scheduler, payload["scheduler"], "scheduler")
        return payload["extra"]

    extra = on_rank0_for_all(collective(), read, f"load checkpoint {os.fspath(path)}",
                             "hvdtrain.checkpoint.loaded")
    extra = broadcast_state(model, None if sharded else optimizer, scheduler, root_rank=0,
                            extra=extra or {})
    if sharded:
        state = broadcast_tree(optimizer_state, 0, "checkpoint.optimizer")
        try:  # the same state on every rank, so the same outcome
            _load_part(optimizer, state, "optimizer")
        except (ValueError, KeyError) as error:
            raise RuntimeError(f"could not load checkpoint {os.fspath(path)}: "
                               f"{type(error).__name__}: {error}") from None
    if isinstance(scheduler, LinearScalingWarmup):  # written by another number of workers?
        scheduler.set_world_size(_hvd.size())
    return extra


def _require_saveable(payload: dict[str, Any]) -> None:
    """Checkpoints load with ``torch.load(weights_only=True)``: only plain data may go in."""
    for path, leaf in leaves(payload):
        if not isinstance(leaf, _SAVEABLE_LEAVES):
            raise TypeError(
                f"checkpoint value {path} is a {type(leaf).__name__}; only tensors, numbers, "
                "strings, None and lists/tuples/dicts of them can be saved (checkpoints are "
                "read with torch.load(weights_only=True)); convert it, e.g. with int(), "
                "float() or str()"
            )


def _read_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The checkpoint's contents, or an error saying what is wrong with the file."""
    file: Path = require_checkpoint_file(path)
    try:
        payload = torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        raise ValueError(f"{file} holds objects other than tensors and plain data; they are "
                         f"not unpickled (weights_only=True): {error}") from None
    except (RuntimeError, EOFError, OSError) as error:
        raise ValueError(f"{file} is truncated or not a PyTorch file ({error})") from None
    if not isinstance(payload, dict) or payload.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{file} is a PyTorch file but not an hvdtrain checkpoint (it lacks "
                         f"format {CHECKPOINT_FORMAT!r}); write checkpoints with save_checkpoint")
    return payload


def _load_part(target: Any, state: dict | None, what: str) -> None:
    if target is None:
        return
    if state is None:
        raise ValueError(f"the checkpoint has no {what} state, but a {what} was passed")
    target.load_state_dict(state)
