"""An elastic Keras ``fit`` job with hvdtrain's KerasState:
``python keras_elastic_train.py MODE HOSTS`` (HOSTS: the folder of
hvdtrain.jobs.local_hosts.LocalHosts the job was started with).

The Keras twin of torch_elastic_train.py, with the same settings and modes (see
there, and tests/elastic_jobs.py): a linear model on 240 numbered samples,
batch 4 per worker, SGD with momentum through DistributedOptimizer,
LinearScalingWarmup (η = 0.05 for a batch of 4, 2 warmup epochs), ElasticData, 2
epochs, CommitState every 4 batches. Same ``REPORT`` lines; a step's ``lr`` is the
optimizer's rate when the batch ran.
"""

import hashlib
import os
import signal
import socket
import sys
import time
from pathlib import Path

import keras
import numpy as np
from keras import ops
from scenarios import report as report_for_rank

import hvdtrain.adapters.keras as hvk
from hvdtrain.adapters.keras import elastic
from hvdtrain.jobs.local_hosts import LocalHosts

MODE, HOSTS = sys.argv[1], LocalHosts(Path(sys.argv[2]))
SAMPLES, BATCH, EPOCHS, COMMIT_EVERY = 240, 4, 2, 4
KILL_AT, GROW_AFTER = 14, 8
# Which rank of the first 3 kills itself at step KILL_AT, by mode.
VICTIM = {"shrink": 2, "lose-rank-0": 0, "below-min": 2}.get(MODE)


def report(scenario: str, **values) -> None:
    report_for_rank(hvk.rank(), scenario, size=hvk.size(), **values)


def fingerprint(model: keras.Model) -> str:
    digest = hashlib.sha256()
    for variable in list(model.variables) + list(model.optimizer.variables):
        digest.update(np.ascontiguousarray(ops.convert_to_numpy(variable)).tobytes())
    return digest.hexdigest()[:16]


class Reporter(keras.callbacks.Callback):
    """Kills the mode's victim, reports every step, offers the third host (grow)."""

    def __init__(self, state: elastic.KerasState, consumed: list) -> None:
        super().__init__()
        self.state, self.consumed = state, consumed

    def on_train_batch_begin(self, batch, logs=None) -> None:
        if self.state.step == KILL_AT and hvk.rank() == VICTIM and hvk.size() == 3:
            report("killed", step=self.state.step, time=time.time())
            os.kill(os.getpid(), signal.SIGKILL)
        self.lr = float(ops.convert_to_numpy(self.model.optimizer.learning_rate))

    def on_train_batch_end(self, batch, logs=None) -> None:
        data = self.state.data
        self.consumed.extend((data.epoch, int(i)) for i in data.batch_indices(batch))
        report("step", step=self.state.step, epoch=data.epoch, lr=self.lr, time=time.time())
        self.state.step += 1
        if (MODE == "grow" and self.state.step == GROW_AFTER + 1 and hvk.rank() == 0
                and hvk.size() == 2):
            HOSTS.set(["host-a", "host-b", "host-c"])
        time.sleep(0.05)  # leave the driver time to notice a new host


def main() -> None:
    hvk.init()
    report("started", pid=os.getpid(), host=socket.gethostname())
    keras.config.set_floatx("float64")  # rates exact enough to compare with the closed form
    rng = np.random.default_rng(0)
    x = rng.standard_normal((SAMPLES, 4))
    y = x @ np.array([1.0, -2.0, 0.5, 3.0])
    keras.utils.set_random_seed(100 + hvk.rank())  # different until the state's first sync
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer=hvk.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.5)),
                  loss="mse", jit_compile=False)
    data = elastic.ElasticData(x, y, batch_size=BATCH, seed=0)
    warmup = hvk.LinearScalingWarmup(batch_size_per_worker=BATCH, base_batch_size=BATCH,
                                     warmup_epochs=2)
    state = elastic.KerasState(model, warmup=warmup, data=data, step=0)
    consumed: list[tuple[int, int]] = []  # this rank's (epoch, sample) since the last commit

    save = state.save

    def save_and_report() -> None:  # every commit saves, then asks about hosts
        save()
        report("commit", step=state.step, epoch=state.epoch, samples=consumed,
               samples_seen=warmup.samples_seen, fingerprint=fingerprint(model))
        consumed.clear()

    state.save = save_and_report
    callbacks = [warmup, Reporter(state, consumed), elastic.CommitState(state, COMMIT_EVERY)]

    @elastic.run
    def train(state) -> None:
        consumed.clear()  # what was consumed since the last commit was rolled back
        while state.epoch < EPOCHS:
            model.fit(data, initial_epoch=state.epoch, epochs=EPOCHS, callbacks=callbacks,
                      verbose=0)

    train(state)
    hvk.verify_replicas(model)
    report("done", fingerprint=fingerprint(model), steps=state.step,
           gloo_timeout=os.environ.get("HOROVOD_GLOO_TIMEOUT_SECONDS"))


if __name__ == "__main__":
    main()
