"""``DistributedOptimizer``: any Keras 3 optimizer, its gradients averaged across
workers with one collective per update (and ``make_distributed`` for the
optimizer of a loaded model)."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import keras
from keras import ops
from keras.optimizers import LossScaleOptimizer

from hvdtrain.adapters.keras import _internals, collectives
from hvdtrain.nonfinite import SKIP_REMEDY, TAPE_REMEDY
from hvdtrain.validation import (
    require_compression,
    require_instance,
    require_positive_int,
    require_positive_number,
)

_NO_LOSS_SCALED_ACCUMULATION = ("backward_passes_per_step > 1 is not supported with loss "
                                "scaling (mixed_float16); accumulate in float32, or use "
                                "mixed_bfloat16")

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
        compression: None, "fp16", or "bf16" (bfloat16 through one allgather, since
            Horovod has no bfloat16 reduction; fewer bytes than float32 up to 3 workers);
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
            is not finite; the cost is in README.md, "Benchmarks"); False applies such
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
    reduction = _reduction(compression, op, gradient_predivide_factor, process_set,
                           backward_passes_per_step if summed else 1)
    require_instance("optimizer", optimizer, keras.optimizers.Optimizer,
                     "a Keras 3 optimizer instance, e.g. keras.optimizers.SGD(0.1)")
    if optimizer.built:
        raise ValueError("the optimizer has already been used (built); wrap it before "
                         "compile/fit, or continue a saved model with hvk.load_model(path)")
    if isinstance(optimizer, LossScaleOptimizer) or _mixed_float16():
        return _distributed_loss_scale(optimizer, reduction, backward_passes_per_step)
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
    return _distributed_class(type(optimizer), reduction,
                              _on_nonfinite(skip_nonfinite, check_nonfinite)).from_config(config)


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
    reduction = _reduction(compression, op, 1.0, None, 1)
    if isinstance(optimizer, LossScaleOptimizer):
        optimizer.__class__ = _loss_scale_class(type(optimizer), reduction)
    else:
        optimizer.__class__ = _distributed_class(
            type(optimizer), reduction, _on_nonfinite(skip_nonfinite, check_nonfinite))


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
        raise ValueError(_NO_LOSS_SCALED_ACCUMULATION)
    configured = optimizer.gradient_accumulation_steps or 1
    if configured != passes:
        raise ValueError(
            f"backward_passes_per_step={passes}, but the optimizer accumulates {configured} "
            f"micro-batch(es) per update: make it with gradient_accumulation_steps={passes}, "
            f"e.g. keras.optimizers.SGD(0.1, gradient_accumulation_steps={passes}), or "
            f"hvk.DistributedOptimizer(opt, backward_passes_per_step={passes}) (Keras "
            "accumulates the micro-batches, hvdtrain averages them over the workers)")
    reduction = _reduction(compression, op, 1.0, None, 1)
    existing = _reduction_of(optimizer)
    if existing is None:
        optimizer.__class__ = _distributed_class(
            type(optimizer), reduction, _on_nonfinite(False, check_nonfinite), TAPE_REMEDY)
    elif (existing.compression, existing.op) != (reduction.compression, reduction.op):
        raise ValueError(
            f"the optimizer already reduces its gradients (compression="
            f"{existing.compression!r}, op={existing.op!r}) and the tape was given "
            f"compression={compression!r}, op={op!r}: give them to one of the two")


def _on_nonfinite(skip_nonfinite: bool, check_nonfinite: bool) -> str:
    """What a distributed class does with an averaged gradient holding NaN or Inf
    (``_distributed_class``'s ``on_nonfinite``); skipping implies checking."""
    if skip_nonfinite:
        return "skip"
    return "raise" if check_nonfinite else "ignore"


@dataclasses.dataclass(frozen=True)
class _Reduction:
    """How an update's gradients are combined across workers (a cache key, so frozen)."""

    compression: str | None
    op: Any
    prescale: float = 1.0
    postscale: float = 1.0
    process_set: Any = None

    def apply(self, grads: list[Any], check_step: Any = None,
              remedy: str = SKIP_REMEDY) -> list[Any]:
        """``grads`` reduced (:func:`collectives.average_gradients`, which also takes
        ``check_step`` and ``remedy``)."""
        return collectives.average_gradients(
            grads, self.compression, self.op, prescale=self.prescale,
            postscale=self.postscale, process_set=self.process_set, check_step=check_step,
            remedy=remedy)


def _reduction(compression: Any, op: Any, predivide: float, process_set: Any,
               summed_passes: int) -> _Reduction:
    """The checked reduction for :func:`DistributedOptimizer`'s arguments."""
    hvd = collectives.horovod()
    if compression is hvd.Compression.none:
        compression = None
    elif compression is hvd.Compression.fp16:
        compression = "fp16"
    op = hvd.Average if op is None else op
    require_compression(compression)
    collectives.check_op(op)
    require_positive_number("gradient_predivide_factor", predivide)
    if predivide != 1.0 and op != hvd.Average:
        raise ValueError("gradient_predivide_factor needs op=Average (it splits the "
                         "average's division into a part before and one after the sum)")
    return _Reduction(compression, op, 1.0 / predivide, predivide * summed_passes, process_set)


def require_agreeing_loss_scaling(optimizer: keras.optimizers.Optimizer | None) -> None:
    """Raise ValueError if ``compile`` wrapped a distributed optimizer in Keras's own
    LossScaleOptimizer (the ``mixed_float16`` policy was set after
    :func:`DistributedOptimizer`): its ranks would decide on overflow each alone."""
    if (isinstance(optimizer, LossScaleOptimizer) and not _is_distributed(optimizer)
            and _is_distributed(optimizer.inner_optimizer)):
        raise ValueError(
            "compile wrapped the distributed optimizer in Keras's LossScaleOptimizer, whose "
            "ranks would each decide alone whether their gradients overflowed (and fall out "
            "of step): set the mixed_float16 policy before calling hvk.DistributedOptimizer, "
            "or give it keras.optimizers.LossScaleOptimizer(your_optimizer)")


def gradient_compression(optimizer: keras.optimizers.Optimizer | None) -> str | None:
    """The wire format of a distributed optimizer's gradients (None, "fp16" or "bf16");
    None for any other optimizer."""
    reduction = _reduction_of(optimizer)
    return None if reduction is None else reduction.compression


def _reduction_of(optimizer: keras.optimizers.Optimizer | None) -> _Reduction | None:
    """How a distributed optimizer combines its gradients; None for any other."""
    return getattr(type(optimizer), "_hvdtrain_reduction", None)


def _is_distributed(optimizer: keras.optimizers.Optimizer) -> bool:
    """Whether ``optimizer`` is one of this module's distributed classes."""
    return _reduction_of(optimizer) is not None


def _mixed_float16() -> bool:
    """Whether ``compile`` would wrap the optimizer in a LossScaleOptimizer."""
    return _internals.global_policy_name() == "mixed_float16"


def _distributed_loss_scale(optimizer: keras.optimizers.Optimizer, reduction: _Reduction,
                            backward_passes_per_step: int) -> LossScaleOptimizer:
    """``optimizer`` (or a plain one inside a LossScaleOptimizer) with the loss scaling's
    decision taken on the worker-averaged gradients."""
    if backward_passes_per_step > 1:
        raise ValueError(_NO_LOSS_SCALED_ACCUMULATION)
    if not isinstance(optimizer, LossScaleOptimizer):
        optimizer = LossScaleOptimizer(optimizer)
    inner = optimizer.inner_optimizer
    if isinstance(inner, LossScaleOptimizer) or _is_distributed(inner):
        raise ValueError("the LossScaleOptimizer wraps an optimizer that is already "
                         "distributed or scaled; give hvk.DistributedOptimizer the plain one")
    return _loss_scale_class(type(optimizer), reduction).from_config(optimizer.get_config())


@functools.cache
def _loss_scale_class(base: type, reduction: _Reduction) -> type:
    """A LossScaleOptimizer subclass that averages the scaled gradients before its
    finite check (Keras calls ``apply`` once per update, before anything else)."""

    class DistributedLossScale(base):
        _hvdtrain_reduction = reduction

        def apply(self, grads, trainable_variables=None):
            return super().apply(reduction.apply(list(grads)), trainable_variables)

    _name_like(DistributedLossScale, base)
    return DistributedLossScale


def _name_like(cls: type, base: type) -> None:
    """Name ``cls`` as ``base``: saved models name the wrapped class and load without
    hvdtrain."""
    cls.__name__ = cls.__qualname__ = base.__name__
    cls.__module__ = base.__module__
    cls.__doc__ = f"{base.__name__} with gradients averaged over Horovod workers."


@functools.cache
def _distributed_class(base: type, reduction: _Reduction, on_nonfinite: str,
                       remedy: str = SKIP_REMEDY) -> type:
    """A subclass of ``base`` that averages gradients just before clipping and the update.

    Keras 3 calls ``_clip_gradients`` once per optimizer update, with the final
    gradients (:mod:`hvdtrain.adapters.keras._internals`), so the allreduce runs once
    per update and clipping sees the worker-averaged gradient. An averaged gradient
    holding NaN or Inf: ``on_nonfinite="raise"`` stops training on every rank;
    ``"skip"`` runs the weight decay and the update only when it is finite on every
    rank, counting skipped updates in ``skipped_steps``; ``"ignore"`` applies it.
    ``remedy`` ends the error's message.
    """
    skip_nonfinite = on_nonfinite == "skip"

    class Distributed(base):
        def register_local_var(self, var: Any) -> None:
            """Keep ``var`` worker-local (Horovod's): its gradient is not averaged but
            divided by size() (Horovod's ``scale_local_gradients``)."""
            self._hvdtrain_local = getattr(self, "_hvdtrain_local", frozenset()) | {id(var)}

        def _backend_apply_gradients(self, grads, trainable_variables):
            if getattr(self, "_hvdtrain_local", None):
                # What _clip_gradients' grads are of, for telling the local ones apart.
                # Set past Keras's attribute tracking, which would count the model's
                # variables as the optimizer's (and saved optimizer state would no
                # longer load).
                object.__setattr__(self, "_hvdtrain_variables", list(trainable_variables))
            return super()._backend_apply_gradients(grads, trainable_variables)

        def _clip_gradients(self, grads):
            averaged = self._reduce(grads, self.iterations if on_nonfinite == "raise" else None)
            if skip_nonfinite:
                self._hvdtrain_update = collectives.finite_on_every_rank(averaged)
            return super()._clip_gradients(averaged)

        def _reduce(self, grads, check_step):
            local = getattr(self, "_hvdtrain_local", None)
            if not local:
                return reduction.apply(grads, check_step, remedy)
            is_local = [id(v) in local for v in self._hvdtrain_variables]
            shared = reduction.apply([None if mine else g
                                      for g, mine in zip(grads, is_local, strict=True)])
            size = collectives.horovod().size()
            reduced = [g / size if mine and g is not None else averaged
                       for g, averaged, mine in zip(grads, shared, is_local, strict=True)]
            if check_step is None:
                return reduced
            return collectives.require_finite(reduced, check_step, remedy)

        def _apply_weight_decay(self, variables):
            parent = super()._apply_weight_decay
            if not skip_nonfinite:
                return parent(variables)
            return ops.cond(self._hvdtrain_update, lambda: parent(variables), lambda: None)

        def _backend_update_step(self, grads, trainable_variables, learning_rate):
            parent = super()._backend_update_step
            if not skip_nonfinite:
                return parent(grads, trainable_variables, learning_rate)

            def skip():
                self.skipped_steps.assign_add(1)

            return ops.cond(self._hvdtrain_update,
                            lambda: parent(grads, trainable_variables, learning_rate), skip)

        def build(self, variables):
            super().build(variables)
            if skip_nonfinite:
                self.skipped_steps = self.add_variable((), dtype="int64", name="skipped_steps",
                                                       initializer="zeros")

    Distributed._hvdtrain_reduction = reduction
    _name_like(Distributed, base)
    return Distributed
