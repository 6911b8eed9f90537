"""``JoinAtEpochEnd``: training shares that give the workers different numbers of batches."""

from __future__ import annotations

import keras
from keras import ops

from hvdtrain import horovod_patches
from hvdtrain.adapters.keras import backend, collectives
from hvdtrain.adapters.keras.optimizer import gradient_compression
from hvdtrain.collective import gather, require_initialized


class JoinAtEpochEnd(keras.callbacks.Callback):
    """Train with ``fit`` on shares that give the workers different numbers of batches.

    After its last batch of an epoch, a worker joins (Horovod's ``join``) and waits.
    Meanwhile it sends zeros to the gradient allreduces of the workers still training,
    which average over the workers that sent gradients (a 1 sent with the gradients
    counts them), as one process on those batches would. When every worker has joined,
    the one that took the most steps gives the others its weights and optimizer state,
    so every replica ends the epoch, and starts the next, identical. All of this happens
    before validation and before any callback's ``on_epoch_end``, so ``MetricAverage``,
    ``ReplicaCheck`` and ``ModelCheckpoint`` work unchanged (give ``MetricAverage`` this
    worker's ``examples`` so that each share counts by its size; LinearScalingWarmup
    counts the longest share's batches as the epoch).

    A worker's last batch, if smaller, weighs as much as a full one in its step's
    average. Not with ``compression="bf16"`` (an allgather, which Horovod cannot pair
    with a joined worker), nor with callbacks that exchange values after every batch.
    Where ``fit`` does not know the number of batches (a dataset of unknown length),
    pass ``steps_per_epoch`` to ``fit``.

    Example::

        model.fit(x_shard, y_shard, batch_size=32, epochs=5, callbacks=[
            hvk.BroadcastInitialState(), hvk.JoinAtEpochEnd(),
            hvk.MetricAverage(examples=len(x_shard))])
    """

    def on_train_begin(self, logs=None) -> None:
        """Refuse what cannot work with a joined worker, or on this Horovod."""
        require_initialized(backend.collective(), "JoinAtEpochEnd")
        if (keras.backend.backend() == "tensorflow"
                and not horovod_patches.has_patch(horovod_patches.STATEFUL_JOIN)):
            raise RuntimeError(horovod_patches.missing_patch_message(
                "JoinAtEpochEnd on Keras's TensorFlow backend", horovod_patches.STATEFUL_JOIN,
                "without it TensorFlow runs a rank's join only once per process, so the "
                "second epoch's join would return at once and the job would hang; train on "
                "shares of equal length instead, or use the torch backend"))
        if gradient_compression(self.model.optimizer) == "bf16":
            raise ValueError("JoinAtEpochEnd cannot be used with compression='bf16' (an "
                             "allgather, which Horovod's join does not support); use None or "
                             "'fp16'")
        if not self.params.get("steps"):
            raise ValueError("JoinAtEpochEnd needs the number of batches per epoch, which fit "
                             "does not know for this data; pass steps_per_epoch= to fit")

    def on_train_batch_end(self, batch: int, logs=None) -> None:
        """After this worker's last batch of the epoch: join, then align the replicas."""
        if batch + 1 >= self.params["steps"]:
            join_and_align(self.model)


def join_and_align(model: keras.Model) -> None:
    """Wait until every worker has called this (Horovod's ``join``: meanwhile this worker
    sends zeros to the others' allreduces), then give every worker the weights and
    optimizer state of the one whose optimizer took the most steps (no broadcast when they
    all took as many). Horovod's join is global: every rank of the job must call it."""
    collectives.join()
    optimizer = model.optimizer
    steps = gather(backend.collective(), int(ops.convert_to_numpy(optimizer.iterations)),
                                       "hvdtrain.join.steps")
    if len(set(steps)) > 1:
        collectives.broadcast_variables(list(model.variables) + list(optimizer.variables),
                                        root_rank=steps.index(max(steps)))
