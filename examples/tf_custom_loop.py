"""A TensorFlow custom training loop, data-parallel, with hvdtrain's TensorFlow adapter.

Run:  horovodrun -np 2 --mpi python examples/tf_custom_loop.py

The same job as examples/keras_train.py, written as a ``tf.function`` train step:
DistributedGradientTape averages the gradients, the learning rate is hvdtrain's
LinearScalingWarmup schedule, rank 0's variables are broadcast before the first step
and the replicas are checked every epoch. Only rank 0 prints. With
``--backward-passes-per-step N`` each update applies the mean over N micro-batches of
every worker (Keras accumulates them; one allreduce per update).
"""

from __future__ import annotations

import argparse
import sys

import keras
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import hvdtrain.adapters.tensorflow as hvtf
from hvdtrain import watchdog


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--batch-size-per-worker", type=int, default=32)
    parser.add_argument("--base-lr", type=float, default=0.05)
    parser.add_argument("--base-batch-size", type=int, default=32)
    parser.add_argument("--warmup-epochs", type=float, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backward-passes-per-step", type=int, default=1,
                        help="micro-batches per update")
    return parser.parse_args()


def digits_shard(seed: int, batch_size: int) -> tuple[np.ndarray, ...]:
    """Every size()-th example, cut to the same number of full batches on every worker."""
    data = load_digits()
    x_train, x_val, y_train, y_val = train_test_split(
        (data.data / 16.0).astype("float32"), data.target, test_size=0.2,
        random_state=seed, stratify=data.target,
    )
    train_rows = len(x_train) // hvtf.size() // batch_size * batch_size
    val_rows = len(x_val) // hvtf.size()
    share = slice(hvtf.rank(), None, hvtf.size())
    return (x_train[share][:train_rows], y_train[share][:train_rows],
            x_val[share][:val_rows], y_val[share][:val_rows])


def main() -> int:
    args = parse_args()
    hvtf.init()
    keras.utils.set_random_seed(args.seed + hvtf.rank())  # differs: the broadcast fixes it
    x_train, y_train, x_val, y_val = digits_shard(args.seed, args.batch_size_per_worker)
    passes = args.backward_passes_per_step
    # Whole updates per epoch, so that the replica check meets empty accumulators.
    micro_batches = len(x_train) // args.batch_size_per_worker // passes * passes
    if micro_batches == 0:
        raise SystemExit(f"--backward-passes-per-step {passes} is more than the "
                         f"{len(x_train) // args.batch_size_per_worker} batches of an epoch")
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(10)])
    schedule = hvtf.LinearScalingWarmup(
        args.base_lr, batch_size_per_worker=args.batch_size_per_worker,
        steps_per_epoch=micro_batches // passes, base_batch_size=args.base_batch_size,
        warmup_epochs=args.warmup_epochs, backward_passes_per_step=passes,
    )
    optimizer = keras.optimizers.SGD(schedule, momentum=0.9,
                                     gradient_accumulation_steps=passes if passes > 1 else None)
    optimizer.build(model.trainable_variables)
    hvtf.broadcast_variables(model.variables + optimizer.variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def train_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = hvtf.DistributedGradientTape(
            tape, optimizer=optimizer, backward_passes_per_step=passes
        ).gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return loss

    for epoch in range(args.epochs):
        order = np.random.RandomState(args.seed + epoch).permutation(len(x_train))
        losses = []
        for micro in range(micro_batches):
            batch = order[micro * args.batch_size_per_worker:
                          (micro + 1) * args.batch_size_per_worker]
            # A rank left waiting in the allreduce (another rank died or skipped the step)
            # ends the job after HVDTRAIN_COLLECTIVE_TIMEOUT_SECONDS instead of hanging.
            # The first call also traces the step; a model that traces for longer than
            # the limit should leave that call unguarded.
            with watchdog.guard(f"the train step of epoch {epoch} batch {micro}"):
                losses.append(float(train_step(x_train[batch], y_train[batch])))
        correct = np.sum(np.argmax(model(x_val), axis=1) == y_val)
        totals = hvtf.allreduce(tf.constant([np.mean(losses), correct, len(y_val)], tf.float64),
                                op=hvtf.Sum, name="epoch_totals").numpy()
        hvtf.verify_replicas(model.variables + optimizer.variables)
        if hvtf.rank() == 0:
            print(f"epoch {epoch + 1:>2}/{args.epochs}  "
                  f"lr {float(optimizer.learning_rate):.4f}  "
                  f"train loss {totals[0] / hvtf.size():.4f}  "
                  f"val accuracy {totals[1] / totals[2]:.4f}  (replicas identical)", flush=True)
    hvtf.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
