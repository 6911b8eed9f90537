"""The core's step observers (:data:`hvdtrain.gradients.step_observers`) told of each
update of a Keras distributed optimizer.

Eagerly (Keras on torch, or TensorFlow outside a ``tf.function``) the observers are
called directly. Inside a TensorFlow graph they are called through ``tf.py_function``,
which TensorFlow runs in program order with the allreduce and the update (a
``tf.function`` orders its stateful operations as written). Those calls are added only
when an observer is registered while the graph is traced (``fit`` traces its step at
its first call): a graph traced without observers carries no extra operation.
"""

from __future__ import annotations

from typing import Any

from hvdtrain.adapters.keras.backend import in_tensorflow_graph
from hvdtrain.gradients import step_observers


def tell(event: str, step: Any, *flags: Any) -> None:
    """Call every observer's ``event`` (``"reduction_started"``,
    ``"reduction_finished"`` or ``"step_finished"``) with ``step`` (the optimizer's
    ``iterations``) and ``flags`` (booleans, or boolean tensors), if any observer is
    registered."""
    if not step_observers:
        return
    if in_tensorflow_graph():
        import tensorflow as tf

        def call(step_value: Any, *flag_values: Any) -> None:
            getattr(step_observers, event)(int(step_value), *(bool(f) for f in flag_values))

        tf.py_function(call, [step, *flags], Tout=[], name=f"hvdtrain_{event}")
        return
    import keras

    getattr(step_observers, event)(int(keras.ops.convert_to_numpy(step)),
                                   *(bool(keras.ops.convert_to_numpy(f)) for f in flags))
