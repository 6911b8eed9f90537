"""A softmax regression on NumPy arrays, shared by the NumPy worker and its test."""

import numpy as np

from hvdtrain.schedule import LinearScalingSchedule

FEATURES, CLASSES, BATCH_PER_WORKER, WORKERS, STEPS = 6, 3, 4, 2, 20


def make_data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.RandomState(7)
    n = STEPS * BATCH_PER_WORKER * WORKERS
    return rng.randn(n, FEATURES), rng.randint(0, CLASSES, n)


def make_weights(seed: int = 123) -> list[np.ndarray]:
    rng = np.random.RandomState(seed)
    return [rng.randn(FEATURES, CLASSES) * 0.1, rng.randn(CLASSES) * 0.1]


def rows(step: int, rank: int) -> slice:
    start = (step * WORKERS + rank) * BATCH_PER_WORKER
    return slice(start, start + BATCH_PER_WORKER)


def gradients(weights: list[np.ndarray], x: np.ndarray, y: np.ndarray) -> list[np.ndarray]:
    """Gradient of the mean softmax cross-entropy over the batch."""
    w, b = weights
    logits = x @ w + b
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    p[np.arange(len(y)), y] -= 1
    p /= len(y)
    return [x.T @ p, p.sum(axis=0)]


def reference_sgd() -> list[np.ndarray]:
    """One process on the concatenated batch, the same LR sequence, momentum 0.9."""
    x, y = make_data()
    weights = make_weights()
    velocity = [np.zeros_like(w) for w in weights]
    plan = LinearScalingSchedule(base_lr=0.1, batch_size_per_worker=BATCH_PER_WORKER,
                                 world_size=WORKERS, steps_per_epoch=5,
                                 base_batch_size=BATCH_PER_WORKER, warmup_epochs=2)
    batch = BATCH_PER_WORKER * WORKERS
    for step in range(STEPS):
        part = slice(step * batch, (step + 1) * batch)
        for w, v, g in zip(weights, velocity, gradients(weights, x[part], y[part]), strict=True):
            v[...] = 0.9 * v + g
            w -= plan.lr_at(step) * v
    return weights
