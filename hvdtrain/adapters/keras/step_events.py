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

from collections.abc import Sequence
from typing import Any

from hvdtrain.adapters.keras.backend import in_tensorflow_graph
from hvdtrain.gradients import StepObservers, step_observers


def tell(event: str, step: Any, *flags: Any, after: Sequence[Any] = (),
         observers: StepObservers = step_observers) -> None:
    """Call every observer's ``event`` (``"reduction_started"``,
    ``"reduction_finished"`` or ``"step_finished"``) with ``step`` (the optimizer's
    ``iterations``, or -1 when there is none) and ``flags`` (booleans, or boolean
    tensors), if any observer is registered. In a graph the call waits for the tensors
    ``after`` (the gradients the reduction starts from, or its results): nothing else
    orders it against the forward and backward pass, and the observers time them.
    ``observers``: nobody for a process set's reduction
    (:func:`hvdtrain.gradients.observers_of`)."""
    if not observers:
        return
    if in_tensorflow_graph():
        import tensorflow as tf

        def call(step_value: Any, *flag_values: Any) -> None:
            getattr(observers, event)(int(step_value), *(bool(f) for f in flag_values))

        waits = [t.values if isinstance(t, tf.IndexedSlices) else t
                 for t in after if t is not None]
        with tf.control_dependencies(waits):
            tf.py_function(call, [step, *flags], Tout=[], name=f"hvdtrain_{event}")
        return
    import keras

    getattr(observers, event)(int(keras.ops.convert_to_numpy(step)),
                                   *(bool(keras.ops.convert_to_numpy(f)) for f in flags))
