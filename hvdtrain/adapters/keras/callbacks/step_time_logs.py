"""``StepTimeLogs``: every rank's compute, wait and communication per step in ``logs``."""

from __future__ import annotations

import keras

from hvdtrain import step_timing


class StepTimeLogs(keras.callbacks.Callback):
    """Put the step timing's last window (:mod:`hvdtrain.step_timing`, the same on every
    rank) into the logs of each batch and epoch, so that ``History`` and ``TensorBoard``
    record it: ``step_compute_ms``, ``step_wait_ms`` (the median rank's),
    ``step_communication_ms``, ``slowest_rank``, ``slowest_compute_ms`` and
    ``straggler`` (the rank named by the straggler report, -1 when none); with
    ``per_rank=True`` also ``rank{r}_compute_ms`` and ``rank{r}_wait_ms``. Before the
    first window is complete (``HVDTRAIN_STRAGGLER_REPORT_SECONDS``, 60 s by default)
    nothing is added. Place it before the callbacks that read the logs.

    Example::

        model.fit(x, y, epochs=10,
                  callbacks=[hvk.StepTimeLogs(), keras.callbacks.TensorBoard("logs")])
    """

    def __init__(self, per_rank: bool = False) -> None:
        super().__init__()
        self.per_rank = per_rank

    def _add(self, logs: dict | None) -> None:
        window = step_timing.step_times()
        if logs is not None and window is not None:
            logs.update(window.scalars(self.per_rank))

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        """Add the last window to the batch's logs."""
        self._add(logs)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        """Add the last window to the epoch's logs."""
        self._add(logs)
