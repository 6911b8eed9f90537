"""Runs on every rank: trains with one rank slowed by a known sleep per step, then with
even ranks, and reports the step timing's windows (tests/test_step_timing.py).

``python stragglers.py FRAMEWORK`` (torch, keras or numpy), launched with
``HVDTRAIN_STRAGGLER_REPORT_SECONDS=1``. Every rank sleeps :data:`BASE_SLEEP` per step
(so that compute is dominated by a known time even on a busy host) and the last rank
:data:`EXTRA_SLEEP` more in the modes named ``slow_*``. Before each mode rank 0 writes
``MODE <name>`` to stderr, so the test can tell which mode a report line belongs to.
Each mode ends with the framework's ``join()`` (torch, Keras), which starts the window
anew, or with ``step_timing.restart()`` (NumPy, which has no join). One ``REPORT`` per
mode and rank: the records of the windows completed during the mode.
"""

import os
import sys
import time

import numpy as np
from scenarios import report, run_scenarios

from hvdtrain import step_timing

BASE_SLEEP = 0.010
EXTRA_SLEEP = 0.030
SLOW_STEPS = 80  # about 3.5 s: two windows of 1 s at least, on 3 ranks of 2 cores too
EVEN_STEPS = 120
BATCH = 16


def sleep_for_step(rank: int, size: int, slow: bool) -> None:
    time.sleep(BASE_SLEEP + (EXTRA_SLEEP if slow and rank == size - 1 else 0.0))


def windows_during(rank: int, mode: str, train, restart) -> None:
    """Run ``train`` (which calls ``poll`` after each step), then ``restart``; report the
    windows that completed meanwhile."""
    if rank == 0:
        print(f"MODE {mode}", file=sys.stderr, flush=True)
    before = step_timing.step_times()
    seen = []

    def poll() -> None:
        window = step_timing.step_times()
        if window is not None and window is not before and (not seen or window is not seen[-1]):
            seen.append(window)

    train(poll)
    restart()
    report(rank, mode, windows=[window.record() for window in seen],
           samples_per_second=[window.samples_per_second for window in seen])


def torch_modes() -> dict:
    import torch

    import hvdtrain.adapters.torch as hvt

    torch.set_num_threads(1)  # the ranks share 2 cores here: no thread pools spinning
    hvt.init()
    hvt.set_samples_per_step(BATCH)
    rank, size = hvt.rank(), hvt.size()

    def mode(name: str, slow: bool, steps: int, **wrapping):
        def train(poll) -> None:
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                        torch.nn.Linear(64, 4))
            optimizer = hvt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                                 model.named_parameters(), **wrapping)
            x, y = torch.randn(BATCH, 32), torch.randint(0, 4, (BATCH,))
            for _ in range(steps):
                optimizer.zero_grad()
                sleep_for_step(rank, size, slow)
                torch.nn.functional.cross_entropy(model(x), y).backward()
                optimizer.step()
                poll()

        return lambda: windows_during(rank, name, train, hvt.join)

    return rank, {
        "slow_flat": mode("slow_flat", True, SLOW_STEPS, overlap=False),
        "slow_overlap": mode("slow_overlap", True, SLOW_STEPS, overlap=True),
        "slow_shard_gradients": mode("slow_shard_gradients", True, SLOW_STEPS, overlap=False,
                                     shard_state=True, shard_gradients=True),
        "even_flat": mode("even_flat", False, EVEN_STEPS, overlap=False),
    }


def keras_modes() -> dict:
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    import keras

    import hvdtrain.adapters.keras as hvk

    if keras.backend.backend() == "torch":
        import torch

        torch.set_num_threads(1)  # as in torch_modes: no thread pools spinning on 2 cores
    hvk.init()
    rank, size = hvk.rank(), hvk.size()

    def mode(name: str, slow: bool, steps: int):
        class Paced(keras.callbacks.Callback):
            def __init__(self, poll) -> None:
                super().__init__()
                self.poll = poll

            def on_train_batch_begin(self, batch, logs=None) -> None:
                sleep_for_step(rank, size, slow)

            def on_train_batch_end(self, batch, logs=None) -> None:
                self.poll()

        def train(poll) -> None:
            keras.utils.set_random_seed(0)
            model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, "relu"),
                                      keras.layers.Dense(4)])
            model.compile(optimizer=hvk.DistributedOptimizer(keras.optimizers.SGD(0.01)),
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                          jit_compile=False)
            x = np.random.default_rng(rank).normal(size=(steps * BATCH, 32)).astype("float32")
            y = np.arange(steps * BATCH) % 4
            history = model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0,
                                callbacks=[Paced(poll), hvk.StepTimeLogs()])
            logged = {key: values[-1] for key, values in history.history.items()
                      if key != "loss"}
            report(rank, f"{name}_logs", logs=logged)

        return lambda: windows_during(rank, name, train, hvk.join)

    def tape_mode(name: str, slow: bool, steps: int):
        """A custom loop: TensorFlow's DistributedGradientTape, without optimizer=."""
        import tensorflow as tf

        import hvdtrain.adapters.tensorflow as hvtf

        def train(poll) -> None:
            keras.utils.set_random_seed(0)
            model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, "relu"),
                                      keras.layers.Dense(4)])
            optimizer = keras.optimizers.SGD(0.01)
            loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
            x = tf.random.stateless_normal((BATCH, 32), seed=(rank, 0))
            y = tf.range(BATCH) % 4

            @tf.function
            def step():
                with tf.GradientTape() as tape:
                    value = loss(y, model(x, training=True))
                grads = hvtf.DistributedGradientTape(tape).gradient(
                    value, model.trainable_variables)
                optimizer.apply(grads, model.trainable_variables)

            for _ in range(steps):
                sleep_for_step(rank, size, slow)
                step()
                poll()

        return lambda: windows_during(rank, name, train, hvtf.join)

    modes = {"slow_fit": mode("slow_fit", True, SLOW_STEPS)}
    if keras.backend.backend() == "tensorflow":
        modes["slow_tape"] = tape_mode("slow_tape", True, SLOW_STEPS)
    return rank, {**modes, "even_fit": mode("even_fit", False, EVEN_STEPS)}


def numpy_modes() -> dict:
    from numpy_common import gradients, make_data, make_weights

    import hvdtrain.adapters.numpy as hvn

    hvn.init()
    hvn.set_samples_per_step(BATCH)
    rank, size = hvn.rank(), hvn.size()
    x, y = make_data()

    def mode(name: str, slow: bool, steps: int):
        def train(poll) -> None:
            weights = make_weights()
            optimizer = hvn.DistributedSGD(weights, lr=0.05)
            for step in range(steps):
                sleep_for_step(rank, size, slow)
                part = slice((step * 4) % len(x), (step * 4) % len(x) + 4)
                optimizer.step(gradients(weights, x[part], y[part]))
                poll()

        return lambda: windows_during(rank, name, train, step_timing.restart)

    return rank, {"slow_sgd": mode("slow_sgd", True, SLOW_STEPS),
                  "even_sgd": mode("even_sgd", False, EVEN_STEPS)}


def main() -> None:
    rank, scenarios = {"torch": torch_modes, "keras": keras_modes,
                       "numpy": numpy_modes}[sys.argv[1]]()
    run_scenarios(lambda: rank, scenarios)


if __name__ == "__main__":
    main()
