"""Data-parallel ``model.fit`` on scikit-learn's digits with hvdtrain's Keras 3 adapter.

Run:  horovodrun -np 2 --mpi python examples/keras_train.py

Each worker fits its own shard of the digits (shipped inside scikit-learn; nothing is
downloaded). The distributed optimizer averages gradients across workers; the four
callbacks start every replica from rank 0's state, follow Goyal et al.'s linear
scaling rule with gradual warmup (with momentum correction), average the metrics
across workers and check that the replicas stay identical. Only rank 0 prints.
"""

from __future__ import annotations

import argparse
import sys

import keras
import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import hvdtrain.adapters.keras as hvk


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--batch-size-per-worker", type=int, default=32)
    parser.add_argument("--base-lr", type=float, default=0.05,
                        help="learning rate tuned for --base-batch-size (eta)")
    parser.add_argument("--base-batch-size", type=int, default=32)
    parser.add_argument("--warmup-epochs", type=float, default=2)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def digits_shard(seed: int, batch_size: int) -> tuple[np.ndarray, ...]:
    """This worker's share of the digits: every size()-th example, cut so that every
    worker has the same number of full batches (or the allreduces would not pair up)."""
    data = load_digits()
    x_train, x_val, y_train, y_val = train_test_split(
        (data.data / 16.0).astype("float32"), data.target, test_size=0.2,
        random_state=seed, stratify=data.target,
    )
    train_rows = len(x_train) // hvk.size() // batch_size * batch_size
    val_rows = len(x_val) // hvk.size()
    share = slice(hvk.rank(), None, hvk.size())
    return (x_train[share][:train_rows], y_train[share][:train_rows],
            x_val[share][:val_rows], y_val[share][:val_rows])


def main() -> int:
    args = parse_args()
    hvk.init()
    keras.utils.set_random_seed(args.seed + hvk.rank())  # differs: BroadcastInitialState fixes it
    x_train, y_train, x_val, y_val = digits_shard(args.seed, args.batch_size_per_worker)
    model = keras.Sequential([
        keras.Input((64,)),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ])
    model.compile(
        optimizer=hvk.DistributedOptimizer(keras.optimizers.SGD(args.base_lr, momentum=0.9)),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        jit_compile=False,
    )
    callbacks = [
        hvk.BroadcastInitialState(),
        hvk.LinearScalingWarmup(batch_size_per_worker=args.batch_size_per_worker,
                                base_batch_size=args.base_batch_size,
                                warmup_epochs=args.warmup_epochs),
        hvk.MetricAverage(),
        hvk.ReplicaCheck(),
        hvk.CollectiveWatchdog(),  # a rank left waiting for the others ends the job
    ]
    model.fit(x_train, y_train, batch_size=args.batch_size_per_worker, epochs=args.epochs,
              validation_data=(x_val, y_val), callbacks=callbacks,
              verbose=2 if hvk.rank() == 0 else 0)
    hvk.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
