"""Elastic training with ``model.fit``: Horovod's elastic mode, with the data re-shared
and the linear scaling rule following the number of workers.

Launch with ``horovodrun --gloo --min-np M --max-np N --host-discovery-script S`` (on
one machine add ``--network-interfaces lo``). Workers may then leave or join while
training goes on: every worker goes back to the last commit, Horovod starts again on
the workers there are, and ``fit`` continues from there. One module per concern:

- :mod:`.run`: :func:`run`, the decorator around the training function.
- :mod:`.state`: :class:`KerasState` (weights, optimizer variables, the warmup's
  progress, the data's place in the epoch, plain values).
- :mod:`.data`: :class:`ElasticData`, the arrays as a ``PyDataset`` that re-shares
  the rest of the epoch among the workers there are.
- :mod:`.commit_state`: :class:`CommitState`, the callback that advances and commits
  the state during ``fit``.
- :mod:`.horovod_callbacks`: Horovod's ``CommitStateCallback``,
  ``UpdateBatchStateCallback`` and ``UpdateEpochStateCallback``, for scripts written
  for ``horovod.tensorflow.keras.elastic``.

Example (``examples/keras_elastic.py`` is a whole one)::

    data = hvk.elastic.ElasticData(x, y, batch_size=32, seed=0)
    warmup = hvk.LinearScalingWarmup(batch_size_per_worker=32)
    state = hvk.elastic.KerasState(model, warmup=warmup, data=data)
    callbacks = [hvk.MetricAverage(), warmup, hvk.elastic.CommitState(state, 10)]

    @hvk.elastic.run
    def train(state):
        # A fit that resumes mid-epoch stops at the epoch's end; the loop goes on.
        while state.epoch < epochs:
            model.fit(data, initial_epoch=state.epoch, epochs=epochs, callbacks=callbacks,
                      verbose=int(hvk.rank() == 0))

    train(state)

No ``BroadcastInitialState`` is needed: the state's first sync broadcasts rank 0's.
"""

from hvdtrain.adapters.keras.elastic.commit_state import CommitState
from hvdtrain.adapters.keras.elastic.data import ElasticData
from hvdtrain.adapters.keras.elastic.horovod_callbacks import (
    CommitStateCallback,
    UpdateBatchStateCallback,
    UpdateEpochStateCallback,
)
from hvdtrain.adapters.keras.elastic.run import run
from hvdtrain.adapters.keras.elastic.state import KerasState

__all__ = ["CommitState", "CommitStateCallback", "ElasticData", "KerasState",
           "UpdateBatchStateCallback", "UpdateEpochStateCallback", "run"]
