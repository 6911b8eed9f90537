"""``verify_replicas``: are the replicas' Keras weights and optimizer state still identical?"""

from __future__ import annotations

import keras

from hvdtrain.adapters.keras import _internals, backend, collectives
from hvdtrain.collective import require_initialized
from hvdtrain.validation import require_instance

__all__ = ["verify_replicas"]


def verify_replicas(model: keras.Model) -> None:
    """Check that every rank holds bit-identical weights and optimizer variables
    (except gradient accumulators, which hold each worker's own micro-batch gradients).

    Raises:
        ReplicaMismatchError: on every rank, naming the ranks and the first variable
            that differs.
    """
    require_initialized(backend.collective(), "verify_replicas")
    require_instance("model", model, keras.Model, "a keras.Model")
    named = [(v.path, v) for v in model.variables]
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and optimizer.built:
        local = _internals.accumulator_ids(optimizer)
        named += [(f"optimizer/{v.path}", v) for v in optimizer.variables if id(v) not in local]
    collectives.verify_variables(named)
