"""The optimizer classes behind :func:`~hvdtrain.adapters.keras.DistributedOptimizer`:
a subclass of the user's optimizer class (cached per class and reduction) that averages
the gradients just before clipping and the update, and the ``LossScaleOptimizer``
subclass that averages before its finite check under ``mixed_float16``. Saved models
name the wrapped class, so they load without hvdtrain.
"""

from __future__ import annotations

import functools
from typing import Any

import keras
from keras import ops
from keras.optimizers import LossScaleOptimizer

from hvdtrain.adapters.keras import step_events
from hvdtrain.adapters.keras.reduction import Reduction, finite_on_every_rank, variable_names
from hvdtrain.nonfinite import SKIP_REMEDY, NonFinitePolicy

NO_LOSS_SCALED_ACCUMULATION = ("backward_passes_per_step > 1 is not supported with loss "
                               "scaling (mixed_float16); accumulate in float32, or use "
                               "mixed_bfloat16")


def reduction_of(optimizer: keras.optimizers.Optimizer | None) -> Reduction | None:
    """How a distributed optimizer combines its gradients; None for any other."""
    return getattr(type(optimizer), "_hvdtrain_reduction", None)


def is_distributed(optimizer: keras.optimizers.Optimizer) -> bool:
    """Whether ``optimizer`` is one of this module's distributed classes."""
    return reduction_of(optimizer) is not None


def distributed_loss_scale(optimizer: keras.optimizers.Optimizer, reduction: Reduction,
                            backward_passes_per_step: int) -> LossScaleOptimizer:
    """``optimizer`` (or a plain one inside a LossScaleOptimizer) with the loss scaling's
    decision taken on the worker-averaged gradients."""
    if backward_passes_per_step > 1:
        raise ValueError(NO_LOSS_SCALED_ACCUMULATION)
    if not isinstance(optimizer, LossScaleOptimizer):
        optimizer = LossScaleOptimizer(optimizer)
    inner = optimizer.inner_optimizer
    if isinstance(inner, LossScaleOptimizer) or is_distributed(inner):
        raise ValueError("the LossScaleOptimizer wraps an optimizer that is already "
                         "distributed or scaled; give hvk.DistributedOptimizer the plain one")
    return loss_scale_class(type(optimizer), reduction).from_config(optimizer.get_config())


@functools.cache
def loss_scale_class(base: type, reduction: Reduction) -> type:
    """A LossScaleOptimizer subclass that averages the scaled gradients before its
    finite check (Keras calls ``apply`` once per update, before anything else)."""

    class DistributedLossScale(base):
        _hvdtrain_reduction = reduction

        def apply(self, grads, trainable_variables=None):
            averaged, _ = reduction.observed(list(grads), self.iterations, last=True)
            return super().apply(averaged, trainable_variables)

    _name_like(DistributedLossScale, base)
    return DistributedLossScale


def _name_like(cls: type, base: type) -> None:
    """Name ``cls`` as ``base``: saved models name the wrapped class and load without
    hvdtrain."""
    cls.__name__ = cls.__qualname__ = base.__name__
    cls.__module__ = base.__module__
    cls.__doc__ = f"{base.__name__} with gradients averaged over Horovod workers."


@functools.cache
def distributed_class(base: type, reduction: Reduction, on_nonfinite: NonFinitePolicy,
                       remedy: str = SKIP_REMEDY) -> type:
    """A subclass of ``base`` that averages gradients just before clipping and the update.

    Keras 3 calls ``_clip_gradients`` once per optimizer update, with the final
    gradients (:mod:`hvdtrain.adapters.keras._internals`), so the allreduce runs once
    per update and clipping sees the worker-averaged gradient. An averaged gradient
    holding NaN or Inf (:class:`hvdtrain.nonfinite.NonFinitePolicy`): ``RAISE`` stops
    training on every rank, with a message naming the variable and ending with
    ``remedy``; ``SKIP`` runs the weight decay and the update only when it is finite on
    every rank, counting skipped updates in ``skipped_steps``; ``IGNORE`` applies it.
    """
    on_nonfinite = NonFinitePolicy(on_nonfinite)
    skip_nonfinite = on_nonfinite.skips

    class Distributed(base):
        def register_local_var(self, var: Any) -> None:
            """Keep ``var`` worker-local (Horovod's): its gradient is not averaged but
            divided by size() (Horovod's ``scale_local_gradients``)."""
            self._hvdtrain_local = getattr(self, "_hvdtrain_local", frozenset()) | {id(var)}

        def _backend_apply_gradients(self, grads, trainable_variables):
            # What _clip_gradients' grads are of: their names for the non-finite error,
            # and which are local. Set past Keras's attribute tracking, which would count
            # the model's variables as the optimizer's (and saved optimizer state would
            # no longer load).
            object.__setattr__(self, "_hvdtrain_variables", list(trainable_variables))
            return super()._backend_apply_gradients(grads, trainable_variables)

        def _clip_gradients(self, grads):
            raises = on_nonfinite is NonFinitePolicy.RAISE
            variables = getattr(self, "_hvdtrain_variables", None)
            local = getattr(self, "_hvdtrain_local", None)
            averaged, told = reduction.observed(
                grads, self.iterations, check_step=self.iterations if raises else None,
                remedy=remedy, names=_variable_names(variables, len(grads)),
                local=[id(v) in local for v in variables] if local else None)
            # What the update step tells the observers, past Keras's attribute tracking.
            object.__setattr__(self, "_hvdtrain_told", told)
            if skip_nonfinite:
                self._hvdtrain_update = finite_on_every_rank(averaged)
            return super()._clip_gradients(averaged)

        def _apply_weight_decay(self, variables):
            parent = super()._apply_weight_decay
            if not skip_nonfinite:
                return parent(variables)
            return ops.cond(self._hvdtrain_update, lambda: parent(variables), lambda: None)

        def _backend_update_step(self, grads, trainable_variables, learning_rate):
            parent = super()._backend_update_step
            if not skip_nonfinite:
                result, applied = parent(grads, trainable_variables, learning_rate), True
            else:
                def skip():
                    self.skipped_steps.assign_add(1)

                result = ops.cond(self._hvdtrain_update,
                                  lambda: parent(grads, trainable_variables, learning_rate),
                                  skip)
                applied = self._hvdtrain_update
            step_events.step_finished(self._hvdtrain_told, applied)
            return result

        def build(self, variables):
            super().build(variables)
            if skip_nonfinite:
                self.skipped_steps = self.add_variable((), dtype="int64", name="skipped_steps",
                                                       initializer="zeros")

    Distributed._hvdtrain_reduction = reduction
    _name_like(Distributed, base)
    return Distributed


def _variable_names(variables: list[Any] | None, count: int) -> list[str] | None:
    """The names of the ``count`` gradients' variables (:func:`.reduction.variable_names`),
    or None when they are not known (the update did not come through ``apply``)."""
    if variables is None or len(variables) != count:
        return None
    return variable_names(variables)
