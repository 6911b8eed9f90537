"""``ReplicaCheck``: stop as soon as the replicas' weights or optimizer state differ."""

from __future__ import annotations

import keras

from hvdtrain.adapters.keras.replicas import verify_replicas
from hvdtrain.validation import require_positive_int


class ReplicaCheck(keras.callbacks.Callback):
    """Raise ReplicaMismatchError as soon as the replicas' weights or optimizer state differ.

    Every ``every_n_epochs`` epochs it compares a checksum of every variable across
    ranks (one small allgather), naming the first variable and the ranks that differ.

    Example::

        model.fit(x, y, epochs=10, callbacks=[hvk.ReplicaCheck(every_n_epochs=1)])
    """

    def __init__(self, every_n_epochs: int = 1) -> None:
        super().__init__()
        require_positive_int("every_n_epochs", every_n_epochs)
        self.every_n_epochs = every_n_epochs

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        """Compare the replicas every ``every_n_epochs`` epochs."""
        if (epoch + 1) % self.every_n_epochs == 0:
            verify_replicas(self.model)
