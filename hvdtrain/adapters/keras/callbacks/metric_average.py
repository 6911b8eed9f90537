"""``MetricAverage``: every rank logs, and acts on, the metrics averaged over all ranks."""

from __future__ import annotations

import keras

from hvdtrain.adapters.keras import collectives


class MetricAverage(keras.callbacks.Callback):
    """Average every metric in ``logs`` over all workers at the end of each epoch.

    Validation metrics included. Put it before callbacks that read the metrics
    (EarlyStopping, ReduceLROnPlateau, ModelCheckpoint, the progress bar), so that they
    see, and act on, the same numbers on every rank.

    Example::

        model.fit(x, y, validation_data=(xv, yv), callbacks=[hvk.MetricAverage()])
    """

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        """Replace each value in ``logs`` by its mean over the ranks."""
        if logs:
            logs.update(collectives.average_numbers(logs))


class MetricAverageCallback(MetricAverage):
    """Horovod's name for :class:`MetricAverage` (the ``device`` argument is unused)."""

    def __init__(self, device: str = "") -> None:
        super().__init__()
