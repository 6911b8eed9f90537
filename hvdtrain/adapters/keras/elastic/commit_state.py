"""``CommitState``: ``fit``'s side of an elastic Keras job."""

from __future__ import annotations

import keras

from hvdtrain.adapters.keras.elastic.state import KerasState
from hvdtrain.validation import require_instance, require_positive_int

__all__ = ["CommitState"]


class CommitState(keras.callbacks.Callback):
    """Advance the elastic state with ``fit`` and commit it.

    After every batch it counts the batch's samples as consumed (``state.data``), and
    every ``batches_per_commit`` batches it commits the state; at the end of each
    epoch it moves the state to the next epoch and commits (the epoch's last batch
    is committed there, never as an epoch with nothing left). A worker that fails costs
    the steps since the last commit. After a reset, ``fit`` goes on from the middle
    of an epoch with a shorter pass; at its end this callback stops that ``fit``
    (``model.stop_training``), so that the next ``fit`` of the training loop runs
    whole epochs again. Put it last in ``callbacks``, so that a commit holds what
    the other callbacks did in the batch.

    Args:
        state: the job's :class:`KerasState`.
        batches_per_commit: batches between commits (a commit copies the weights and
            optimizer variables to memory and asks Horovod's driver about hosts).
    """

    def __init__(self, state: KerasState, batches_per_commit: int = 1) -> None:
        super().__init__()
        require_instance("state", state, KerasState, "the job's hvdtrain KerasState")
        require_positive_int("batches_per_commit", batches_per_commit)
        self.state = state
        self.batches_per_commit = batches_per_commit
        self._since_commit = 0
        self._partial_epoch = False

    def on_train_begin(self, logs=None) -> None:
        """Note whether this fit starts mid-epoch (after a reset)."""
        self._since_commit = 0
        data = self.state.data
        self._partial_epoch = data is not None and data.position > 0

    def on_train_batch_end(self, batch: int, logs=None) -> None:
        """Count the batch's samples as consumed; commit every ``batches_per_commit``."""
        data = self.state.data
        if data is not None:
            data.record_batch()
            if data.position >= data.samples:
                return  # the epoch's last batch: on_epoch_end commits it with the new epoch
        self._since_commit += 1
        if self._since_commit >= self.batches_per_commit:
            self._since_commit = 0
            self.state.commit()

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        """Move to the next epoch and commit (stop this fit after a partial epoch)."""
        self.state.epoch = epoch + 1
        if self.state.data is not None:
            self.state.data.set_epoch(epoch + 1)
        if self._partial_epoch:
            self._partial_epoch = False
            self.model.stop_training = True
        self._since_commit = 0
        self.state.commit()
