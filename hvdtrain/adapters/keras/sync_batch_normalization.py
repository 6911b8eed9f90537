"""``SyncBatchNormalization``: batch normalization with the statistics of the global
batch, for Keras 3 on Horovod."""

from __future__ import annotations

from typing import Any

import keras
from keras import ops

from hvdtrain.adapters.keras import backend, reduction

__all__ = ["SyncBatchNormalization"]


@keras.saving.register_keras_serializable(package="hvdtrain")
class SyncBatchNormalization(keras.layers.BatchNormalization):
    """``keras.layers.BatchNormalization`` whose training statistics are those of the
    global batch: every worker's examples, as one process would see them.

    In training each worker sums its examples (and counts them) over the normalized
    axes; one allreduce gives the global mean, a second the global variance from the
    squared deviations (two passes, so large means lose no precision to
    E[x²] - E[x]²). Counting the examples makes a short last batch on one worker
    weigh what it holds. The allreduces are differentiable, so the gradient is that of
    the global batch too. Outside training, and with one worker, it is
    BatchNormalization. Same arguments (``synchronized``, a ``tf.distribute`` option,
    must stay False).

    Horovod's own ``SyncBatchNormalization`` cannot be built on Keras 3 (it passes
    ``fused=``, which Keras 3 refuses).

    Example::

        model = keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Conv2D(16, 3),
                                  hvk.SyncBatchNormalization(), keras.layers.ReLU()])
    """

    def __init__(self, **kwargs: Any) -> None:
        if kwargs.get("synchronized"):
            raise ValueError("synchronized=True is tf.distribute's synchronization; "
                             "SyncBatchNormalization synchronizes over Horovod's workers "
                             "itself: leave it False")
        super().__init__(**kwargs)

    def _moments(self, inputs: Any, mask: Any) -> tuple[Any, Any]:
        hvd = backend.horovod()
        if not hvd.is_initialized() or hvd.size() == 1:
            return super()._moments(inputs, mask)
        axes = self._reduction_axes
        if mask is None:
            weights = ops.ones_like(inputs)
        else:
            weights = ops.cast(ops.broadcast_to(ops.expand_dims(mask, -1), ops.shape(inputs)),
                               inputs.dtype)
        name = f"hvdtrain.sync_batch_norm.{self.name}"
        totals = reduction.sum_over_ranks(
            ops.stack([ops.sum(inputs * weights, axes), ops.sum(weights, axes)]), name + ".sum")
        count = ops.maximum(totals[1], 1.0)
        mean = totals[0] / count
        deviation = (inputs - ops.reshape(mean, self._broadcast_shape(inputs))) * weights
        variance = reduction.sum_over_ranks(ops.sum(ops.square(deviation), axes),
                                              name + ".variance") / count
        return mean, variance

    def _broadcast_shape(self, inputs: Any) -> list[int]:
        """The shape that lines the per-feature mean up with ``inputs``."""
        shape = [1] * len(inputs.shape)
        shape[self.axis] = inputs.shape[self.axis]
        return shape
