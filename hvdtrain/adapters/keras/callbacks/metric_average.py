"""``MetricAverage``: every rank logs, and acts on, the metrics averaged over all ranks."""

from __future__ import annotations

import keras

from hvdtrain.adapters.keras import backend
from hvdtrain.metrics import average_over_ranks
from hvdtrain.validation import require_non_negative_int


class MetricAverage(keras.callbacks.Callback):
    """Average every metric in ``logs`` over all workers at the end of each epoch.

    Validation metrics included. Put it before callbacks that read the metrics
    (EarlyStopping, ReduceLROnPlateau, ModelCheckpoint, the progress bar), so that they
    see, and act on, the same numbers on every rank.

    When the workers' shares differ in size (a validation set that does not divide
    evenly: evaluation needs no collective per batch, so shares may differ), give the
    number of examples of this worker's share: each worker's mean then counts in
    proportion, and the result is the mean over all the examples, as one process
    would compute it. Training shares that give the workers different numbers of
    batches need :class:`JoinAtEpochEnd`.

    Args:
        examples: this worker's training examples (weights the training metrics).
        validation_examples: this worker's validation examples (weights ``val_*``).

    Example::

        model.fit(x, y, validation_data=(xv, yv),
                  callbacks=[hvk.MetricAverage(validation_examples=len(xv))])
    """

    def __init__(self, examples: int | None = None,
                 validation_examples: int | None = None) -> None:
        super().__init__()
        for name, value in (("examples", examples),
                            ("validation_examples", validation_examples)):
            if value is not None:
                require_non_negative_int(name, value)
        self.examples = examples
        self.validation_examples = validation_examples

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        """Replace each value in ``logs`` by its (weighted) mean over the ranks."""
        if logs:
            logs.update(average_over_ranks(backend.collective(), logs, self._weights(logs)))

    def _weights(self, logs: dict) -> dict[str, float] | None:
        if self.examples is None and self.validation_examples is None:
            return None

        def weight(key: str) -> float:
            given = self.validation_examples if key.startswith("val_") else self.examples
            return 1.0 if given is None else float(given)

        return {key: weight(key) for key in logs}


class MetricAverageCallback(MetricAverage):
    """Horovod's name for :class:`MetricAverage` (the ``device`` argument is unused)."""

    def __init__(self, device: str = "") -> None:
        super().__init__()
