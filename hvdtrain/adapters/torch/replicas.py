"""Identical replicas: ``broadcast_state`` gives every rank the root's model, optimizer and
scheduler; ``verify_replicas`` and ``fingerprint`` check that they stay identical."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from itertools import chain
from typing import Any

import horovod.torch as _hvd
import numpy as np
import torch

from hvdtrain import watchdog
from hvdtrain.adapters.torch._horovod import collective
from hvdtrain.adapters.torch.sharding import is_sharded
from hvdtrain.collective import require_initialized
from hvdtrain.replicas import ReplicaMismatchError, checksums, fingerprint, verify_checksums
from hvdtrain.trees import leaves, map_leaves
from hvdtrain.validation import require_instance, require_root_rank

__all__ = ["ReplicaMismatchError", "broadcast_state", "broadcast_tree", "state_fingerprint",
           "verify_replicas"]


@dataclass(frozen=True)
class _TensorSpec:
    """What a rank needs to receive a tensor it lacks: its shape and dtype."""

    shape: tuple[int, ...]
    dtype: torch.dtype


def broadcast_state(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    *,
    root_rank: int = 0,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Make every rank hold ``root_rank``'s model, optimizer, scheduler and ``extra``.

    Call it once after building everything (and after loading a checkpoint on the
    root), before the first step. Parameters, buffers and optimizer tensors travel by
    Horovod's in-place broadcast; the optimizer's layout, its scalars, the scheduler
    and ``extra`` (epoch, step, seeds, ...) by ``broadcast_object``. No dummy step is
    taken to create lazily built state such as Adam's moments (Horovod's
    ``broadcast_optimizer_state`` takes one, which moves the weights under weight
    decay): a rank whose optimizer has state the root lacks simply drops it, and the
    state is then created identically on every rank at the first step.

    Args:
        model: this rank's model.
        optimizer: its optimizer (distributed or not), or None.
        scheduler: its learning-rate scheduler, or None.
        root_rank: the rank whose state everyone takes.
        extra: plain data to hand from the root to every rank (other ranks may pass None).

    Returns:
        The root's ``extra`` (a new dict) on every rank.
    """
    require_initialized(collective(), "broadcast_state")
    require_instance("model", model, torch.nn.Module, "a torch.nn.Module")
    require_root_rank(root_rank, _hvd.size())
    with watchdog.guard(f"broadcast_state from rank {root_rank}"):
        tensors = {name: t.data for name, t in chain(model.named_parameters(),
                                                       model.named_buffers())}
        _hvd.broadcast_parameters(tensors, root_rank=root_rank)
        is_root = _hvd.rank() == root_rank
        header = {
            "scheduler": scheduler.state_dict() if scheduler is not None and is_root else None,
            "extra": dict(extra or {}) if is_root else None,
        }
        header = collective().broadcast_object(header, root_rank, "hvdtrain.state.header")
        if optimizer is not None:
            # A sharded optimizer's state_dict() gathers every rank's slice: all call it.
            own = optimizer.state_dict() if is_root or is_sharded(optimizer) else None
            optimizer_state = broadcast_tree(own, root_rank, "optimizer")
            if not is_root:
                optimizer.load_state_dict(optimizer_state)
        if scheduler is not None and not is_root:
            scheduler.load_state_dict(header["scheduler"])
        return header["extra"]


def broadcast_tree(tree: Any, root_rank: int, name: str) -> Any:
    """``root_rank``'s nested dicts and lists of tensors and plain data (a
    ``state_dict()``) on every rank; the others pass None. The layout and the plain
    values travel by one object broadcast, the tensors by Horovod's in-place ones."""
    is_root = _hvd.rank() == root_rank
    layout = collective().broadcast_object(map_leaves(tree, _spec_of) if is_root else None,
                                         root_rank, f"hvdtrain.{name}.layout")
    if not is_root:
        tree = map_leaves(layout, _empty_for)
    _broadcast_in_place([(path, leaf) for path, leaf in leaves(tree)
                         if isinstance(leaf, torch.Tensor)], root_rank, name)
    return tree


def verify_replicas(model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer | None = None) -> None:
    """Check that every rank holds bit-identical parameters, buffers and optimizer state.

    Each rank computes a crc32 per tensor and one ``allgather_object`` compares them,
    so it is cheap enough to call every epoch. Returns normally when all agree.

    Raises:
        ReplicaMismatchError: on every rank, naming the ranks that differ from rank 0
            and the first tensor where they do.
    """
    require_initialized(collective(), "verify_replicas")
    require_instance("model", model, torch.nn.Module, "a torch.nn.Module")
    mine = checksums(_named_arrays(model, optimizer))
    verify_checksums(collective(), mine)


def state_fingerprint(model: torch.nn.Module,
                      optimizer: torch.optim.Optimizer | None = None) -> str:
    """A short hex digest of this rank's parameters, buffers and optimizer state, for a
    log line: replicas print the same one exactly when they are bit-identical (up to
    crc32's rare collisions). Local: no collective, so any rank may call it alone.

    Raises:
        ValueError: for an optimizer with ``shard_state=True``, whose ranks hold
            different slices by design (fingerprint the model, or call
            :func:`verify_replicas`, which gathers the whole state).
    """
    require_instance("model", model, torch.nn.Module, "a torch.nn.Module")
    if is_sharded(optimizer):
        raise ValueError("state_fingerprint is local, but this optimizer's state is sharded "
                         "(shard_state=True): each rank holds its own slice. Fingerprint the "
                         "model alone, or call verify_replicas(model, optimizer), which gathers "
                         "the whole state")
    return fingerprint(_named_arrays(model, optimizer))


def _named_arrays(model: torch.nn.Module,
                  optimizer: torch.optim.Optimizer | None) -> list[tuple[str, np.ndarray]]:
    tree: dict[str, Any] = {"model": dict(chain(model.named_parameters(),
                                                model.named_buffers()))}
    if optimizer is not None:
        tree["optimizer"] = optimizer.state_dict()
    return [(path, _as_bytes(leaf)) for path, leaf in leaves(tree)]


def _as_bytes(value: Any) -> np.ndarray:
    """A tensor's exact bytes as a NumPy array (any dtype, bfloat16 included); other
    values by their repr, so that differing scalars differ too."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
    return np.frombuffer(repr(value).encode(), dtype=np.uint8)


def _spec_of(leaf: Any) -> Any:
    return _TensorSpec(tuple(leaf.shape), leaf.dtype) if isinstance(leaf, torch.Tensor) else leaf


def _empty_for(leaf: Any) -> Any:
    return torch.empty(leaf.shape, dtype=leaf.dtype) if isinstance(leaf, _TensorSpec) else leaf


def _broadcast_in_place(named_tensors: list[tuple[str, torch.Tensor]], root_rank: int,
                        prefix: str) -> None:
    handles = [_hvd.broadcast_async_(tensor, root_rank, name=f"hvdtrain.{prefix}.{path}")
               for path, tensor in named_tensors]
    for handle in handles:
        _hvd.synchronize(handle)
