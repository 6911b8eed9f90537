"""Step time of hvdtrain's Keras DistributedOptimizer against a bare allreduce-in-apply
optimizer, on every rank: ``python keras_overhead_worker.py ROUNDS STEPS [MODEL]``.

Two copies of MODEL (keras_models.py; default the MLP) are compiled, one with
``hvk.DistributedOptimizer(SGD)``, one with an SGD whose ``apply`` averages the
gradients with one Horovod grouped allreduce (the least a Keras 3 user would write),
and trained alternately (A B, B A, ...) with ``train_on_batch`` for ROUNDS rounds of
STEPS timed steps. Rank 0 prints ``RESULT {json}`` with each round's median step time.
"""

import json
import statistics
import sys
import time

import horovod.tensorflow as hvd
import keras
import tensorflow as tf
from common import rotated
from keras_models import BATCH_PER_WORKER, loss, make_data, make_model

import hvdtrain.adapters.keras as hvk

WARMUP_STEPS = 3


class AllreduceInApplySGD(keras.optimizers.SGD):
    """The baseline: SGD whose apply() averages the gradients first, nothing else."""

    def apply(self, grads, trainable_variables=None):
        averaged = hvd.grouped_allreduce(list(grads), op=hvd.Average, name="baseline",
                                         ignore_name_scope=True)
        return super().apply(averaged, trainable_variables)


def compiled(name: str, optimizer) -> keras.Model:
    model = make_model(name)
    model.compile(optimizer=optimizer, loss=loss(), jit_compile=False)
    return model


def step_times(model, x, y, steps: int) -> list[float]:
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        model.train_on_batch(x, y)
        times.append(time.perf_counter() - started)
    return times


def main() -> None:
    rounds, steps = int(sys.argv[1]), int(sys.argv[2])
    model_name = sys.argv[3] if len(sys.argv) > 3 else "mlp"
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    hvk.init()
    x, y = make_data(model_name, hvk.rank(), 1)
    contenders = {"allreduce_in_apply": compiled(model_name,
                                                 AllreduceInApplySGD(0.01, momentum=0.9)),
                  "hvdtrain": compiled(model_name, hvk.DistributedOptimizer(
                      keras.optimizers.SGD(0.01, momentum=0.9)))}
    names = list(contenders)
    medians = {name: [] for name in names}
    for round_number in range(rounds):
        for name in rotated(names, round_number):
            step_times(contenders[name], x, y, WARMUP_STEPS)
            medians[name].append(statistics.median(step_times(contenders[name], x, y, steps)))
    if hvk.rank() == 0:
        print("RESULT " + json.dumps({"round_medians_s": medians, "model": model_name,
                                      "batch_per_worker": BATCH_PER_WORKER[model_name],
                                      "workers": hvk.size()}), flush=True)


if __name__ == "__main__":
    main()
