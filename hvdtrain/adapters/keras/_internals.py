"""Every private Keras API the Keras adapter relies on, in one place.

Checked against Keras 3.15 (the version in constraints.txt); look here first when a
newer Keras breaks the adapter. Overridden in the distributed optimizer class
(:mod:`hvdtrain.adapters.keras.optimizer`):

- ``Optimizer._clip_gradients(grads)``: called once per update with the final
  gradients (after loss-scale unscaling and gradient accumulation), before clipping;
  the allreduce goes here.
- ``Optimizer._apply_weight_decay(variables)`` and
  ``Optimizer._backend_update_step(grads, variables, learning_rate)``: the weight
  decay and the update that ``skip_nonfinite`` makes conditional.

Read through the functions below:

- ``Optimizer._learning_rate``: the rate or the ``LearningRateSchedule`` as given.
- ``Optimizer._accumulated_gradients``: the gradient-accumulation buffers, which
  hold each worker's own micro-batch gradients and so differ between replicas.
- ``keras.src.backend.common.global_state``'s ``dtype_policy``: the global policy
  as set, read without ``keras.config.dtype_policy()``, which fixes it at the current
  floatx when unset (and so changes what later layers compute in).

Overridden in :class:`~hvdtrain.adapters.keras.SyncBatchNormalization`:
``BatchNormalization._moments(inputs, mask)`` (the training statistics), reading
``_reduction_axes`` (set in ``build``) and ``axis`` (an int in Keras 3).

Overridden in :class:`~hvdtrain.adapters.keras.ModelCheckpoint`:
``ModelCheckpoint._save_model(epoch, batch, logs)`` (called when a save is due),
using ``_get_file_path`` and ``_should_save_model`` (which also updates ``best``).

Public but relied on for more than their documentation promises:
``Model.train_function`` (replaced by ``CollectiveWatchdog``), and assigning
``optimizer.__class__`` of a loaded model (``load_model``).
"""

from __future__ import annotations

from typing import Any

import keras


def has_schedule(optimizer: keras.optimizers.Optimizer) -> bool:
    """Whether the optimizer's learning rate is a ``LearningRateSchedule``."""
    return isinstance(optimizer._learning_rate,
                      keras.optimizers.schedules.LearningRateSchedule)


def accumulator_ids(optimizer: keras.optimizers.Optimizer) -> set[int]:
    """``id()`` of each gradient-accumulation variable (empty without accumulation)."""
    accumulators: list[Any] = getattr(optimizer, "_accumulated_gradients", None) or []
    return {id(variable) for variable in accumulators}


def global_policy_name() -> str | None:
    """The global dtype policy's name if one was set (or fixed by a layer), else None."""
    from keras.src.backend.common import global_state

    policy = global_state.get_global_attribute("dtype_policy", None)
    return None if policy is None else policy.name
