"""PyTorch on Horovod: ``import hvdtrain.adapters.torch as hvt``.

A Horovod user switches by changing one import: Horovod's basics are re-exported
(``init``, ``rank``, ``size``, ``allreduce``, ``broadcast_object``, ``Average``, ...),
and :func:`DistributedOptimizer` takes the same first arguments as
``horovod.torch.DistributedOptimizer``. What hvdtrain adds:

- :func:`DistributedOptimizer` averages over accumulated micro-batches too, offers
  "bf16" compression, names the rank and parameter when models differ, and can skip
  non-finite steps on every rank alike.
- :class:`LinearScalingWarmup`: Goyal et al.'s linear scaling rule and warmup
  (:mod:`hvdtrain.schedule`) as a ``torch.optim.lr_scheduler.LRScheduler``.
- :func:`broadcast_state`, :func:`verify_replicas`, :func:`save_checkpoint`,
  :func:`load_checkpoint`, :func:`average_metrics`, :func:`distributed_sampler`.

Example (run with ``horovodrun -np 2 python train.py``)::

    import torch
    import hvdtrain.adapters.torch as hvt

    hvt.init()
    model = torch.nn.Linear(10, 2)
    optimizer = hvt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         model.named_parameters())
    scheduler = hvt.LinearScalingWarmup(optimizer, batch_size_per_worker=32,
                                        steps_per_epoch=100)
    hvt.broadcast_state(model, optimizer, scheduler)
    for x, y in loader:                      # this worker's shard
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        scheduler.step()
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any

import horovod.torch as _hvd
import numpy as np
import torch
from horovod.torch import (
    Adasum,
    Average,
    Compression,
    Sum,
    allgather,
    allgather_object,
    allreduce,
    broadcast,
    broadcast_object,
    is_initialized,
    join,
    local_rank,
    local_size,
    rank,
    shutdown,
    size,
)

# Horovod's optimizer class: its methods add the gradient hooks, fusion and
# synchronize(); DistributedOptimizer builds on them (see _distributed_class).
from horovod.torch.optimizer import _DistributedOptimizer as _HorovodOptimizer

from hvdtrain import watchdog
from hvdtrain.checkpoint import atomic_write
from hvdtrain.consistency import (
    RankDisagreementError,
    average_by_key,
    raise_on_disagreement,
    software_versions,
)
from hvdtrain.replicas import ReplicaMismatchError, checksums, raise_on_mismatch
from hvdtrain.runtime import init_horovod
from hvdtrain.schedule import (
    DEFAULT_BASE_BATCH_SIZE,
    DEFAULT_GAMMA,
    DEFAULT_WARMUP_EPOCHS,
    LinearScalingSchedule,
)
from hvdtrain.validation import (
    require_instance,
    require_positive_int,
    require_root_rank,
    require_same_world_size,
)

__all__ = [
    "Adasum",
    "Average",
    "Compression",
    "DistributedOptimizer",
    "LinearScalingWarmup",
    "NonFiniteGradientError",
    "ParameterMismatchError",
    "RankDisagreementError",
    "ReplicaMismatchError",
    "Sum",
    "allgather",
    "allgather_object",
    "allreduce",
    "average_metrics",
    "broadcast",
    "broadcast_object",
    "broadcast_state",
    "distributed_sampler",
    "init",
    "is_initialized",
    "join",
    "load_checkpoint",
    "local_rank",
    "local_size",
    "rank",
    "save_checkpoint",
    "shutdown",
    "size",
    "verify_replicas",
]

CHECKPOINT_FORMAT = "hvdtrain.torch/1"
_COMPRESSIONS = {None: Compression.none, "fp16": Compression.fp16, "bf16": Compression.none}


class ParameterMismatchError(RankDisagreementError):
    """The ranks' models differ (names, shapes or dtypes), so their gradients cannot be averaged."""


class NonFiniteGradientError(FloatingPointError):
    """The worker-averaged gradient holds a NaN or Inf (and ``skip_nonfinite`` is off)."""


def init(comm=None, process_sets=None) -> None:
    """Horovod's ``init`` with hvdtrain's runtime defaults (:mod:`hvdtrain.runtime`: a
    stalled collective is reported, then the job shut down, instead of hanging).

    ``comm`` may be an mpi4py communicator, to train several groups in one MPI job.
    Without a launcher it prints a one-line notice and runs as a single worker.
    """
    init_horovod(_hvd, comm, process_sets)


def _require_initialized(what: str) -> None:
    if not _hvd.is_initialized():
        raise RuntimeError(f"{what} needs Horovod: call hvt.init() first")


# --------------------------------------------------------------------------- optimizer


class _Extras:
    """What hvdtrain adds to Horovod's optimizer, merged into DistributedOptimizer's class.

    Horovod's methods call ``super(self.__class__, self)``, so its optimizer cannot be
    subclassed; instead these methods sit beside Horovod's in one class whose base is
    the user's optimizer class, and call Horovod's explicitly.
    """

    def synchronize(self) -> None:
        """Finish the allreduce of every gradient; afterwards each holds the mean over
        all workers and, with ``backward_passes_per_step > 1``, over the micro-batches."""
        # Horovod counts down backward passes per parameter; read them before it resets.
        passes = {p: self.backward_passes_per_step - left
                  for p, left in self._allreduce_delay.items()}
        with watchdog.guard(self._pending_allreduces):
            _HorovodOptimizer.synchronize(self)
        if self.backward_passes_per_step > 1:
            for parameter, count in passes.items():
                if count > 1 and parameter.grad is not None:
                    parameter.grad.div_(count)

    def step(self, closure=None):
        """Synchronize (unless already done), then apply the averaged gradients.

        With ``skip_nonfinite=True``, a step whose averaged gradient has a NaN or Inf
        on any rank is skipped on every rank and counted in ``skipped_steps``.
        """
        if self._should_synchronize and not self._synchronized:
            self.synchronize()
        step, self.steps_taken = self.steps_taken, self.steps_taken + 1
        nonfinite = self._first_nonfinite_gradient() if self.check_nonfinite else None
        if self.skip_nonfinite and _on_any_rank(nonfinite is not None):
            self.skipped_steps += 1
            self._synchronized = False
            return None
        if nonfinite is not None:
            raise NonFiniteGradientError(
                f"the worker-averaged gradient of {nonfinite!r} holds NaN or Inf at optimizer "
                f"step {step} (counting from 0); some rank's loss or gradient went non-finite. "
                "Lower the learning rate, check the data, or pass skip_nonfinite=True to skip "
                "such steps on every rank."
            )
        with self.skip_synchronize():
            return _HorovodOptimizer.step(self, closure)

    def _pending_allreduces(self) -> str:
        names = [f"allreduce.{self._parameter_names.get(p, '<unnamed>')}"
                 for p in list(self._handles)]
        shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
        return f"the gradient allreduce of step {self.steps_taken} ({shown})"

    def _first_nonfinite_gradient(self) -> str | None:
        """The name of the first parameter whose (averaged) gradient is not finite."""
        parameters = [p for group in self.param_groups for p in group["params"]
                      if p.grad is not None]
        if not parameters:
            return None
        # A NaN or Inf anywhere makes the sum non-finite: one read of each gradient and
        # one device synchronisation in the common case. Only a sum that overflows
        # without any non-finite element needs the exact look below.
        if bool(torch.isfinite(torch.stack([p.grad.sum() for p in parameters]).sum())):
            return None
        for parameter in parameters:
            if not bool(torch.isfinite(parameter.grad).all()):
                return self._parameter_names.get(parameter, "<unnamed>")
        return None

    def _allreduce_grad_async(self, parameter):
        if not self._bf16 or parameter.grad is None or parameter.grad.is_sparse:
            return _HorovodOptimizer._allreduce_grad_async(self, parameter)
        return _bf16_allreduce_async(parameter.grad, self._parameter_names.get(parameter),
                                     self.op), None


def _on_any_rank(condition: bool) -> bool:
    """True on every rank when ``condition`` holds on at least one (one scalar allreduce)."""
    flag = torch.tensor(1.0 if condition else 0.0, dtype=torch.float64)
    with watchdog.guard("the non-finite gradient vote (hvdtrain.any_rank)"):
        return _hvd.allreduce(flag, op=Sum, name="hvdtrain.any_rank").item() > 0


def _bf16_allreduce_async(gradient: torch.Tensor, name: str, op) -> Any:
    """Average (or sum) ``gradient`` across ranks with bfloat16 on the wire.

    Horovod 0.28.1 has no bfloat16 reduction, so the bfloat16 bits travel as int16
    through Horovod's allgather and each rank adds the ranks' values in rank order
    in the gradient's own dtype: every rank gets the identical result.
    """
    bits = gradient.detach().to(torch.bfloat16).reshape(1, -1).view(torch.int16)
    handle = _hvd.allgather_async(bits, name=f"{name}.bf16")

    def reduced() -> torch.Tensor:
        gathered = _hvd.synchronize(handle).view(torch.bfloat16).to(gradient.dtype)
        total = gathered.sum(dim=0)
        if op == Average:
            total /= gathered.shape[0]
        return total.view_as(gradient)

    return reduced


def DistributedOptimizer(
    optimizer: torch.optim.Optimizer,
    named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
    *,
    compression: str | None = None,
    backward_passes_per_step: int = 1,
    op=Average,
    groups: int | list[list[torch.Tensor]] | None = None,
    skip_nonfinite: bool = False,
    check_nonfinite: bool = True,
) -> torch.optim.Optimizer:
    """Wrap ``optimizer`` so that its gradients are averaged over all workers.

    Returns an instance of a subclass of ``type(optimizer)`` with the same param
    groups and state: ``step``, ``zero_grad``, ``state_dict``, ``load_state_dict``,
    ``add_param_group`` behave as before, and each gradient's allreduce starts
    during ``backward()`` (Horovod's hooks and tensor fusion).

    Args:
        optimizer: any ``torch.optim.Optimizer``.
        named_parameters: ``model.named_parameters()``; names the allreduces and the
            parameters in error messages.
        compression: None, "fp16" (Horovod's fp16 allreduce) or "bf16" (bfloat16 on the
            wire through Horovod's allgather, since Horovod has no bfloat16 reduction;
            it carries fewer bytes than a float32 allreduce only up to 3 workers).
            Horovod's ``Compression.none``/``Compression.fp16`` are accepted too.
        backward_passes_per_step: micro-batches accumulated per step. The applied
            gradient is the mean over the micro-batches and workers, so the loss needs
            no manual scaling (Horovod's own wrapper leaves that 1/N to you).
        op: ``Average`` (default), ``Sum`` or ``Adasum``.
        groups: Horovod's explicit allreduce grouping (an int or lists of parameters).
        skip_nonfinite: skip, on every rank alike, a step whose averaged gradient has a
            NaN or Inf; ``optimizer.skipped_steps`` counts them.
        check_nonfinite: without ``skip_nonfinite``, raise NonFiniteGradientError (on every
            rank, naming the parameter and step) when the averaged gradient has a NaN or
            Inf. The check reads every gradient once more per step (measured: a few
            percent of a small MLP's step on the CPU, benchmarks/); pass False to drop it.

    Raises:
        ParameterMismatchError: on every rank, when the ranks' parameters differ in
            names, shapes or dtypes (names the rank, the parameter and both values).

    With ``torch.amp.GradScaler``, call ``optimizer.synchronize()`` before
    ``scaler.unscale_(optimizer)`` or ``scaler.step(optimizer)``; ``step()`` then does
    not synchronize again.
    """
    _require_initialized("DistributedOptimizer")
    require_instance("optimizer", optimizer, torch.optim.Optimizer,
                     "a torch.optim.Optimizer, e.g. torch.optim.SGD(model.parameters(), lr=0.1)")
    compression_name = _compression_name(compression)
    require_positive_int("backward_passes_per_step", backward_passes_per_step)
    if op not in (Average, Sum, Adasum):
        raise ValueError("op must be hvt.Average, hvt.Sum or hvt.Adasum")
    if compression_name == "bf16" and groups is not None:
        raise ValueError("compression='bf16' cannot be combined with groups: Horovod's grouped "
                         "allreduce has no bfloat16 path; drop one of them")
    if op == Adasum and (backward_passes_per_step > 1 or skip_nonfinite
                         or compression_name == "bf16"):
        raise ValueError("op=Adasum is passed straight to Horovod's Adasum optimizer; it does "
                         "not support backward_passes_per_step > 1, skip_nonfinite or bf16")

    named = _named_parameters(optimizer, named_parameters)
    _check_ranks_agree(named, {
        "optimizer class": type(optimizer).__name__,
        "number of param groups": len(optimizer.param_groups),
        "backward_passes_per_step": backward_passes_per_step,
        "compression": compression_name,
        "op": int(op),
        "skip_nonfinite": skip_nonfinite,
        **software_versions("torch", "horovod"),
    })
    if op == Adasum:
        return _hvd.DistributedOptimizer(optimizer, named, compression=_COMPRESSIONS[
            compression_name], op=Adasum)

    cls = _distributed_class(type(optimizer))
    wrapped = cls(optimizer.param_groups, named, _COMPRESSIONS[compression_name],
                  backward_passes_per_step, op, 1.0, groups)
    wrapped.defaults = optimizer.defaults  # Horovod rebuilds with the class's defaults
    wrapped.skip_nonfinite = skip_nonfinite
    wrapped.check_nonfinite = check_nonfinite or skip_nonfinite
    wrapped.skipped_steps = 0
    wrapped.steps_taken = 0
    wrapped._bf16 = compression_name == "bf16"
    wrapped.load_state_dict(optimizer.state_dict())  # keep state built before wrapping
    return wrapped


def _distributed_class(base: type) -> type:
    methods = dict(vars(_HorovodOptimizer))
    methods.update((name, member) for name, member in vars(_Extras).items()
                   if not name.startswith("__"))
    methods["__doc__"] = f"{base.__name__} with gradients averaged over Horovod workers."
    return type(base.__name__, (base,), methods)


def _compression_name(compression: Any) -> str | None:
    if compression is Compression.none:
        return None
    if compression is Compression.fp16:
        return "fp16"
    if compression not in _COMPRESSIONS:
        raise ValueError(f"compression must be None, 'fp16' or 'bf16', got {compression!r}")
    return compression


def _named_parameters(optimizer: torch.optim.Optimizer,
                      named_parameters: Iterable[tuple[str, torch.Tensor]] | None
                      ) -> list[tuple[str, torch.Tensor]]:
    if named_parameters is not None:
        return list(named_parameters)
    return [(f"param_group{i}.{j}", p) for i, group in enumerate(optimizer.param_groups)
            for j, p in enumerate(group["params"])]


def _check_ranks_agree(named_parameters: list[tuple[str, torch.Tensor]],
                       facts: dict[str, Any]) -> None:
    """One allgather: every rank's parameter names, shapes and dtypes, and ``facts``.

    Raises ParameterMismatchError or RankDisagreementError on every rank, naming the
    rank, the parameter or field, and both values.
    """
    mine = [(name, tuple(p.shape), str(p.dtype)) for name, p in named_parameters]
    everyone = _guarded_allgather_object({"parameters": mine, "facts": facts},
                                         "hvdtrain.start_agreement")
    problem = _first_parameter_difference([rank["parameters"] for rank in everyone])
    if problem:
        raise ParameterMismatchError(
            f"the ranks' models differ: {problem}. Every rank must build the same model "
            "(same layers, shapes and dtypes, in the same order) before wrapping its optimizer."
        )
    raise_on_disagreement([rank["facts"] for rank in everyone], "DistributedOptimizer")


def _guarded_allgather_object(value: Any, name: str) -> list[Any]:
    """Horovod's ``allgather_object`` under the watchdog (:mod:`hvdtrain.watchdog`)."""
    with watchdog.guard(f"the allgather of {name}"):
        return allgather_object(value, name=name)


def _first_parameter_difference(specs_by_rank: list[list[tuple]]) -> str | None:
    reference = specs_by_rank[0]
    reference_by_name = {name: (shape, dtype) for name, shape, dtype in reference}
    for other_rank, specs in enumerate(specs_by_rank[1:], start=1):
        by_name = {name: (shape, dtype) for name, shape, dtype in specs}
        for name, (shape, dtype) in reference_by_name.items():
            if name not in by_name:
                return f"rank {other_rank} has no parameter {name!r}, which rank 0 has"
            other_shape, other_dtype = by_name[name]
            if other_shape != shape:
                return (f"parameter {name!r} has shape {shape} on rank 0 "
                        f"but {other_shape} on rank {other_rank}")
            if other_dtype != dtype:
                return (f"parameter {name!r} has dtype {dtype} on rank 0 "
                        f"but {other_dtype} on rank {other_rank}")
        extra = [name for name in by_name if name not in reference_by_name]
        if extra:
            return f"rank {other_rank} has parameter {extra[0]!r}, which rank 0 lacks"
        if [s[0] for s in specs] != [s[0] for s in reference]:
            return f"rank {other_rank} lists the parameters in a different order than rank 0"
    return None


# --------------------------------------------------------------------------- scheduler


class LinearScalingWarmup(torch.optim.lr_scheduler.LRScheduler):
    """Goyal et al.'s linear scaling rule with gradual warmup, for any torch optimizer.

    Step it once per optimizer step. Each param group's learning rate when the
    scheduler is made is its η, the rate tuned for ``base_batch_size``; the group then
    follows :class:`hvdtrain.schedule.LinearScalingSchedule`: η at step 0, rising by a
    constant amount per step to kη after ``warmup_epochs``, then kη times ``gamma`` at
    each milestone epoch, where k = batch_size_per_worker x world_size x
    backward_passes_per_step / base_batch_size.

    PyTorch's SGD keeps the learning rate out of its momentum buffer (v = μv + g;
    p -= lr·v), so changing the rate needs no momentum correction here (Goyal et al.'s
    remark 2 applies to the v = μv + lr·g form, which Keras uses).

    ``state_dict()`` holds only the progress (step count and base rates); resuming
    with ``load_state_dict`` continues the exact sequence. Example::

        scheduler = hvt.LinearScalingWarmup(optimizer, batch_size_per_worker=32,
                                            steps_per_epoch=len(loader))
        ...
        optimizer.step()
        scheduler.step()
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        *,
        batch_size_per_worker: int,
        steps_per_epoch: int,
        base_batch_size: int = DEFAULT_BASE_BATCH_SIZE,
        warmup_epochs: float = DEFAULT_WARMUP_EPOCHS,
        milestones: Iterable[int] = (),
        gamma: float = DEFAULT_GAMMA,
        backward_passes_per_step: int = 1,
        world_size: int | None = None,
    ) -> None:
        accumulating = getattr(optimizer, "backward_passes_per_step", 1)
        if accumulating != backward_passes_per_step:
            raise ValueError(
                f"the optimizer accumulates {accumulating} backward passes per step but "
                f"LinearScalingWarmup got backward_passes_per_step={backward_passes_per_step}; "
                f"pass backward_passes_per_step={accumulating} so k counts the whole global batch"
            )
        if world_size is None:
            _require_initialized("LinearScalingWarmup (world_size=None means Horovod's size)")
            world_size = _hvd.size()
        elif _hvd.is_initialized():
            require_same_world_size(world_size, _hvd.size(), "hvt.size()")
        self._schedule_arguments = dict(
            batch_size_per_worker=batch_size_per_worker, workers=world_size,
            steps_per_epoch=steps_per_epoch, base_batch_size=base_batch_size,
            warmup_epochs=warmup_epochs, milestones=tuple(milestones), gamma=gamma,
            backward_passes_per_step=backward_passes_per_step,
        )
        # Validate now, with a placeholder η, so a bad argument fails here, not at step 0.
        LinearScalingSchedule(base_lr=1.0, **self._schedule_arguments)
        rates = [group.get("initial_lr", group["lr"]) for group in optimizer.param_groups]
        if not any(float(rate) > 0 for rate in rates):
            raise ValueError(
                f"every param group's learning rate is 0 ({rates}): LinearScalingWarmup scales "
                "each group's rate (η, tuned for base_batch_size); give the optimizer that rate")
        if _hvd.is_initialized():
            raise_on_disagreement(
                _guarded_allgather_object(self._schedule_arguments,
                                          "hvdtrain.schedule_agreement"),
                "LinearScalingWarmup")
        super().__init__(optimizer)

    def schedule_for(self, base_lr: float) -> LinearScalingSchedule:
        """The schedule one param group follows, given its η."""
        return LinearScalingSchedule(base_lr=base_lr, **self._schedule_arguments)

    def get_lr(self) -> list[float]:
        step = max(self.last_epoch, 0)
        return [self.schedule_for(eta).lr_at(step) if eta > 0 else 0.0 for eta in self.base_lrs]

    def state_dict(self) -> dict[str, Any]:
        """Progress only (not the configuration), so a resumed run keeps its own arguments."""
        state = super().state_dict()
        state.pop("_schedule_arguments", None)
        return state


# --------------------------------------------------------------------------- state


@dataclass(frozen=True)
class _TensorSpec:
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

    Returns the root's ``extra`` (a new dict) on every rank.
    """
    _require_initialized("broadcast_state")
    require_instance("model", model, torch.nn.Module, "a torch.nn.Module")
    require_root_rank(root_rank, _hvd.size())
    with watchdog.guard(f"broadcast_state from rank {root_rank}"):
        tensors = {name: t.data for name, t in chain(model.named_parameters(),
                                                       model.named_buffers())}
        _hvd.broadcast_parameters(tensors, root_rank=root_rank)
        is_root = _hvd.rank() == root_rank
        optimizer_state = optimizer.state_dict() if optimizer is not None and is_root else None
        header = {
            "optimizer": _map_leaves(optimizer_state, _spec_of) if is_root else None,
            "scheduler": scheduler.state_dict() if scheduler is not None and is_root else None,
            "extra": dict(extra or {}) if is_root else None,
        }
        header = broadcast_object(header, root_rank=root_rank, name="hvdtrain.state.header")
        if optimizer is not None:
            if not is_root:
                optimizer_state = _map_leaves(header["optimizer"], _empty_for)
            state_tensors = [(path, leaf) for path, leaf in _leaves(optimizer_state)
                             if isinstance(leaf, torch.Tensor)]
            _broadcast_tensors_in_place(state_tensors, root_rank, "optimizer")
            if not is_root:
                optimizer.load_state_dict(optimizer_state)
        if scheduler is not None and not is_root:
            scheduler.load_state_dict(header["scheduler"])
        return header["extra"]


def _map_leaves(tree: Any, function) -> Any:
    """``tree`` (nested dicts, lists, tuples) with ``function`` applied to every leaf."""
    if isinstance(tree, dict):
        return {key: _map_leaves(value, function) for key, value in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(_map_leaves(value, function) for value in tree)
    return function(tree)


def _leaves(tree: Any, path: str = "") -> list[tuple[str, Any]]:
    """(path, leaf) of every leaf of ``tree``, in order."""
    if isinstance(tree, dict):
        return [leaf for key in tree for leaf in _leaves(tree[key], f"{path}.{key}")]
    if isinstance(tree, list | tuple):
        return [leaf for i, value in enumerate(tree) for leaf in _leaves(value, f"{path}.{i}")]
    return [(path.lstrip("."), tree)]


def _spec_of(leaf: Any) -> Any:
    return _TensorSpec(tuple(leaf.shape), leaf.dtype) if isinstance(leaf, torch.Tensor) else leaf


def _empty_for(leaf: Any) -> Any:
    return torch.empty(leaf.shape, dtype=leaf.dtype) if isinstance(leaf, _TensorSpec) else leaf


def _broadcast_tensors_in_place(leaves: list[tuple[str, torch.Tensor]], root_rank: int,
                                prefix: str) -> None:
    handles = [_hvd.broadcast_async_(tensor, root_rank, name=f"hvdtrain.{prefix}.{path}")
               for path, tensor in leaves]
    for handle in handles:
        _hvd.synchronize(handle)


def _as_array(value: Any) -> np.ndarray:
    """A tensor's exact bytes as a NumPy array (any dtype, bfloat16 included); other
    values by their repr, so that differing scalars differ too."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
    return np.frombuffer(repr(value).encode(), dtype=np.uint8)


def verify_replicas(model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer | None = None) -> None:
    """Check that every rank holds bit-identical parameters, buffers and optimizer state.

    Each rank computes a crc32 per tensor and one ``allgather_object`` compares them,
    so it is cheap enough to call every epoch. Returns normally when all agree.

    Raises:
        ReplicaMismatchError: on every rank, naming the ranks that differ from rank 0
            and the first tensor where they do.
    """
    _require_initialized("verify_replicas")
    require_instance("model", model, torch.nn.Module, "a torch.nn.Module")
    tree: dict[str, Any] = {"model": dict(chain(model.named_parameters(),
                                                model.named_buffers()))}
    if optimizer is not None:
        tree["optimizer"] = optimizer.state_dict()
    mine = checksums((path, _as_array(leaf)) for path, leaf in _leaves(tree))
    raise_on_mismatch(_guarded_allgather_object(mine, "hvdtrain.replica_checksums"))


# --------------------------------------------------------------------------- checkpoints


_CHECKPOINT_LEAVES = (type(None), bool, int, float, str, torch.Tensor)


def _check_saveable(payload: dict[str, Any]) -> None:
    """Checkpoints load with ``torch.load(weights_only=True)``: only plain data may go in."""
    for path, leaf in _leaves(payload):
        if not isinstance(leaf, _CHECKPOINT_LEAVES):
            raise TypeError(
                f"checkpoint value {path} is a {type(leaf).__name__}; only tensors, numbers, "
                "strings, None and lists/tuples/dicts of them can be saved (checkpoints are "
                "read with torch.load(weights_only=True)); convert it, e.g. with int(), "
                "float() or str()"
            )


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
    plain data. If rank 0 fails to write, every rank raises the same error, instead
    of the other ranks running on into a hang.
    """
    _require_initialized("save_checkpoint")
    error = None
    if _hvd.rank() == 0:
        try:
            payload = {
                "format": CHECKPOINT_FORMAT,
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict() if optimizer is not None else None,
                "scheduler": scheduler.state_dict() if scheduler is not None else None,
                "extra": extra,
            }
            _check_saveable(payload)
            with atomic_write(path) as file:
                torch.save(payload, file)
        except Exception as failure:
            error = f"{type(failure).__name__}: {failure}"
    error = broadcast_object(error, root_rank=0, name="hvdtrain.checkpoint.saved")
    if error:
        raise RuntimeError(f"rank 0 could not write checkpoint {os.fspath(path)}: {error}")


def load_checkpoint(
    path: str | os.PathLike[str],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
) -> dict[str, Any]:
    """Read a checkpoint on rank 0 and give its state to every rank; every rank calls it.

    Rank 0 reads ``path`` with ``torch.load(weights_only=True)`` and loads it into
    its model, optimizer and scheduler; :func:`broadcast_state` then copies them to
    the other ranks. Returns the extras saved with the checkpoint (on every rank).
    A missing or unreadable file raises the same error on every rank.
    """
    _require_initialized("load_checkpoint")
    error = None
    extra: dict[str, Any] = {}
    if _hvd.rank() == 0:
        try:
            payload = _read_checkpoint(Path(path))
            model.load_state_dict(payload["model"])
            _load_part(optimizer, payload["optimizer"], "optimizer")
            _load_part(scheduler, payload["scheduler"], "scheduler")
            extra = payload["extra"]
        except Exception as failure:
            error = f"{type(failure).__name__}: {failure}"
    error = broadcast_object(error, root_rank=0, name="hvdtrain.checkpoint.loaded")
    if error:
        raise RuntimeError(f"rank 0 could not load checkpoint {os.fspath(path)}: {error}")
    return broadcast_state(model, optimizer, scheduler, root_rank=0, extra=extra)


def _read_checkpoint(path: Path) -> dict[str, Any]:
    """The checkpoint's contents, or an error saying what is wrong with the file."""
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist (or is not a file)")
    if path.stat().st_size == 0:
        raise ValueError(f"{path} is empty (0 bytes); it was not written by save_checkpoint, "
                         "whose writes are atomic")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        raise ValueError(f"{path} holds objects other than tensors and plain data; they are "
                         f"not unpickled (weights_only=True): {error}") from None
    except (RuntimeError, EOFError, OSError) as error:
        raise ValueError(f"{path} is truncated or not a PyTorch file ({error})") from None
    if not isinstance(payload, dict) or payload.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path} is a PyTorch file but not an hvdtrain checkpoint (it lacks "
                         f"format {CHECKPOINT_FORMAT!r}); write checkpoints with save_checkpoint")
    return payload


def _load_part(target: Any, state: dict | None, what: str) -> None:
    if target is None:
        return
    if state is None:
        raise ValueError(f"the checkpoint has no {what} state, but a {what} was passed")
    target.load_state_dict(state)


# --------------------------------------------------------------------------- data, metrics


def average_metrics(metrics: Mapping[str, float | torch.Tensor]) -> dict[str, float]:
    """The mean of each metric over all ranks, identical on every rank.

    Every rank must pass the same keys (a mismatch raises ValueError on every rank);
    values are numbers or one-element tensors. Example::

        logs = hvt.average_metrics({"loss": total_loss / batches, "accuracy": accuracy})
    """
    _require_initialized("average_metrics")
    mine = {key: _metric_value(key, value) for key, value in metrics.items()}
    return average_by_key(_guarded_allgather_object(mine, "hvdtrain.metrics"))


def _metric_value(key: str, value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"average_metrics: metric {key!r} must be a number or a one-element "
                        f"tensor, got {value!r}") from None


def distributed_sampler(dataset: torch.utils.data.Dataset, *, shuffle: bool = True,
                        seed: int = 0) -> torch.utils.data.distributed.DistributedSampler:
    """A sampler giving this rank its share of one shuffle per epoch (Goyal et al. §3).

    Every rank draws the same permutation (from ``seed`` and the epoch) and takes
    every size()-th index of it. Call ``sampler.set_epoch(epoch)`` at the start of
    each epoch, or every epoch repeats the first one's order. If the dataset does not
    divide evenly, a few examples are repeated so every rank has as many batches.
    """
    _require_initialized("distributed_sampler")
    require_instance("seed", seed, int, "an int (the same on every rank)")
    return torch.utils.data.distributed.DistributedSampler(
        dataset, num_replicas=_hvd.size(), rank=_hvd.rank(), shuffle=shuffle, seed=seed
    )

