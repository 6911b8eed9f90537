"""``DistributedOptimizer``: any Keras 3 optimizer, its gradients averaged across
workers with one collective per update (and ``make_distributed`` for the
optimizer of a loaded model)."""

from __future__ import annotations

from typing import Any

import keras
from keras.optimizers import LossScaleOptimizer

from hvdtrain.adapters.keras import _internals
from hvdtrain.adapters.keras.distributed_classes import (
    NO_LOSS_SCALED_ACCUMULATION,
    distributed_class,
    distributed_loss_scale,
    is_distributed,
    loss_scale_class,
    reduction_of,
)
from hvdtrain.adapters.keras.reduction import checked_reduction
from hvdtrain.nonfinite import TAPE_REMEDY, NonFinitePolicy
from hvdtrain.validation import (
    require_instance,
    require_positive_int,
)

__all__ = ["DistributedOptimizer", "PartialDistributedOptimizer", "accumulate_across_workers",
           "gradient_compression", "make_distributed", "require_agreeing_loss_scaling"]


def DistributedOptimizer(
    optimizer: keras.optimizers.Optimizer,
    name: str | None = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = None,
    sparse_as_dense: bool = False,
    gradient_predivide_factor: float = 1.0,
    op: Any = None,
    backward_passes_per_step: int = 1,
    average_aggregated_gradients: bool = False,
    num_groups: int = 0,
    groups: Any = None,
    process_set: Any = None,
    scale_local_gradients: bool = True,
    *,
    skip_nonfinite: bool = False,
    check_nonfinite: bool = True,
) -> keras.optimizers.Optimizer:
    """A copy of ``optimizer`` (same class and configuration) that averages gradients.

    Every update averages the gradients across workers in one collective (one flat
    buffer on TensorFlow's CPU, else one grouped allreduce), then clips and applies
    them as the original would. An averaged gradient holding NaN or Inf stops training
    on every rank with an error naming the optimizer step. Use it in ``model.compile``
    with ``jit_compile=False`` (Horovod's ops have no XLA kernels here).

    Args:
        optimizer: any Keras 3 optimizer, not yet used (wrap before ``fit``; to
            continue a saved model use :func:`hvdtrain.adapters.keras.load_model`).
        name: the optimizer's name (Horovod's argument; default: the original's).
        device_dense, device_sparse: accepted for Horovod's signature; unused.
        compression: None, "fp16", or "bf16" (bfloat16, reduced by Horovod's allreduce
            with hvdtrain's patch 0011-bfloat16; without it, through one allgather, which
            carries fewer bytes than float32 only up to 3 workers);
            Horovod's ``hvk.Compression.none`` / ``.fp16`` mean None / "fp16".
        sparse_as_dense: accepted; sparse (embedding) gradients are always reduced as
            dense tensors here, which gives the same average.
        gradient_predivide_factor: f, with ``op=Average``: each rank's gradients are
            divided by f before the sum and the sum multiplied by f / size() after
            (Horovod's meaning: the same average, computed with smaller numbers).
        op: ``hvk.Average`` (default) or ``hvk.Sum``.
        backward_passes_per_step: micro-batches per update, accumulated by Keras's own
            ``gradient_accumulation_steps``, with one allreduce per update; the applied
            gradient is their sum averaged over the workers (Horovod's meaning: the
            script divides its loss by N), or their mean with
            ``average_aggregated_gradients``.
        average_aggregated_gradients: True: the mean over the micro-batches and the
            workers (hvdtrain's way, what ``LinearScalingWarmup``'s k counts); False
            (Horovod's default): their sum.
        num_groups, groups: accepted; the gradients of an update always go through one
            collective here.
        process_set: average over this Horovod process set's ranks only (its ranks
            must all call it); None: every rank.
        scale_local_gradients: accepted; variables made worker-local with
            ``register_local_var`` (or :func:`PartialDistributedOptimizer`) always have
            their gradient divided by size(), Horovod's default.
        skip_nonfinite: skip, on every rank alike, an update whose averaged gradient has
            a NaN or Inf (no weight decay, no change to weights or slots) and count it in
            ``optimizer.skipped_steps``; without it such an update stops training.
        check_nonfinite: without ``skip_nonfinite``, stop training when an averaged
            gradient holds a NaN or Inf (on TensorFlow's CPU, a bound reduced with the
            gradients, :mod:`hvdtrain.adapters.keras.tally`; otherwise one sum of the
            averaged gradients; either way they are read exactly only when that number
            is not finite; the cost is in benchmarks/README.md); False applies such
            an update, as Horovod does.

    Mixed precision: under the ``mixed_float16`` policy (set before this call), or given
    a ``keras.optimizers.LossScaleOptimizer``, the result is a LossScaleOptimizer that
    averages the *scaled* gradients first and then decides, on the average, whether
    they are finite: every rank takes the same decision (apply and maybe grow the
    scale, or skip and halve it). Keras's own wrapper, which ``compile`` adds under
    that policy, decides on each rank's own gradients, so one rank's overflow sends
    the ranks down different branches and their allreduces out of step.
    ``skip_nonfinite`` does not apply there: skipping is the loss scaling's job.

    Returns:
        The distributed optimizer, an instance of a subclass of ``type(optimizer)``.
        Saving with ``model.save`` records the original optimizer class, so the file
        loads with plain ``keras.saving.load_model`` too.
    """
    require_positive_int("backward_passes_per_step", backward_passes_per_step)
    summed = not average_aggregated_gradients
    reduction = checked_reduction(compression, op, gradient_predivide_factor, process_set,
                                  backward_passes_per_step if summed else 1)
    require_instance("optimizer", optimizer, keras.optimizers.Optimizer,
                     "a Keras 3 optimizer instance, e.g. keras.optimizers.SGD(0.1)")
    if optimizer.built:
        raise ValueError("the optimizer has already been used (built); wrap it before "
                         "compile/fit, or continue a saved model with hvk.load_model(path)")
    if isinstance(optimizer, LossScaleOptimizer) or _mixed_float16():
        return distributed_loss_scale(optimizer, reduction, backward_passes_per_step)
    config = optimizer.get_config()
    if name is not None:
        config["name"] = name
    configured = config.get("gradient_accumulation_steps") or 1
    if backward_passes_per_step > 1:
        if configured not in (1, backward_passes_per_step):
            raise ValueError(
                f"the optimizer already has gradient_accumulation_steps={configured}, which "
                f"contradicts backward_passes_per_step={backward_passes_per_step}; give one")
        config["gradient_accumulation_steps"] = backward_passes_per_step
    policy = NonFinitePolicy.of(skip_nonfinite, check_nonfinite)
    return distributed_class(type(optimizer), reduction, policy).from_config(config)


def PartialDistributedOptimizer(optimizer: keras.optimizers.Optimizer, name: str | None = None,
                                device_dense: str = "", device_sparse: str = "",
                                compression: Any = None, sparse_as_dense: bool = False,
                                gradient_predivide_factor: float = 1.0, op: Any = None,
                                backward_passes_per_step: int = 1,
                                average_aggregated_gradients: bool = False,
                                groups: Any = None, process_set: Any = None,
                                local_layers: Any = None, scale_local_gradients: bool = True
                                ) -> keras.optimizers.Optimizer:
    """Horovod's: :func:`DistributedOptimizer` with the trainable variables of
    ``local_layers`` (a layer or a list) kept worker-local. Their gradients are not
    averaged but divided by size(), as Horovod's ``scale_local_gradients`` does (False
    is not supported); the other arguments are DistributedOptimizer's. Replica checks
    (``ReplicaCheck``, ``verify_replicas``) will see the local variables differ; give
    ``BroadcastGlobalVariablesCallback`` them as ``local_variables``.
    """
    if not scale_local_gradients:
        raise ValueError("scale_local_gradients=False is not supported: local gradients are "
                         "divided by size(), as Horovod does by default")
    distributed = DistributedOptimizer(
        optimizer, name, device_dense, device_sparse, compression, sparse_as_dense,
        gradient_predivide_factor, op, backward_passes_per_step, average_aggregated_gradients,
        0, groups, process_set)
    if isinstance(distributed, LossScaleOptimizer):
        raise ValueError("PartialDistributedOptimizer does not support loss scaling "
                         "(mixed_float16)")
    layers = local_layers if isinstance(local_layers, list | tuple) else [local_layers]
    for layer in layers if local_layers is not None else ():
        for variable in layer.trainable_weights:
            distributed.register_local_var(variable)
    return distributed


def make_distributed(optimizer: keras.optimizers.Optimizer, *, compression: Any = None,
                     op: Any = None, skip_nonfinite: bool = False,
                     check_nonfinite: bool = True) -> None:
    """Make an optimizer that already holds state (a loaded model's) distributed, in
    place; the arguments are :func:`DistributedOptimizer`'s."""
    reduction = checked_reduction(compression, op, 1.0, None, 1)
    if isinstance(optimizer, LossScaleOptimizer):
        optimizer.__class__ = loss_scale_class(type(optimizer), reduction)
    else:
        optimizer.__class__ = distributed_class(
            type(optimizer), reduction, NonFinitePolicy.of(skip_nonfinite, check_nonfinite))


def accumulate_across_workers(optimizer: keras.optimizers.Optimizer, passes: int, *,
                              compression: str | None, op: Any, check_nonfinite: bool
                              ) -> None:
    """Make ``optimizer`` apply the mean of ``passes`` micro-batches over all workers,
    with one allreduce per update, for gradients that are each worker's own.

    Keras accumulates the micro-batches (``gradient_accumulation_steps``); a plain
    optimizer becomes distributed in place (as :func:`make_distributed` does) and
    applies their mean; one made by :func:`DistributedOptimizer` is checked to agree
    and keeps its meaning (the sum unless ``average_aggregated_gradients=True``).

    Args:
        optimizer: the Keras optimizer that applies the gradients, made with
            ``gradient_accumulation_steps=passes`` (or ``DistributedOptimizer(opt,
            backward_passes_per_step=passes)``).
        passes: micro-batches per update, at least 2.
        compression, op: how the accumulated gradients are reduced.
        check_nonfinite: whether an averaged update holding NaN or Inf stops training
            (for a plain optimizer; a distributed one keeps its own setting).

    Raises:
        ValueError: the optimizer accumulates another number of micro-batches, scales
            its loss, or already reduces with another compression or op.
    """
    require_instance("optimizer", optimizer, keras.optimizers.Optimizer,
                     "the Keras 3 optimizer that applies these gradients")
    if isinstance(optimizer, LossScaleOptimizer):
        raise ValueError(NO_LOSS_SCALED_ACCUMULATION)
    configured = optimizer.gradient_accumulation_steps or 1
    if configured != passes:
        raise ValueError(
            f"backward_passes_per_step={passes}, but the optimizer accumulates {configured} "
            f"micro-batch(es) per update: make it with gradient_accumulation_steps={passes}, "
            f"e.g. keras.optimizers.SGD(0.1, gradient_accumulation_steps={passes}), or "
            f"hvk.DistributedOptimizer(opt, backward_passes_per_step={passes}) (Keras "
            "accumulates the micro-batches, hvdtrain averages them over the workers)")
    reduction = checked_reduction(compression, op, 1.0, None, 1)
    existing = reduction_of(optimizer)
    if existing is None:
        optimizer.__class__ = distributed_class(
            type(optimizer), reduction, NonFinitePolicy.of(False, check_nonfinite), TAPE_REMEDY)
    elif (existing.compression, existing.op) != (reduction.compression, reduction.op):
        raise ValueError(
            f"the optimizer already reduces its gradients (compression="
            f"{existing.compression!r}, op={existing.op!r}) and the tape was given "
            f"compression={compression!r}, op={op!r}: give them to one of the two")


def require_agreeing_loss_scaling(optimizer: keras.optimizers.Optimizer | None) -> None:
    """Raise ValueError if ``compile`` wrapped a distributed optimizer in Keras's own
    LossScaleOptimizer (the ``mixed_float16`` policy was set after
    :func:`DistributedOptimizer`): its ranks would decide on overflow each alone."""
    if (isinstance(optimizer, LossScaleOptimizer) and not is_distributed(optimizer)
            and is_distributed(optimizer.inner_optimizer)):
        raise ValueError(
            "compile wrapped the distributed optimizer in Keras's LossScaleOptimizer, whose "
            "ranks would each decide alone whether their gradients overflowed (and fall out "
            "of step): set the mixed_float16 policy before calling hvk.DistributedOptimizer, "
            "or give it keras.optimizers.LossScaleOptimizer(your_optimizer)")


def gradient_compression(optimizer: keras.optimizers.Optimizer | None) -> str | None:
    """The wire format of a distributed optimizer's gradients (None, "fp16" or "bf16");
    None for any other optimizer."""
    reduction = reduction_of(optimizer)
    return None if reduction is None else reduction.compression


def _mixed_float16() -> bool:
    """Whether ``compile`` would wrap the optimizer in a LossScaleOptimizer."""
    return _internals.global_policy_name() == "mixed_float16"


