"""Elastic ``model.fit`` with hvdtrain's Keras 3 adapter: workers may leave or join
mid-training, and the learning rate follows the linear scaling rule for however many
remain.

Demo:  python examples/keras_elastic.py --demo
       (starts a 3-worker elastic job on this machine, kills one worker mid-training,
       finishes on 2; the last line reads
       ``workers 3 -> 2 at step S, lr X -> Y, replicas identical, done``)
Run:   horovodrun --gloo -np 3 --min-np 2 --max-np 4 \\
           --host-discovery-script ./discover.sh python examples/keras_elastic.py

The digit classifier of examples/keras_train.py, fitted inside ``hvk.elastic.run``:
the weights, optimizer variables, warmup progress, the data's place in the epoch and
the epoch live in an ``hvk.elastic.KerasState``, committed every few batches by the
``CommitState`` callback. When a worker is lost the others roll back to the last
commit, re-form without it, and ``fit`` goes on: ``ElasticData`` shares what is left
of the epoch among the workers that remain, and the warmup continues the rule for the
new k from the samples seen (with the momentum corrected). Only rank 0 prints.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys

import keras
from keras import ops
from sklearn.datasets import load_digits

import hvdtrain.adapters.keras as hvk
from hvdtrain.jobs.local_hosts import run_elastic_demo

SUMMARY = re.compile(r"workers \d+ -> \d+ at step \d+, lr .* done$")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--demo", action="store_true",
                        help="start a 3-worker elastic job here and kill one worker in it")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--batch-size-per-worker", type=int, default=32)
    parser.add_argument("--base-lr", type=float, default=0.05,
                        help="learning rate tuned for --base-batch-size (eta)")
    parser.add_argument("--base-batch-size", type=int, default=32)
    parser.add_argument("--warmup-epochs", type=float, default=2)
    parser.add_argument("--commit-every", type=int, default=5, help="batches between commits")
    parser.add_argument("--kill-rank-at-step", type=int, nargs=2, metavar=("RANK", "STEP"),
                        help="(the demo) this rank kills itself before this step")
    return parser.parse_args()


def say(line: str) -> None:
    """One write per line: the launcher forwards each write separately."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class Progress(keras.callbacks.Callback):
    """Counts steps in the state, notes each change of the number of workers, prints
    each epoch on rank 0, and (the demo) kills a rank at a step."""

    def __init__(self, state: hvk.elastic.KerasState, kill: list[int] | None) -> None:
        super().__init__()
        self.state, self.kill = state, kill
        self.changes: list[str] = []
        self.last: dict | None = None

    def on_train_batch_begin(self, batch: int, logs=None) -> None:
        if self.kill == [hvk.rank(), self.state.step]:
            os.kill(os.getpid(), signal.SIGKILL)  # the demo's lost worker
        lr = float(ops.convert_to_numpy(self.model.optimizer.learning_rate))
        if self.last is not None and hvk.size() != self.last["size"]:
            self.changes.append(f"workers {self.last['size']} -> {hvk.size()} at step "
                                f"{self.state.step}, lr {self.last['lr']:.4g} -> {lr:.4g}")
            if hvk.rank() == 0:
                say(f"{self.changes[-1]}: rolled back to the last commit, going on")
        self.last = {"size": hvk.size(), "lr": lr}

    def on_train_batch_end(self, batch: int, logs=None) -> None:
        self.state.step += 1

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        if hvk.rank() == 0:
            say(f"epoch {epoch + 1}  workers {hvk.size()}  lr {self.last['lr']:.4f}  "
                f"loss {logs['loss']:.4f}  accuracy {logs['accuracy']:.3f}")


def train(args: argparse.Namespace) -> None:
    hvk.init()
    keras.utils.set_random_seed(hvk.rank())  # differs per rank: the state's first sync fixes it
    digits = load_digits()
    data = hvk.elastic.ElasticData((digits.data / 16.0).astype("float32"), digits.target,
                                   batch_size=args.batch_size_per_worker, seed=0)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(10)])
    model.compile(
        optimizer=hvk.DistributedOptimizer(keras.optimizers.SGD(args.base_lr, momentum=0.9)),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"], jit_compile=False)
    warmup = hvk.LinearScalingWarmup(batch_size_per_worker=args.batch_size_per_worker,
                                     base_batch_size=args.base_batch_size,
                                     warmup_epochs=args.warmup_epochs)
    state = hvk.elastic.KerasState(model, warmup=warmup, data=data, step=0)
    progress = Progress(state, args.kill_rank_at_step)
    # MetricAverage first (every rank logs the same numbers), CommitState last.
    callbacks = [hvk.MetricAverage(), warmup, progress,
                 hvk.elastic.CommitState(state, batches_per_commit=args.commit_every)]

    @hvk.elastic.run
    def fit(state: hvk.elastic.KerasState) -> None:
        # A fit that resumes mid-epoch stops at that epoch's end; the loop goes on.
        while state.epoch < args.epochs:
            model.fit(data, initial_epoch=state.epoch, epochs=args.epochs,
                      callbacks=callbacks, verbose=0)

    fit(state)
    hvk.verify_replicas(model)
    if hvk.rank() == 0:
        say(f"{'; '.join(progress.changes) or f'workers {hvk.size()} throughout'}, "
            "replicas identical, done")


def demo(args: argparse.Namespace) -> int:
    """Run this script as a 3-worker elastic job on this machine, one host name per
    worker, whose rank 2 kills itself at step 17 (two steps after a commit)."""
    say("starting 3 workers (host-a, host-b, host-c on this machine); rank 2 will be "
        "killed at step 17")
    return run_elastic_demo(
        [sys.executable, __file__, "--epochs", str(args.epochs), "--kill-rank-at-step", "2", "17"],
        ["host-a", "host-b", "host-c"], min_np=2, summary=SUMMARY, say=say)


def main() -> int:
    args = parse_args()
    if args.demo:
        return demo(args)
    train(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
