"""The distributed optimizer's class: Horovod's optimizer methods, then hvdtrain's
layers on top, chosen once, when :func:`.optimizer.DistributedOptimizer` wraps.

- :class:`.averaging.CheckedAveraging`, always: averaged, checked, watched gradients.
- :class:`.sharding.ShardedSteps`, with ``shard_state`` (ZeRO stage 1): each worker
  steps its slice of the parameters and shares it.
- :class:`.gradient_slices.SlicedGradients`, with ``shard_gradients`` (stage 2): the
  gradients reduce-scattered into those slices.

Each layer's methods replace the ones of the same name below it, and a layer calls
only its own methods and those below it (explicitly, as ``CheckedAveraging.method(self)``,
since Horovod's optimizer cannot be subclassed: its methods call
``super(self.__class__, self)``).
"""

from __future__ import annotations

from hvdtrain.adapters.torch._horovod import HorovodOptimizer
from hvdtrain.adapters.torch.averaging import CheckedAveraging
from hvdtrain.adapters.torch.gradient_slices import SlicedGradients
from hvdtrain.adapters.torch.sharding import ShardedSteps

__all__ = ["distributed_class", "layers_for"]


def layers_for(shard_state: bool, shard_gradients: bool) -> tuple[type, ...]:
    """hvdtrain's layers for these settings, lowest first (``shard_gradients`` implies
    ``shard_state``)."""
    if shard_gradients:
        return CheckedAveraging, ShardedSteps, SlicedGradients
    if shard_state:
        return CheckedAveraging, ShardedSteps
    return (CheckedAveraging,)


def distributed_class(base: type, shard_state: bool = False,
                      shard_gradients: bool = False) -> type:
    """A class with ``base`` (the user's optimizer class) as its base, Horovod's
    optimizer methods and :func:`layers_for` these settings on top."""
    methods = dict(vars(HorovodOptimizer))
    for layer in layers_for(shard_state, shard_gradients):
        methods.update((name, member) for name, member in vars(layer).items()
                       if name == "__init__" or not name.startswith("__"))
    methods["__doc__"] = f"{base.__name__} with gradients averaged over Horovod workers."
    return type(base.__name__, (base,), methods)
