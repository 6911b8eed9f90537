"""``KerasState``: what an elastic Keras job commits, restores and syncs."""

from __future__ import annotations

from typing import Any

import keras
from horovod.common.elastic import ObjectState
from keras import ops

from hvdtrain.adapters.keras import _internals, backend, collectives
from hvdtrain.adapters.keras.callbacks import LinearScalingWarmup
from hvdtrain.adapters.keras.elastic.data import ElasticData
from hvdtrain.validation import require_instance

__all__ = ["KerasState"]


class KerasState(ObjectState):
    """The model's weights, its optimizer's variables, the warmup's progress, the
    data's place in the epoch and plain values, for Horovod's elastic mode.

    ``commit()`` keeps a copy in memory (and checks for added or removed hosts);
    after a worker is lost every worker goes back to the last commit; ``sync()``
    (after every reset, and when the job starts) gives every worker rank 0's state,
    then tells the warmup the new number of workers.

    Args:
        model: a built ``keras.Model``.
        optimizer: its optimizer (Horovod's argument); default: the one it was compiled
            with. Its variables are built here if ``fit`` has not yet.
        warmup: a :class:`~hvdtrain.adapters.keras.LinearScalingWarmup` among fit's
            callbacks: after a reset its rate follows the rule for the new k from the
            samples seen so far (and the momentum is corrected).
        data: the :class:`ElasticData` that ``fit`` trains on: after a reset the rest
            of the epoch is re-shared among the workers.
        epoch: the epoch to start from (``fit(initial_epoch=state.epoch)``).
        **extras: plain Python values kept and synced with the rest, as attributes.

    Raises:
        TypeError: for a model, warmup or data of the wrong type.
        ValueError: for a model that is not built, or without an optimizer.
    """

    def __init__(self, model: keras.Model, optimizer: keras.optimizers.Optimizer | None = None,
                 *, warmup: LinearScalingWarmup | None = None, data: ElasticData | None = None,
                 epoch: int = 0, **extras: Any) -> None:
        require_instance("model", model, keras.Model, "a keras.Model")
        if warmup is not None:
            require_instance("warmup", warmup, LinearScalingWarmup,
                             "an hvdtrain.adapters.keras.LinearScalingWarmup")
        if data is not None:
            require_instance("data", data, ElasticData,
                             "hvdtrain.adapters.keras.elastic.ElasticData (other data cannot "
                             "re-share the rest of an epoch among a new set of workers)")
        if not model.built:
            raise ValueError("the model is not built: call it on a batch or give it an "
                             "Input before making its KerasState")
        optimizer = optimizer or getattr(model, "optimizer", None)
        if optimizer is None:
            raise ValueError("the model is not compiled: compile it with the "
                             "DistributedOptimizer (or pass optimizer=) before making its "
                             "KerasState")
        if not optimizer.built:
            optimizer.build(model.trainable_variables)
        self.model, self.optimizer, self.warmup, self.data = model, optimizer, warmup, data
        local = _internals.accumulator_ids(optimizer)
        # What every worker must hold alike (gradient accumulators are each worker's own).
        self._shared = list(model.variables) + [
            v for v in optimizer.variables if id(v) not in local]
        self._variables = list(model.variables) + list(optimizer.variables)
        self._keep_copy()
        super().__init__(bcast_object=backend.horovod().broadcast_object,
                         get_rank=backend.horovod().rank, epoch=epoch, **extras)

    def save(self) -> None:
        """Keep a copy of the state in memory (``commit()`` calls it)."""
        self._keep_copy()
        super().save()

    def restore(self) -> None:
        """Go back to the last saved copy (after a worker was lost)."""
        for variable, value in zip(self._variables, self._saved_values, strict=True):
            variable.assign(value)
        self._load_progress(self._saved_progress)
        super().restore()

    def sync(self) -> None:
        """Give every worker rank 0's state, then the warmup the new number of workers."""
        collectives.broadcast_variables(self._shared, root_rank=0)
        self._load_progress(self._bcast_object(self._progress()))
        if self.warmup is not None:
            self.warmup.set_world_size(backend.horovod().size())
        self._keep_copy()
        super().sync()

    def _progress(self) -> dict[str, Any]:
        return {"warmup": self.warmup.state_dict() if self.warmup is not None else None,
                "data": self.data.state_dict() if self.data is not None else None}

    def _load_progress(self, progress: dict[str, Any]) -> None:
        if self.warmup is not None:
            self.warmup.load_state_dict(progress["warmup"])
        if self.data is not None:
            self.data.load_state_dict(progress["data"])

    def _keep_copy(self) -> None:
        """Copy the variables' values and the progress to memory."""
        self._saved_values = [ops.convert_to_numpy(v) for v in self._variables]
        self._saved_progress = self._progress()
