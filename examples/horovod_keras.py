"""A Horovod Keras script, unchanged but for its import line, on hvdtrain.

Run:  horovodrun -np 2 python examples/horovod_keras.py

Written the way Horovod's documentation teaches (``horovod.tensorflow.keras``: scale
the rate by the number of workers, wrap the optimizer, broadcast from rank 0, average
the metrics, warm the rate up, checkpoint on rank 0, print on rank 0), on
scikit-learn's digits. Only the import differs from a Horovod script: Horovod's own
Keras module does not average gradients on Keras 3; hvdtrain's, under the same
names, does (docs/keras.md, "Coming from horovod.tensorflow.keras").
"""

from __future__ import annotations

import argparse
import os
import tempfile

import keras
import numpy as np
from sklearn.datasets import load_digits

import hvdtrain.adapters.keras as hvd  # was: import horovod.tensorflow.keras as hvd


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    args = parser.parse_args()

    hvd.init()
    digits = load_digits()
    x = (digits.data / 16.0).astype("float32")
    y = digits.target
    # Each worker takes every size()-th example, as many as the others.
    rows = len(x) // hvd.size() // 32 * 32
    x, y = x[hvd.rank()::hvd.size()][:rows], y[hvd.rank()::hvd.size()][:rows]

    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(10)])
    scaled_lr = 0.02 * hvd.size()
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(scaled_lr, momentum=0.9))
    model.compile(optimizer=optimizer,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], jit_compile=False)

    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=2,
                                                 verbose=1),
    ]
    folder = tempfile.mkdtemp(prefix="horovod-keras-")
    if hvd.rank() == 0:
        callbacks.append(keras.callbacks.ModelCheckpoint(os.path.join(folder, "last.keras")))
    history = model.fit(x, y, batch_size=32, epochs=args.epochs, callbacks=callbacks,
                        verbose=2 if hvd.rank() == 0 else 0)
    weights = np.concatenate([w.ravel() for w in model.get_weights()])
    identical = hvd.allgather(weights[None, :]).numpy()
    if hvd.rank() == 0:
        same = all(np.array_equal(identical[0], other) for other in identical[1:])
        print(f"final accuracy {history.history['accuracy'][-1]:.3f} on {hvd.size()} workers, "
              f"replicas {'identical' if same else 'DIFFER'}")


if __name__ == "__main__":
    main()
