"""Keras 3 on Horovod: ``import hvdtrain.adapters.keras as hvk``.

Horovod's own ``horovod.tensorflow.keras`` does not average gradients on Keras 3
(its optimizer wrapper overrides methods Keras 3 never calls) and its callbacks use
Keras 2 APIs. This adapter works with Keras 3 on the TensorFlow backend (through
``horovod.tensorflow``) and on the torch backend (through ``horovod.torch``), one
module per concern:

- :mod:`.optimizer`: :func:`DistributedOptimizer` (any Keras 3 optimizer, gradients
  averaged across workers with one grouped allreduce per step; mixed_float16 loss
  scaling decided on the averaged gradients).
- :mod:`.checkpoint`: :func:`save_model` and :func:`load_model` (rank 0 writes
  atomically; rank 0 reads and every rank gets the model).
- :mod:`.callbacks`: :class:`BroadcastInitialState`, :class:`LinearScalingWarmup`,
  :class:`MetricAverage`, :class:`ReplicaCheck`, :class:`CollectiveWatchdog`,
  :class:`ModelCheckpoint`.
- :mod:`.state`: :func:`verify_replicas`.
- :mod:`.elastic`: elastic training with ``fit`` (workers leave and join).
- :mod:`.collectives`: the collectives on Keras tensors that all of these use (shared
  with :mod:`hvdtrain.adapters.tensorflow`); :mod:`._internals`: the private Keras
  APIs relied on, with the Keras version they were checked against.

Example (``horovodrun -np 2 python train.py``)::

    import keras
    import hvdtrain.adapters.keras as hvk

    hvk.init()
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(10)])
    model.compile(optimizer=hvk.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], jit_compile=False)
    model.fit(x_shard, y_shard, batch_size=32, epochs=5, verbose=int(hvk.rank() == 0),
              callbacks=[hvk.BroadcastInitialState(), hvk.MetricAverage(),
                         hvk.LinearScalingWarmup(batch_size_per_worker=32, base_batch_size=32),
                         hvk.ReplicaCheck(), hvk.CollectiveWatchdog()])

Rank-0 patterns: give ``verbose=1`` (the progress bar) and callbacks that write
files, such as ``TensorBoard``, to rank 0 only (hvdtrain's :class:`ModelCheckpoint`
goes to every rank: rank 0 writes); put
:class:`MetricAverage` before any callback that reads the metrics (EarlyStopping,
ReduceLROnPlateau, ModelCheckpoint), so that every rank acts on the same values.
"""

from __future__ import annotations

from hvdtrain.adapters.keras import collectives, elastic
from hvdtrain.adapters.keras.callbacks import (
    BroadcastInitialState,
    CollectiveWatchdog,
    LinearScalingWarmup,
    MetricAverage,
    ModelCheckpoint,
    ReplicaCheck,
)
from hvdtrain.adapters.keras.checkpoint import load_model, save_model
from hvdtrain.adapters.keras.optimizer import DistributedOptimizer
from hvdtrain.adapters.keras.state import verify_replicas
from hvdtrain.consistency import RankDisagreementError
from hvdtrain.replicas import ReplicaMismatchError
from hvdtrain.runtime import init_horovod

__all__ = [
    "Average", "BroadcastInitialState", "CollectiveWatchdog", "DistributedOptimizer",
    "LinearScalingWarmup", "MetricAverage", "ModelCheckpoint", "RankDisagreementError",
    "ReplicaCheck", "ReplicaMismatchError", "Sum", "elastic", "init", "is_initialized",
    "load_model", "local_rank", "local_size", "rank", "save_model", "shutdown", "size",
    "verify_replicas",
]

# Horovod's basics, from the Horovod module that matches Keras's backend.
_hvd = collectives.horovod()
shutdown = _hvd.shutdown
is_initialized = _hvd.is_initialized
rank = _hvd.rank
size = _hvd.size
local_rank = _hvd.local_rank
local_size = _hvd.local_size
Average = _hvd.Average
Sum = _hvd.Sum


def init(comm=None, process_sets=None) -> None:
    """Horovod's ``init`` (of the Horovod matching Keras's backend) with hvdtrain's runtime
    defaults (see :mod:`hvdtrain.runtime`); ``comm`` may be an mpi4py communicator."""
    init_horovod(_hvd, comm, process_sets, accelerator=collectives.accelerator_visible())
