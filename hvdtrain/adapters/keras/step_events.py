"""The core's step observers (:data:`hvdtrain.step_events.step_observers`) told of each
update of a Keras distributed optimizer (and of each reduction of TensorFlow's
``DistributedGradientTape``).

Eagerly (Keras on torch, or TensorFlow outside a ``tf.function``) the observers are
called directly. Inside a TensorFlow graph, Python runs only through
``tf.py_function``, which costs about 0.1 ms per call (measured on this machine's
graph-mode Keras MLP step of 7 ms, three calls made the step 8 % longer). So when
every observer takes late events (the step timing does; the core's ``StepObserver``),
the graph only records each update's times (``tf.timestamp``, after the gradients and
after their average) and whether it was applied into a small table, and tells the
observers the whole table every :data:`LATE_BATCH` updates, in one call. Otherwise
each event is one ``tf.py_function``, in program order with the allreduce and the
update. Either way the calls are added only when an observer is registered while the
graph is traced (``fit`` traces its step at its first call): a graph traced without
observers carries no extra operation.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hvdtrain.adapters.keras.backend import in_tensorflow_graph
from hvdtrain.step_events import StepObservers, step_observers

LATE_BATCH = 32
"""Updates told at once to observers that take late events, inside a graph."""
_NO_STEP_FINISHED = -1.0  # a table row's applied flag when no step_finished follows


@dataclass
class ObservedReduction:
    """One update's reduction as traced: whom to tell, and (recording late) the
    timestamp tensors of its start and end."""

    observers: StepObservers
    step: Any
    started_at: Any = None
    finished_at: Any = None

    @property
    def recorded(self) -> bool:
        """Whether its times are recorded in the graph, to be told late."""
        return self.started_at is not None


def reduction_started(step: Any, *, after: Sequence[Any] = (),
                      observers: StepObservers = step_observers) -> ObservedReduction:
    """Tell ``observers`` that the reduction of ``step`` (the optimizer's ``iterations``,
    or -1 when there is none) starts. In a graph the call, or the timestamp, waits for
    the tensors ``after`` (the gradients): nothing else orders it against the forward
    and backward pass, which the observers time. ``observers``: nobody for a process
    set's reduction (:func:`hvdtrain.step_events.observers_of`)."""
    reduction = ObservedReduction(observers, step)
    if not observers:
        return reduction
    if in_tensorflow_graph() and observers.take_late_events:
        reduction.started_at = _timestamp(after)
        return reduction
    _tell(observers, "reduction_started", step, after=after)
    return reduction


def reduction_finished(reduction: ObservedReduction, *, after: Sequence[Any] = (),
                       last: bool = False) -> None:
    """Tell the observers that ``reduction``'s averaged gradients (``after``) are back;
    ``last``: no :func:`step_finished` follows (a gradient tape)."""
    if not reduction.observers:
        return
    if reduction.recorded:
        reduction.finished_at = _timestamp(after)
        if last:
            _record(reduction, _NO_STEP_FINISHED)
        return
    _tell(reduction.observers, "reduction_finished", reduction.step, after=after)


def step_finished(reduction: ObservedReduction, applied: Any) -> None:
    """Tell the observers that ``reduction``'s update was applied (or skipped:
    ``applied`` False, a boolean or a boolean tensor)."""
    if not reduction.observers:
        return
    if reduction.recorded:
        import tensorflow as tf

        _record(reduction, tf.cast(applied, tf.float64))
        return
    _tell(reduction.observers, "step_finished", reduction.step, applied)


def discard_pending() -> None:
    """Forget the updates recorded but not yet told (every rank at once, after a
    ``join()`` or an elastic reset: the ranks then count their updates alike again)."""
    if _table is not None:
        _table.count.assign(0)


def _tell(observers: StepObservers, event: str, step: Any, *flags: Any,
          after: Sequence[Any] = ()) -> None:
    """Call every observer's ``event`` now: directly, or through ``tf.py_function``."""
    if in_tensorflow_graph():
        import tensorflow as tf

        def call(step_value: Any, *flag_values: Any) -> None:
            getattr(observers, event)(int(step_value), *(bool(f) for f in flag_values))

        with tf.control_dependencies(_waits(after)):
            tf.py_function(call, [step, *flags], Tout=[], name=f"hvdtrain_{event}")
        return
    import keras

    getattr(observers, event)(int(keras.ops.convert_to_numpy(step)),
                              *(bool(keras.ops.convert_to_numpy(f)) for f in flags))


def _waits(tensors: Sequence[Any]) -> list[Any]:
    import tensorflow as tf

    return [t.values if isinstance(t, tf.IndexedSlices) else t
            for t in tensors if t is not None]


def _timestamp(after: Sequence[Any]) -> Any:
    """The time (seconds since the epoch, float64) once ``after`` are computed."""
    import tensorflow as tf

    with tf.control_dependencies(_waits(after)):
        return tf.timestamp()


@dataclass
class _Table:
    """The updates recorded in graphs and not yet told: one row per update (step,
    started, finished, applied), and how many there are."""

    rows: Any
    count: Any


_table: _Table | None = None


def _record(reduction: ObservedReduction, applied: Any) -> None:
    """Add ``reduction``'s row to the table; tell the table when it is full."""
    import tensorflow as tf

    global _table
    if _table is None:
        with tf.init_scope():  # one table per process, made outside any graph
            _table = _Table(tf.Variable(tf.zeros([LATE_BATCH, 4], tf.float64),
                                        trainable=False, name="hvdtrain_step_times"),
                            tf.Variable(0, dtype=tf.int64, trainable=False,
                                        name="hvdtrain_step_times_count"))
    row = tf.stack([tf.cast(reduction.step, tf.float64), reduction.started_at,
                    reduction.finished_at, applied])
    index = _table.count % LATE_BATCH
    written = _table.rows.scatter_nd_update(tf.reshape(index, [1, 1]), row[tf.newaxis])
    with tf.control_dependencies([written]):
        count = _table.count.assign_add(1)
    observers = reduction.observers

    def tell_table() -> Any:
        told = tf.py_function(lambda rows: _tell_late(observers, rows.numpy()),
                              [_table.rows.read_value()], Tout=[tf.int64],
                              name="hvdtrain_step_times")
        return told[0]

    tf.cond(tf.equal(count % LATE_BATCH, 0), tell_table,
            lambda: tf.constant(0, tf.int64))


def _tell_late(observers: StepObservers, rows: Any) -> int:
    """Tell ``observers`` the table's updates, each with its times on the observers'
    clock (``time.perf_counter``; the graph stamped them with the time of day)."""
    offset = time.perf_counter() - time.time()
    for step, started, finished, applied in rows.tolist():
        observers.reduction_started(int(step), at=started + offset)
        observers.reduction_finished(int(step), at=finished + offset)
        if applied != _NO_STEP_FINISHED:
            observers.step_finished(int(step), bool(applied))
    return len(rows)
