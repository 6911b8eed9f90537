"""Step time of hvdtrain's Keras DistributedOptimizer against a bare allreduce-in-apply
optimizer, on every rank: ``python keras_overhead_worker.py ROUNDS STEPS [MODEL]``.

Five copies of MODEL (keras_models.py; default the MLP) are compiled: with
``hvk.DistributedOptimizer(SGD)``, with the same and ``check_nonfinite=False``, with an
SGD whose ``apply`` averages the gradients with one Horovod grouped allreduce (the
least a Keras 3 user would write), with that SGD followed by hvdtrain's separate
non-finite check (how hvdtrain checked before the flat buffer: a read of every averaged
gradient), and the first again, traced and run with the step timing paused
(:func:`hvdtrain.step_timing.paused`: its graph has no timing calls); they train in
rotation (A B C D E, B C D E A, ...) with ``train_on_batch`` for
ROUNDS rounds of STEPS timed steps. The check is also timed alone, on tensors shaped
like the model's gradients, both ways: what hvdtrain does around the allreduce with the
check against without it (packing with and without the bound, unpacking with and
without the look at it), and the separate read against a pass-through. Rank 0 prints
``RESULT {json}`` with each round's median step time, the checks' median times per
call, and the step timing's time per step in the graph (``timing_s``: its timestamps
and table around a stand-in reduction, timed alone like the check).
"""

import contextlib
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
from hvdtrain import step_timing
from hvdtrain.adapters.keras import reduction, step_events, tally
from hvdtrain.step_events import StepObservers

WARMUP_STEPS = 3
CHECK_CALLS = 200


class AllreduceInApplySGD(keras.optimizers.SGD):
    """The baseline: SGD whose apply() averages the gradients first, nothing else."""

    def apply(self, grads, trainable_variables=None):
        averaged = hvd.grouped_allreduce(list(grads), op=hvd.Average, name="baseline",
                                         ignore_name_scope=True)
        return super().apply(averaged, trainable_variables)


class ReadCheckSGD(keras.optimizers.SGD):
    """The baseline, then hvdtrain's separate non-finite check of the averaged gradients."""

    def apply(self, grads, trainable_variables=None):
        averaged = hvd.grouped_allreduce(list(grads), op=hvd.Average, name="read_check",
                                         ignore_name_scope=True)
        averaged = reduction.require_finite(averaged, self.iterations)
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


def per_call(function, grads) -> float:
    """Seconds per call of the compiled ``function`` on ``grads`` (after one call)."""
    function(grads)
    started = time.perf_counter()
    for _ in range(CHECK_CALLS):
        function(grads)
    return (time.perf_counter() - started) / CHECK_CALLS


def check_seconds(model: keras.Model, rounds: int) -> dict[str, float | bool]:
    """The non-finite check's time per call on tensors shaped like ``model``'s gradients,
    the median over ``rounds`` of (checked call - unchecked call): ``check_s`` the way
    hvdtrain checks (with the flat buffer where it applies: pack and unpack with the
    bound and its look, against without), ``read_check_s`` the separate read of every
    gradient (against a pass-through); ``flat_buffer`` whether the gradients take the
    flat buffer."""
    grads = [tf.ones_like(v) for v in model.trainable_variables]
    step = tf.constant(0, tf.int64)

    def flat(check: bool):
        shapes = [g.shape for g in grads]
        return tf.function(lambda g: tally.unpack(tally.pack(g, bound=check), shapes, step,
                                                  check=check, message="{step}")[0])

    read = tf.function(lambda g: reduction.require_finite(g, step))
    passed = tf.function(lambda g: [tf.identity(t) for t in g])
    flat_buffer = tally.packs(grads)
    pairs = {"read_check_s": (read, passed),
             "check_s": (flat(True), flat(False)) if flat_buffer else (read, passed)}

    return {"flat_buffer": flat_buffer,
            **{key: statistics.median(per_call(checked, grads) - per_call(unchecked, grads)
                                      for _ in range(rounds))
               for key, (checked, unchecked) in pairs.items()}}


class LateObserver:
    """An observer that takes late events and does nothing: what the step timing makes
    the graph do, without the timing's own Python."""

    takes_late_events = True

    def reduction_started(self, step, at=None) -> None:
        pass

    def reduction_finished(self, step, at=None) -> None:
        pass

    def step_finished(self, step, applied) -> None:
        pass


def timing_seconds(model: keras.Model, rounds: int) -> float:
    """What the step timing adds to a graph step, per step: its timestamps and the table
    of updates (told every ``LATE_BATCH`` steps), around a stand-in for the reduction on
    tensors shaped like ``model``'s gradients; the median over ``rounds`` of (timed call
    - untimed call)."""
    grads = [tf.ones_like(v) for v in model.trainable_variables]
    step = tf.Variable(0, dtype=tf.int64)
    observers = StepObservers()
    observers.add(LateObserver())

    def reduce(g):
        return [t * 0.5 for t in g]

    @tf.function
    def timed(g):
        told = step_events.reduction_started(step, after=g, observers=observers)
        averaged = reduce(g)
        step_events.reduction_finished(told, after=averaged)
        step_events.step_finished(told, True)
        return averaged

    untimed = tf.function(reduce)

    return statistics.median(per_call(timed, grads) - per_call(untimed, grads)
                             for _ in range(rounds))


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
                      keras.optimizers.SGD(0.01, momentum=0.9))),
                  "hvdtrain_unchecked": compiled(model_name, hvk.DistributedOptimizer(
                      keras.optimizers.SGD(0.01, momentum=0.9), check_nonfinite=False)),
                  "grouped_read_check": compiled(model_name, ReadCheckSGD(0.01, momentum=0.9)),
                  # the default, traced and run with the step timing paused: no timing calls
                  "hvdtrain_untimed": compiled(model_name, hvk.DistributedOptimizer(
                      keras.optimizers.SGD(0.01, momentum=0.9)))}
    names = list(contenders)
    medians = {name: [] for name in names}
    for round_number in range(rounds):
        for name in rotated(names, round_number):
            with (step_timing.paused() if name == "hvdtrain_untimed"
                  else contextlib.nullcontext()):
                step_times(contenders[name], x, y, WARMUP_STEPS)
                medians[name].append(statistics.median(step_times(contenders[name], x, y,
                                                                  steps)))
    checks = check_seconds(contenders["hvdtrain"], max(3, rounds // 5))
    checks["timing_s"] = timing_seconds(contenders["hvdtrain"], max(3, rounds // 5))
    if hvk.rank() == 0:
        print("RESULT " + json.dumps({"round_medians_s": medians, **checks,
                                      "model": model_name,
                                      "batch_per_worker": BATCH_PER_WORKER[model_name],
                                      "workers": hvk.size()}), flush=True)


if __name__ == "__main__":
    main()
