"""Reading and setting an optimizer's learning rate, with Goyal et al.'s momentum
correction: what every learning-rate callback here does."""

from __future__ import annotations

import keras
from keras import ops


def learning_rate(optimizer: keras.optimizers.Optimizer) -> float:
    """The optimizer's current learning rate."""
    return float(ops.convert_to_numpy(optimizer.learning_rate))


def set_learning_rate(optimizer: keras.optimizers.Optimizer, new: float, *,
                      momentum_correction: bool) -> None:
    """Set the rate to ``new``; with ``momentum_correction``, scale the velocity of
    Keras's SGD (v = m·v - lr·g, the rate inside the velocity) by new/old, Goyal et
    al.'s remark 2. Other optimizers' slots are left alone."""
    old = learning_rate(optimizer)
    if new == old:
        return
    optimizer.learning_rate = new
    if (momentum_correction and isinstance(optimizer, keras.optimizers.SGD)
            and optimizer.momentum and optimizer.built and old):
        for velocity in optimizer.momentums:
            velocity.assign(velocity * (new / old))
