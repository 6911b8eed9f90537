"""The Keras models and synthetic data of the Keras benchmarks (all seeded).

``conv``: the same small conv net as models.py's (32x32x3 images, 32 per worker);
``mlp``: 784-512-512-10 on 64 per worker, the overhead model.
"""

from __future__ import annotations

import keras
import numpy as np

BATCH_PER_WORKER = {"mlp": 64, "conv": 32}


def make_model(name: str) -> keras.Model:
    keras.utils.set_random_seed(0)
    if name == "mlp":
        return keras.Sequential([keras.Input((784,)), keras.layers.Dense(512, "relu"),
                                 keras.layers.Dense(512, "relu"), keras.layers.Dense(10)])
    if name == "conv":
        return keras.Sequential([
            keras.Input((32, 32, 3)), keras.layers.Conv2D(32, 3, padding="same",
                                                          activation="relu"),
            keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
            keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)])
    raise ValueError(f"unknown model {name!r}; choose from {sorted(BATCH_PER_WORKER)}")


def make_data(name: str, rank: int, batches: int) -> tuple[np.ndarray, np.ndarray]:
    """``batches`` batches of this rank's synthetic examples."""
    rng = np.random.RandomState(1000 + rank)
    rows = BATCH_PER_WORKER[name] * batches
    shape = (rows, 32, 32, 3) if name == "conv" else (rows, 784)
    return rng.randn(*shape).astype("float32"), rng.randint(0, 10, rows)


def loss() -> keras.losses.Loss:
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)
