"""Horovod's elastic Keras callbacks, with Horovod's meaning, on Keras 3:
``CommitStateCallback``, ``UpdateBatchStateCallback``, ``UpdateEpochStateCallback``.

hvdtrain's :class:`~hvdtrain.adapters.keras.elastic.CommitState` does what the three
do together, and also keeps the data's place in the epoch.
"""

from __future__ import annotations

from typing import Any

import keras

from hvdtrain.validation import require_positive_int


class CommitStateCallback(keras.callbacks.Callback):
    """Commit ``state`` every ``batches_per_commit`` batches and at each epoch's end."""

    def __init__(self, state: Any, batches_per_commit: int = 1) -> None:
        super().__init__()
        require_positive_int("batches_per_commit", batches_per_commit)
        self.state = state
        self.batches_per_commit = batches_per_commit
        self.batches_remaining = batches_per_commit

    def on_train_begin(self, logs=None) -> None:
        """Start counting again (every rank alike, after a reset)."""
        self.batches_remaining = self.batches_per_commit

    def on_train_batch_end(self, batch: int, logs=None) -> None:
        """Commit every ``batches_per_commit`` batches."""
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.state.commit()
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        """Commit."""
        self.state.commit()


class UpdateBatchStateCallback(keras.callbacks.Callback):
    """Keep ``state.batch`` at the last finished batch of the epoch (0 between epochs).

    Horovod's also shortens the first epoch after a reset through ``params["steps"]``,
    which Keras 3's loop does not read; hvdtrain's ``ElasticData`` serves only the rest
    of the epoch instead.
    """

    def __init__(self, state: Any) -> None:
        super().__init__()
        self.state = state

    def on_train_batch_end(self, batch: int, logs=None) -> None:
        """Record the batch."""
        self.state.batch = batch

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        """Back to batch 0."""
        self.state.batch = 0


class UpdateEpochStateCallback(keras.callbacks.Callback):
    """Keep ``state.epoch`` at the epochs finished, counted across resets: the value at
    ``fit``'s start plus the epochs of this ``fit`` (whose count starts at 0, as when
    ``fit`` is given ``epochs=epochs - state.epoch`` and no ``initial_epoch``)."""

    def __init__(self, state: Any) -> None:
        super().__init__()
        self.state = state
        self.initial_epoch = state.epoch

    def on_train_begin(self, logs=None) -> None:
        """Remember where this fit started."""
        self.initial_epoch = self.state.epoch

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        """One more epoch done."""
        self.state.epoch = self.initial_epoch + epoch + 1
