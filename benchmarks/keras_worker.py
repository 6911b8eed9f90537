"""Keras 3 training throughput on every rank of a horovodrun job (or one process):
``python keras_worker.py STEPS``.

The conv net (keras_models.py), one compute thread, trained two ways: ``model.fit``
with hvdtrain's DistributedOptimizer and callbacks (batch times from a callback), and
a TensorFlow custom loop (a ``tf.function`` step with hvdtrain's
DistributedGradientTape). Each runs 5 warm-up steps and STEPS timed ones. Rank 0
prints ``RESULT {json}`` with the median step time and samples per second (all workers).
"""

import json
import statistics
import sys
import time

import keras
import tensorflow as tf
from keras_models import BATCH_PER_WORKER, loss, make_data, make_model

import hvdtrain.adapters.keras as hvk
import hvdtrain.adapters.tensorflow as hvtf

WARMUP_STEPS = 5
BATCH = BATCH_PER_WORKER["conv"]


class BatchTimes(keras.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []

    def on_train_batch_begin(self, batch, logs=None) -> None:
        self._started = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None) -> None:
        self.times.append(time.perf_counter() - self._started)


def fit_step_s(steps: int) -> float:
    x, y = make_data("conv", hvk.rank(), WARMUP_STEPS + steps)
    model = make_model("conv")
    model.compile(optimizer=hvk.DistributedOptimizer(keras.optimizers.SGD(0.01, momentum=0.9)),
                  loss=loss(), jit_compile=False)
    timer = BatchTimes()
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
              callbacks=[hvk.BroadcastInitialState(), timer])
    return statistics.median(timer.times[WARMUP_STEPS:])


def loop_step_s(steps: int) -> float:
    x, y = make_data("conv", hvk.rank(), 1)
    model = make_model("conv")
    optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
    optimizer.build(model.trainable_variables)
    hvtf.broadcast_variables(model.variables + optimizer.variables)
    loss_fn = loss()

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            value = loss_fn(y, model(x, training=True))
        grads = hvtf.DistributedGradientTape(tape).gradient(value, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return value

    times = []
    for _ in range(WARMUP_STEPS + steps):
        started = time.perf_counter()
        train_step(x, y).numpy()
        times.append(time.perf_counter() - started)
    return statistics.median(times[WARMUP_STEPS:])


def main() -> None:
    steps = int(sys.argv[1])
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    hvk.init()
    results = {}
    for name, measure in (("fit", fit_step_s), ("custom_loop", loop_step_s)):
        step_s = measure(steps)
        results[name] = {"median_step_s": step_s,
                         "samples_per_s": BATCH * hvk.size() / step_s}
    if hvk.rank() == 0:
        print("RESULT " + json.dumps({"workers": hvk.size(), "batch_per_worker": BATCH,
                                      "model": "conv", "modes": results}), flush=True)


if __name__ == "__main__":
    main()
