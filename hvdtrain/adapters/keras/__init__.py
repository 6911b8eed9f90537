"""Keras 3 on Horovod: ``import hvdtrain.adapters.keras as hvk``.

Horovod's own ``horovod.tensorflow.keras`` does not average gradients on Keras 3
(its optimizer wrapper overrides methods Keras 3 never calls) and its callbacks use
Keras 2 APIs. This adapter works with Keras 3 on the TensorFlow backend (through
``horovod.tensorflow``) and on the torch backend (through ``horovod.torch``), one
module per concern:

- :mod:`.optimizer`: :func:`DistributedOptimizer` (any Keras 3 optimizer, gradients
  averaged across workers with one collective per step; mixed_float16 loss
  scaling decided on the averaged gradients).
- :mod:`.checkpoint`: :func:`save_model` and :func:`load_model` (rank 0 writes
  atomically; rank 0 reads and every rank gets the model).
- :mod:`.callbacks`: :class:`BroadcastInitialState`, :class:`LinearScalingWarmup`,
  :class:`MetricAverage`, :class:`ReplicaCheck`, :class:`CollectiveWatchdog`,
  :class:`ModelCheckpoint`, :class:`JoinAtEpochEnd` (shares of different sizes),
  :class:`StepTimeLogs` (every rank's compute, wait and communication per step in the
  logs; :func:`step_times` in code; :mod:`hvdtrain.step_timing`).
- :mod:`.replicas`: :func:`verify_replicas`.
- :mod:`.sync_batch_normalization`: :class:`SyncBatchNormalization` (batch statistics
  of the global batch).
- :mod:`.elastic`: elastic training with ``fit`` (workers leave and join).
- shared with :mod:`hvdtrain.adapters.tensorflow`: :mod:`.backend` (the Horovod of
  Keras's backend, and its workers as the core's Collective), :mod:`.reduction`
  (gradient averaging and its finite checks), :mod:`.collectives` (variables:
  broadcast, replica checks, ``join``); :mod:`._internals`: the private Keras APIs
  relied on, with the Keras version they were checked against.

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

Coming from Horovod: ``import hvdtrain.adapters.keras as hvd`` in place of
``horovod.tensorflow.keras`` (or ``horovod.keras``) gives Horovod's names too:
``hvd.callbacks.BroadcastGlobalVariablesCallback`` and the other callbacks, the
``DistributedOptimizer`` arguments, ``hvd.elastic``'s state and callbacks, the
collectives. docs/keras.md, "Coming from horovod.tensorflow.keras", lists what differs.

Rank-0 patterns: give ``verbose=1`` (the progress bar) and callbacks that write
files, such as ``TensorBoard``, to rank 0 only (hvdtrain's :class:`ModelCheckpoint`
goes to every rank: rank 0 writes); put
:class:`MetricAverage` before any callback that reads the metrics (EarlyStopping,
ReduceLROnPlateau, ModelCheckpoint), so that every rank acts on the same values.
"""

from __future__ import annotations

from hvdtrain import step_timing
from hvdtrain.adapters.keras import backend, callbacks, collectives, elastic
from hvdtrain.adapters.keras.callbacks import (
    BroadcastInitialState,
    CollectiveWatchdog,
    JoinAtEpochEnd,
    LinearScalingWarmup,
    MetricAverage,
    ModelCheckpoint,
    ReplicaCheck,
    StepTimeLogs,
)
from hvdtrain.adapters.keras.checkpoint import load_model, save_model
from hvdtrain.adapters.keras.optimizer import DistributedOptimizer, PartialDistributedOptimizer
from hvdtrain.adapters.keras.replicas import verify_replicas
from hvdtrain.adapters.keras.sync_batch_normalization import SyncBatchNormalization
from hvdtrain.consistency import RankDisagreementError
from hvdtrain.replicas import ReplicaMismatchError
from hvdtrain.runtime import init_horovod

__all__ = [
    "Adasum", "Average", "BroadcastInitialState", "CollectiveWatchdog", "Compression",
    "DistributedOptimizer", "JoinAtEpochEnd", "LinearScalingWarmup", "MetricAverage",
    "ModelCheckpoint", "PartialDistributedOptimizer", "ProcessSet", "RankDisagreementError",
    "ReplicaCheck", "ReplicaMismatchError", "StepTimeLogs", "Sum", "SyncBatchNormalization",
    "add_process_set", "allgather", "allgather_object", "allreduce", "alltoall",
    "broadcast", "broadcast_object", "callbacks", "ccl_built", "cross_rank", "cross_size",
    "cuda_built", "ddl_built", "elastic", "global_process_set", "gloo_built",
    "gloo_enabled", "grouped_allreduce", "init", "is_initialized", "join", "load_model",
    "local_rank", "local_size", "mpi_built", "mpi_enabled", "mpi_threads_supported",
    "nccl_built", "rank", "reducescatter", "remove_process_set", "rocm_built", "save_model",
    "set_samples_per_step", "shutdown", "size", "start_timeline", "step_times",
    "stop_timeline", "verify_replicas",
]

# Horovod's basics, from the Horovod module that matches Keras's backend.
_hvd = backend.horovod()
shutdown = _hvd.shutdown
is_initialized = _hvd.is_initialized
rank = _hvd.rank
size = _hvd.size
local_rank = _hvd.local_rank
local_size = _hvd.local_size
Average = _hvd.Average
Sum = _hvd.Sum
# The rest of Horovod's public API (of horovod.tensorflow.keras), unchanged: collectives
# on the backend's tensors, process sets, build and runtime facts, the timeline.
Adasum = _hvd.Adasum
Compression = _hvd.Compression
ProcessSet = _hvd.ProcessSet
add_process_set = _hvd.add_process_set
remove_process_set = _hvd.remove_process_set
global_process_set = _hvd.global_process_set
allgather = _hvd.allgather
allgather_object = _hvd.allgather_object
allreduce = _hvd.allreduce
alltoall = _hvd.alltoall
broadcast = _hvd.broadcast
broadcast_object = _hvd.broadcast_object
grouped_allreduce = _hvd.grouped_allreduce
reducescatter = _hvd.reducescatter
join = collectives.join
cross_rank = _hvd.cross_rank
cross_size = _hvd.cross_size
mpi_threads_supported = _hvd.mpi_threads_supported
mpi_built, mpi_enabled = _hvd.mpi_built, _hvd.mpi_enabled
gloo_built, gloo_enabled = _hvd.gloo_built, _hvd.gloo_enabled
nccl_built, cuda_built, rocm_built = _hvd.nccl_built, _hvd.cuda_built, _hvd.rocm_built
ccl_built, ddl_built = _hvd.ccl_built, _hvd.ddl_built
start_timeline, stop_timeline = _hvd.start_timeline, _hvd.stop_timeline


def init(comm=None, process_sets=None) -> None:
    """Horovod's ``init`` (of the Horovod matching Keras's backend) with hvdtrain's runtime
    defaults (see :mod:`hvdtrain.runtime`); ``comm`` may be an mpi4py communicator."""
    init_horovod(_hvd, comm, process_sets, accelerator=backend.accelerator_visible())
    step_timing.start(backend.collective(), backend.sum_numbers)


step_times = step_timing.step_times
set_samples_per_step = step_timing.set_samples_per_step
