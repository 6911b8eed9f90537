"""hvdtrain.adapters.keras.elastic.run on its own, in an elastic job of one worker
(``horovodrun --gloo`` with a host discovery script; a reset needs Gloo's
rendezvous): ``python keras_elastic_errors.py errors HOSTS``. Prints ``REPORT {json}``
lines ``started`` (its pid) and ``errors``:

- ``recovered``: a training function whose first call fails the way a lost worker
  makes a compiled ``fit`` fail (TensorFlow's UnknownError from a Horovod op) is
  called again from the last commit: the calls made, and whether the weights were
  those of the commit when it was called again.
- ``unknown_error`` / ``value_error``: the type of what ``run`` let out of a function
  raising another UnknownError, or a ValueError (Horovod's own TF ``run`` returns
  None on such an UnknownError).
"""

import os

import keras
import numpy as np
import tensorflow as tf
from scenarios import report

import hvdtrain.adapters.keras as hvk
from hvdtrain.adapters.keras import elastic

hvk.init()
report(hvk.rank(), "started", pid=os.getpid())
model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
model.compile(optimizer=hvk.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse",
              jit_compile=False)
state = elastic.KerasState(model)
committed = [np.array(w) for w in model.get_weights()]
calls, seen = [], []


@elastic.run
def fails_once(state):
    calls.append(1)
    seen.append(all(np.array_equal(a, b) for a, b in zip(model.get_weights(), committed,
                                                             strict=True)))
    if len(calls) == 1:
        model.set_weights([w + 1 for w in model.get_weights()])  # uncommitted progress
        raise tf.errors.UnknownError(None, None, "HorovodAllreduce: Horovod has been shut down")
    return "finished"


def escaped(error: Exception) -> str:
    @elastic.run
    def raises(state):
        raise error

    try:
        return f"returned {raises(state)!r}"
    except Exception as caught:
        return type(caught).__name__


result = fails_once(state)
report(hvk.rank(), "errors", **{
    "recovered": {"result": result, "calls": len(calls), "committed_weights_each_call": seen,
                  "size": hvk.size()},
    "unknown_error": escaped(tf.errors.UnknownError(None, None, "a disk went away")),
    "value_error": escaped(ValueError("a bug in the training function")),
})
