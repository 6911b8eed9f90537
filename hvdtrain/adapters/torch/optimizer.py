"""``DistributedOptimizer``: Horovod's gradient averaging for any torch optimizer, with
hvdtrain's additions (averaging over micro-batches, bf16 on the wire, the start-time
agreement check of :mod:`.consistency`, the non-finite check, the collective watchdog).
This module checks the arguments and builds the optimizer, an instance of a subclass of
the user's optimizer class whose behaviour comes from one of hvdtrain's classes, read
top-down: :class:`.hooks.BackwardHooks` (the per-gradient hooks over Horovod's
collectives) → :class:`.averaging.GradientAveraging` (the averaged, checked step) →
:class:`.sharding.ShardedState` (``shard_state``, ZeRO stage 1) →
:class:`.sharded_gradients.ShardedGradients` (``shard_gradients``, stage 2)."""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any

import horovod.torch as _hvd
import torch
from horovod.torch import Adasum, Average, ProcessSet, Sum, global_process_set

from hvdtrain.adapters.torch._horovod import collective
from hvdtrain.adapters.torch.averaging import GradientAveraging
from hvdtrain.adapters.torch.compression import compression_name, horovod_compression
from hvdtrain.adapters.torch.consistency import check_start_agreement, named_parameters_of
from hvdtrain.adapters.torch.sharded_gradients import ShardedGradients
from hvdtrain.adapters.torch.sharding import ShardedState, require_elementwise
from hvdtrain.collective import require_initialized
from hvdtrain.compression import require_bfloat16_reduction, wire_format
from hvdtrain.consistency import software_versions
from hvdtrain.nonfinite import NonFiniteGradientError
from hvdtrain.runtime import elastic_job
from hvdtrain.validation import (
    require_instance,
    require_positive_int,
    require_positive_number,
)

__all__ = ["DistributedOptimizer", "NonFiniteGradientError"]


def DistributedOptimizer(
    optimizer: torch.optim.Optimizer,
    named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
    *,
    compression: Any = None,
    backward_passes_per_step: int = 1,
    average_aggregated_gradients: bool = False,
    op=Average,
    groups: int | list[list[torch.Tensor]] | None = None,
    skip_nonfinite: bool = False,
    check_nonfinite: bool = True,
    overlap: bool | None = None,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    sparse_as_dense: bool = False,
    process_set: ProcessSet = global_process_set,
    shard_state: bool = False,
    shard_gradients: bool = False,
) -> torch.optim.Optimizer:
    """Wrap ``optimizer`` so that its gradients are averaged over all workers.

    Returns an instance of a subclass of ``type(optimizer)`` with the same param
    groups and state: ``step``, ``zero_grad``, ``state_dict``, ``load_state_dict``,
    ``add_param_group`` behave as before. The gradients are averaged either during
    ``backward()``, each allreduce starting as soon as its gradient is ready
    (Horovod's hooks and tensor fusion), or when ``step()`` (or ``synchronize()``) is
    called, all of a dtype copied into one contiguous buffer and averaged by one
    allreduce; see ``overlap``.

    Args:
        optimizer: any ``torch.optim.Optimizer``.
        named_parameters: ``model.named_parameters()``; names the allreduces and the
            parameters in error messages.
        compression: None, "fp16" (Horovod's fp16 allreduce) or "bf16" (bfloat16 on the
            wire, reduced by Horovod's allreduce with hvdtrain's patch 0011-bfloat16;
            on a Horovod without it, through Horovod's allgather, which carries fewer
            bytes than a float32 allreduce only up to 3 workers). Horovod's
            ``Compression.none``/``Compression.fp16`` are accepted too. Parameters that
            are bfloat16 themselves need the patch, and travel as they are.
        backward_passes_per_step: micro-batches accumulated per step. As in Horovod,
            their gradients are summed (autograd's accumulation) and the sum averaged
            over the workers, so the script divides its loss by N, as Horovod's
            examples do; with ``average_aggregated_gradients`` they are averaged.
        average_aggregated_gradients: hvdtrain's way (Horovod's TensorFlow name): the
            applied gradient is the mean over the micro-batches and the workers, so the
            loss needs no division and ``LinearScalingWarmup``'s k, which counts the
            micro-batches, matches it.
        op: ``Average`` (default), ``Sum`` or ``Adasum``.
        groups: Horovod's explicit allreduce grouping (an int or lists of parameters).
        skip_nonfinite: skip, on every rank alike, a step whose averaged gradient has a
            NaN or Inf; ``optimizer.skipped_steps`` counts them.
        check_nonfinite: without ``skip_nonfinite``, raise NonFiniteGradientError (on every
            rank, naming the parameter and step) when the averaged gradient has a NaN or
            Inf. In the flat allreduce each rank's L2 norm, taken as the gradients are
            copied, travels with them and bounds the average, so the averaged
            gradients are read only when that bound is not finite and small enough
            (with per-tensor allreduces they are always read; the costs are in
            benchmarks/README.md); pass False to drop it.
        overlap: True starts each gradient's allreduce during ``backward()``, to
            overlap communication with the rest of the backward pass; False sends all
            gradients in one allreduce (per dtype) after it. None (default) overlaps when
            the parameters live on an accelerator and groups otherwise: on the CPU the
            allreduce needs the very cores the backward pass is using, so starting it
            early only interleaves the two and adds a synchronisation with the other
            ranks per tensor (benchmarks/README.md, measures both). ``groups`` (and
            ``compression="bf16"`` without the bfloat16 patch) imply per-tensor
            allreduces. After a rank called ``join()`` the average is over the ranks
            that sent gradients, on both paths
            (Horovod's per-tensor average divides by every rank; here a count of the
            ranks travels with the first gradients), except for sparse gradients
            without ``sparse_as_dense`` and bf16 through the allgather, which are not
            rescaled.
        gradient_predivide_factor: Horovod's: with ``op=Average``, each rank divides its
            gradient by this factor before the sum and the sum is multiplied by
            factor / size after it (same mean, other rounding).
        num_groups: Horovod's deprecated spelling of an int ``groups``.
        sparse_as_dense: Horovod's: send sparse gradients (embeddings) as dense tensors
            instead of allgathering their values and indices.
        process_set: Horovod's: average over the ranks of this process set only (every
            rank of it must wrap its optimizer; ranks outside it do not take part).
        shard_state: keep only a 1/N slice of the optimizer state on each of the N
            workers (ZeRO stage 1): the gradients are averaged as without it, each worker
            steps its slice of every param group's flattened parameters, and broadcasts
            it into the others'. ``optimizer.state`` then holds this worker's slice;
            ``state_dict()`` gathers the whole state in the unsharded format (every worker
            must call it) and ``load_state_dict`` takes this worker's slice of one, so
            checkpoints move freely between sharded and unsharded runs on any number of
            workers. For optimizers whose update is elementwise (SGD, Adam, AdamW,
            RMSprop, ...; others are refused). The trained parameters become views into
            one buffer per param group; convert or move the model before wrapping. Not
            with Adasum, ``step(closure)`` or uneven shares (``join()``); in elastic
            jobs through :class:`.elastic.TorchState`, which re-shards on a reset.
        shard_gradients: also reduce only each worker's slice of the gradients (ZeRO
            stage 2; implies ``shard_state``): one reduce-scatter instead of the allreduce,
            so a step moves an allreduce's bytes in all instead of one and a half. After
            ``synchronize()`` this worker's slice of the averaged gradients is what
            ``step()`` applies and the parameters' ``p.grad`` hold NaN, so nothing reads
            them as averaged: clip with ``optimizer.clip_grad_norm_`` (the norm over
            every slice); a gradient changed after ``synchronize()`` (torch's
            ``clip_grad_norm_``, ``GradScaler.unscale_``) makes ``step()`` raise. After
            ``step()`` the gradients are None. Not with ``overlap=True``, ``groups`` or
            bf16 compression (they average during ``backward()``), nor sparse gradients.

    Returns:
        The distributed optimizer; ``skipped_steps`` and ``steps_taken`` count its steps.

    Raises:
        ParameterMismatchError: on every rank, when the ranks' parameters differ in
            names, shapes or dtypes (names the rank, the parameter and both values).
            This check and the next are one collective at construction, skipped in
            Horovod elastic jobs (``HOROVOD_ELASTIC=1``).
        RankDisagreementError: on every rank, when the ranks' settings or software differ.
        ValueError: for an invalid argument, including ``named_parameters`` with
            duplicate names or missing some of the optimizer's parameters (checked
            before anything else, as Horovod does).

    With ``torch.amp.GradScaler``, call ``optimizer.synchronize()`` before
    ``scaler.unscale_(optimizer)``, then ``scaler.step(optimizer)`` inside ``with
    optimizer.skip_synchronize():`` (Horovod's pattern; without it, ``step()`` warns).
    """
    require_instance("optimizer", optimizer, torch.optim.Optimizer,
                     "a torch.optim.Optimizer, e.g. torch.optim.SGD(model.parameters(), lr=0.1)")
    named = named_parameters_of(optimizer, named_parameters)
    require_initialized(collective(), "DistributedOptimizer")
    compression = compression_name(compression)
    require_positive_int("backward_passes_per_step", backward_passes_per_step)
    require_instance("average_aggregated_gradients", average_aggregated_gradients, bool,
                     "True (the mean over micro-batches) or False (their sum, Horovod's)")
    if op not in (Average, Sum, Adasum):
        raise ValueError("op must be hvt.Average, hvt.Sum or hvt.Adasum")
    bf16_gathered = compression == "bf16" and not wire_format("bf16").reduced_natively
    if bf16_gathered and groups is not None:
        raise ValueError("compression='bf16' cannot be combined with groups on a Horovod "
                         "without hvdtrain's patch 0011-bfloat16 (its grouped allreduce has "
                         "no bfloat16 path); drop one of them, or build the patched Horovod "
                         "with `scripts/build-horovod.sh --install`")
    if any(p.dtype == torch.bfloat16 for _, p in named):
        require_bfloat16_reduction("A DistributedOptimizer over bfloat16 parameters")
    if op == Adasum and (backward_passes_per_step > 1 or skip_nonfinite
                         or compression == "bf16"):
        raise ValueError("op=Adasum is passed straight to Horovod's Adasum optimizer; it does "
                         "not support backward_passes_per_step > 1, skip_nonfinite or bf16")
    if overlap is False and groups is not None:
        raise ValueError("groups sets how the allreduces started during backward() are "
                         "grouped, so it needs overlap=True (or None); drop one of them")
    if overlap not in (None, True, False):
        raise ValueError(f"overlap must be True, False or None (automatic), got {overlap!r}")
    require_positive_number("gradient_predivide_factor", gradient_predivide_factor)
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor splits an average into a pre- and a "
                         "post-scaling, so it needs op=hvt.Average (or leave it at 1.0)")
    require_instance("process_set", process_set, ProcessSet,
                     "a Horovod process set, e.g. hvt.add_process_set([0, 1])")
    require_instance("shard_state", shard_state, bool,
                     "True (each worker keeps a slice of the optimizer state) or False")
    require_instance("shard_gradients", shard_gradients, bool,
                     "True (each worker reduces and keeps a slice of the gradients) or False")
    if shard_gradients and (overlap or groups is not None or bf16_gathered):
        raise ValueError("shard_gradients=True reduce-scatters the gradients after "
                         "backward(), so it cannot go with overlap=True, groups or (on a "
                         "Horovod without hvdtrain's patch 0011-bfloat16) compression='bf16', "
                         "which average them during it; drop one of them")
    if shard_state or shard_gradients:
        _require_shardable(optimizer, op=op)
    if num_groups:
        warnings.warn("num_groups is Horovod's deprecated spelling of groups; pass "
                      f"groups={num_groups} instead", DeprecationWarning, stacklevel=2)
        groups = num_groups if groups is None else groups
    _require_groups(groups)

    if overlap is None:
        overlap = not shard_gradients and (groups is not None or bf16_gathered or any(
            p.device.type != "cpu" for _, p in named))
    # A rank outside the process set trains on its own gradients (Horovod's meaning), so
    # it has no one to agree with. In an elastic job a worker that joins later builds its
    # optimizer while the others are inside hvd.elastic.run: a collective here would hang.
    if process_set.included() and not elastic_job():
        check_start_agreement(named, process_set, {
            "optimizer class": type(optimizer).__name__,
            "number of param groups": len(optimizer.param_groups),
            "backward_passes_per_step": backward_passes_per_step,
            "average_aggregated_gradients": average_aggregated_gradients,
            "compression": compression,
            "op": int(op),
            "skip_nonfinite": skip_nonfinite,
            "overlap": overlap,
            "gradient_predivide_factor": gradient_predivide_factor,
            "sparse_as_dense": sparse_as_dense,
            "shard_state": shard_state,
            "shard_gradients": shard_gradients,
            **software_versions("torch", "horovod"),
        })
    if op == Adasum:
        return _hvd.DistributedOptimizer(optimizer, named,
                                         compression=horovod_compression(compression), op=Adasum,
                                         process_set=process_set)
    return distributed_class(type(optimizer), shard_state, shard_gradients)(
        optimizer, named, compression=compression,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients, op=op, groups=groups,
        skip_nonfinite=skip_nonfinite, check_nonfinite=check_nonfinite, overlap=overlap,
        gradient_predivide_factor=gradient_predivide_factor, sparse_as_dense=sparse_as_dense,
        process_set=process_set)


def averaging_class(shard_state: bool = False, shard_gradients: bool = False
                    ) -> type[GradientAveraging]:
    """hvdtrain's class for these settings (``shard_gradients`` implies ``shard_state``)."""
    if shard_gradients:
        return ShardedGradients
    return ShardedState if shard_state else GradientAveraging


def distributed_class(base: type[torch.optim.Optimizer], shard_state: bool = False,
                      shard_gradients: bool = False) -> type:
    """The class of the distributed optimizer over ``base`` (the user's optimizer
    class): hvdtrain's :func:`averaging_class` first, then ``base``, so that the
    averaged step ends in ``base``'s own step. It defines nothing itself."""
    return type(base.__name__, (averaging_class(shard_state, shard_gradients), base),
                {"__doc__": f"{base.__name__} with gradients averaged over Horovod workers.",
                 "__module__": base.__module__})


def _require_shardable(optimizer: torch.optim.Optimizer, *, op) -> None:
    """Raise, saying what to change, unless ``shard_state=True`` can go with the rest."""
    require_elementwise(optimizer)
    if op == Adasum:
        raise ValueError("shard_state=True cannot be combined with op=hvt.Adasum: Adasum "
                         "combines whole gradients in its own optimizer; drop one of them")


def _require_groups(groups: int | list[list[torch.Tensor]] | None) -> None:
    """Raise ValueError, saying what is wrong, unless ``groups`` is None, a positive
    number of groups, or lists of parameters in which each parameter appears once."""
    if groups is None or (isinstance(groups, int) and not isinstance(groups, bool)
                          and groups > 0):
        return
    if not isinstance(groups, list) or not all(isinstance(group, list | tuple)
                                               for group in groups):
        raise ValueError(f"groups must be a positive number of groups or a list of lists of "
                         f"parameters, got {groups!r}")
    seen: set[int] = set()
    for group in groups:
        for parameter in group:
            if not isinstance(parameter, torch.Tensor):
                raise ValueError(f"groups must hold parameters (torch.Tensor), got "
                                 f"{type(parameter).__name__}")
            if id(parameter) in seen:
                raise ValueError("a parameter appears in more than one of groups' lists (or "
                                 "twice in one); give each parameter one group")
            seen.add(id(parameter))

