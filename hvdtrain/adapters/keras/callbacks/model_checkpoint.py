"""``ModelCheckpoint``: Keras's callback, written by rank 0 atomically."""

from __future__ import annotations

import os

import keras

from hvdtrain.adapters.keras import backend
from hvdtrain.adapters.keras.checkpoint import write_model
from hvdtrain.collective import on_rank0_for_all


class ModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """Keras's ``ModelCheckpoint`` (same arguments), with the file written by rank 0
    only and atomically.

    Give it to every rank. Rank 0 decides whether to save (``save_best_only``,
    ``monitor``: put :class:`MetricAverage` before it so that the decision uses every
    rank's data) and writes the file through a temporary one in the same folder, fsynced
    and renamed over the old (:func:`hvdtrain.checkpoint.atomic_path`): a crash while
    writing leaves the previous checkpoint whole. When rank 0 cannot write, every rank
    stops with the error instead of running on.

    Example::

        callbacks=[hvk.MetricAverage(), hvk.ModelCheckpoint("run/best.keras",
                                                            save_best_only=True)]
    """

    def _save_model(self, epoch, batch, logs) -> None:
        """Rank 0 decides and writes; every rank learns whether it worked."""
        filepath = self._get_file_path(epoch, batch, logs)

        def save() -> None:
            if self._should_save_model(epoch, batch, logs, filepath):
                write_model(self.model, filepath, weights_only=self.save_weights_only)

        on_rank0_for_all(backend.collective(), save, f"write checkpoint {os.fspath(filepath)}",
                         "hvdtrain.keras_checkpoint.callback")
