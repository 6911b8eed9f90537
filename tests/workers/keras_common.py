"""What the Keras/TensorFlow workers and their tests build alike: data, model, references.

The workers train on 2 ranks through hvdtrain; the tests repeat the training in one
plain-Keras process on the concatenated batch with the same learning-rate sequence,
the independent computation the distributed run must equal.
"""

import keras
import numpy as np

from hvdtrain.schedule import LinearScalingSchedule

FEATURES, HIDDEN, CLASSES = 6, 5, 3
BATCH_PER_WORKER = 4
WORKERS = 2
STEPS_PER_EPOCH = 5
EPOCHS = 4
WARMUP_EPOCHS = 2
ETA = {"sgd": 0.05, "adam": 0.01}


def use_floatx(name: str) -> None:
    """Make new layers compute in ``name`` (a dtype, "mixed_float16" or "mixed_bfloat16").

    Setting floatx alone is not enough: the first layer made fixes Keras's global dtype
    policy at the floatx of the moment, and later floatx changes do not move it.
    """
    keras.config.set_floatx("float32" if name.startswith("mixed") else name)
    keras.config.set_dtype_policy(name)


def make_data(passes: int = 1, workers: int = WORKERS) -> tuple[np.ndarray, np.ndarray]:
    """One epoch: STEPS_PER_EPOCH steps of the global batch of ``workers`` (x passes)."""
    rng = np.random.RandomState(7)
    rows = STEPS_PER_EPOCH * BATCH_PER_WORKER * workers * passes
    return rng.randn(rows, FEATURES), rng.randint(0, CLASSES, rows)


def shard(x: np.ndarray, y: np.ndarray, rank: int,
          workers: int = WORKERS) -> tuple[np.ndarray, np.ndarray]:
    """Rank ``rank``'s rows of ``workers``: its block of every (micro-)batch, in order."""
    blocks = x.reshape(-1, workers, BATCH_PER_WORKER, *x.shape[1:])[:, rank]
    labels = y.reshape(-1, workers, BATCH_PER_WORKER, *y.shape[1:])[:, rank]
    return blocks.reshape(-1, *x.shape[1:]), labels.reshape(-1, *y.shape[1:])


def make_model(seed: int = 123) -> keras.Model:
    """Weights drawn with NumPy, so every Keras backend starts from the same values."""
    model = keras.Sequential([keras.Input((FEATURES,)),
                              keras.layers.Dense(HIDDEN, activation="tanh"),
                              keras.layers.Dense(CLASSES)])
    rng = np.random.RandomState(seed)
    model.set_weights([rng.uniform(-0.5, 0.5, w.shape) for w in model.get_weights()])
    return model


def make_optimizer(kind: str) -> keras.optimizers.Optimizer:
    if kind == "sgd":
        return keras.optimizers.SGD(ETA["sgd"], momentum=0.9)
    return keras.optimizers.Adam(ETA["adam"], weight_decay=0.01)


def loss() -> keras.losses.Loss:
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def schedule(kind: str, passes: int = 1, workers: int = WORKERS) -> LinearScalingSchedule:
    """Base batch = one worker's batch, so k = workers x passes."""
    return LinearScalingSchedule(
        base_lr=ETA[kind], batch_size_per_worker=BATCH_PER_WORKER, world_size=workers,
        steps_per_epoch=STEPS_PER_EPOCH, base_batch_size=BATCH_PER_WORKER,
        warmup_epochs=WARMUP_EPOCHS, backward_passes_per_step=passes,
    )


class _ReferenceRate(keras.callbacks.Callback):
    """The reference's own LR setter: rate from the schedule, Goyal's velocity rescale."""

    def __init__(self, plan: LinearScalingSchedule, correct_momentum: bool):
        super().__init__()
        self.plan, self.correct_momentum, self.step = plan, correct_momentum, 0

    def on_train_batch_begin(self, batch, logs=None):
        optimizer = self.model.optimizer
        old = float(keras.ops.convert_to_numpy(optimizer.learning_rate))
        new = self.plan.lr_at(self.step)
        optimizer.learning_rate = new
        if self.correct_momentum and optimizer.built and new != old:
            for velocity in optimizer.momentums:
                velocity.assign(velocity * (new / old))
        self.step += 1


def reference_fit(kind: str, passes: int = 1, floatx: str = "float64",
                  workers: int = WORKERS) -> list[np.ndarray]:
    """One process fitting the concatenated data with the global batch of ``workers``,
    computing in ``floatx`` (a dtype or a mixed policy)."""
    use_floatx(floatx)
    x, y = make_data(passes, workers)
    model = make_model()
    model.compile(optimizer=make_optimizer(kind), loss=loss(), jit_compile=False)
    model.fit(x, y, batch_size=BATCH_PER_WORKER * workers * passes, epochs=EPOCHS,
              shuffle=False, verbose=0,
              callbacks=[_ReferenceRate(schedule(kind, passes, workers),
                                        correct_momentum=kind == "sgd")])
    return model.get_weights()


# The uneven-shares (JoinAtEpochEnd) scenario: batches per epoch of each rank, taken in
# order from make_data()'s global batches (rank r's block of each), for JOIN_EPOCHS.
JOIN_BATCHES = (3, 2)
JOIN_EPOCHS = 2


def join_shares(rank: int) -> tuple[np.ndarray, np.ndarray]:
    """Rank ``rank``'s share in the uneven-shares scenario."""
    x, y = shard(*make_data(), rank)
    rows = JOIN_BATCHES[rank] * BATCH_PER_WORKER
    return x[:rows], y[:rows]


def join_schedule() -> LinearScalingSchedule:
    """The rule for the uneven shares: an epoch is the longest share's batches."""
    return LinearScalingSchedule(
        base_lr=ETA["sgd"], batch_size_per_worker=BATCH_PER_WORKER, world_size=WORKERS,
        steps_per_epoch=max(JOIN_BATCHES), base_batch_size=BATCH_PER_WORKER,
        warmup_epochs=WARMUP_EPOCHS)


def reference_join_fit(warmup: bool = True) -> tuple[list[np.ndarray], list[float]]:
    """One process on the uneven shares: each step's batch is the blocks of the ranks that
    still have one (make_data()'s rows in order, as the shares were cut), at the rule's
    rate (``warmup``) or at η. Returns the final weights and each epoch's training loss."""
    use_floatx("float64")
    x, y = make_data()
    rows = sum(JOIN_BATCHES) * BATCH_PER_WORKER  # steps 0-1 whole, then rank 0's block
    model = make_model()
    model.compile(optimizer=make_optimizer("sgd"), loss=loss(), jit_compile=False)
    history = model.fit(x[:rows], y[:rows], batch_size=BATCH_PER_WORKER * WORKERS,
                        epochs=JOIN_EPOCHS, shuffle=False, verbose=0,
                        callbacks=[_ReferenceRate(join_schedule(), correct_momentum=True)]
                        if warmup else [])
    return model.get_weights(), history.history["loss"]


def reference_custom_loop(steps: int = EPOCHS * STEPS_PER_EPOCH) -> list[np.ndarray]:
    """One process, plain SGD with momentum, rate set to the schedule each step."""
    import tensorflow as tf

    use_floatx("float64")
    x, y = make_data()
    model = make_model()
    optimizer = make_optimizer("sgd")
    plan = schedule("sgd")
    batch = BATCH_PER_WORKER * WORKERS
    for step in range(steps):
        optimizer.learning_rate = plan.lr_at(step)
        rows = slice(step % STEPS_PER_EPOCH * batch, (step % STEPS_PER_EPOCH + 1) * batch)
        xb, yb = keras.ops.convert_to_tensor(x[rows]), y[rows]
        with tf.GradientTape() as tape:
            value = loss()(yb, model(xb, training=True))
        grads = tape.gradient(value, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
    return model.get_weights()


# Mixed precision: the rows of global batch OVERFLOW_STEP that belong to rank 1 are
# multiplied by OVERFLOW_FACTOR, which overflows float16 in the forward pass.
OVERFLOW_STEP, OVERFLOW_FACTOR = 2, 1e5


def make_overflowing_data() -> tuple[np.ndarray, np.ndarray]:
    """make_data() with rank 1's share of global batch OVERFLOW_STEP made to overflow."""
    x, y = make_data()
    batch = BATCH_PER_WORKER * WORKERS
    start = OVERFLOW_STEP * batch + BATCH_PER_WORKER  # rank 1's block of that batch
    x = x.copy()
    x[start:start + BATCH_PER_WORKER] *= OVERFLOW_FACTOR
    return x, y


class LossScaleRecorder(keras.callbacks.Callback):
    """The loss scale and the optimizer's step count after every batch."""

    def __init__(self):
        super().__init__()
        self.scales, self.iterations = [], []

    def on_train_batch_end(self, batch, logs=None):
        optimizer = self.model.optimizer
        self.scales.append(float(keras.ops.convert_to_numpy(optimizer.dynamic_scale)))
        self.iterations.append(int(keras.ops.convert_to_numpy(optimizer.iterations)))


def reference_mixed_precision() -> tuple[list[np.ndarray], LossScaleRecorder]:
    """One process, mixed_float16 with Keras's own loss scaling, on the concatenated
    overflowing data with the global batch, one epoch."""
    use_floatx("mixed_float16")
    x, y = make_overflowing_data()
    model = make_model()
    model.compile(optimizer=keras.optimizers.SGD(ETA["sgd"]), loss=loss(), jit_compile=False)
    recorder = LossScaleRecorder()
    model.fit(x, y, batch_size=BATCH_PER_WORKER * WORKERS, epochs=1, shuffle=False, verbose=0,
              callbacks=[recorder])
    return model.get_weights(), recorder


# Horovod's learning-rate callbacks: LearningRateWarmupCallback(initial_lr=HOROVOD_LR,
# warmup_epochs=2), then LearningRateScheduleCallback(multiplier=0.5, epochs 2-4).
HOROVOD_LR = 0.1


def horovod_rate(epoch: int, batch: int) -> float:
    """Horovod's documented rate for a batch, written out from its formulas."""
    if epoch < 2:
        fraction = epoch + (batch + 1) / STEPS_PER_EPOCH  # its ramp is one batch ahead
        return HOROVOD_LR * (fraction * (WORKERS - 1) / 2 + 1) / WORKERS
    return HOROVOD_LR * 0.5 ** (epoch - 2)


VOCABULARY, EMBEDDING = 20, 3


def make_embedding_data() -> tuple[np.ndarray, np.ndarray]:
    """One epoch of token pairs (a few tokens repeat within and across workers' batches)."""
    rng = np.random.RandomState(11)
    rows = STEPS_PER_EPOCH * BATCH_PER_WORKER * WORKERS
    return rng.randint(0, VOCABULARY, (rows, 2)), rng.randn(rows, 1)


def make_embedding_model() -> keras.Model:
    """Embedding (sparse gradients on TensorFlow) -> Flatten -> Dense, fixed weights."""
    model = keras.Sequential([keras.Input((2,), dtype="int32"),
                              keras.layers.Embedding(VOCABULARY, EMBEDDING),
                              keras.layers.Flatten(), keras.layers.Dense(1)])
    rng = np.random.RandomState(5)
    model.set_weights([rng.uniform(-0.5, 0.5, w.shape) for w in model.get_weights()])
    return model


def reference_embedding_fit() -> list[np.ndarray]:
    """One process, plain SGD, the concatenated batches, one epoch."""
    use_floatx("float64")
    x, y = make_embedding_data()
    model = make_embedding_model()
    model.compile(optimizer=keras.optimizers.SGD(ETA["sgd"]), loss="mse", jit_compile=False)
    model.fit(x, y, batch_size=BATCH_PER_WORKER * WORKERS, epochs=1, shuffle=False, verbose=0)
    return model.get_weights()


def make_batch_norm_model(normalization: type) -> keras.Model:
    """Dense -> ``normalization`` (BatchNormalization or a subclass) -> tanh -> Dense,
    with weights drawn with NumPy (the same on every rank)."""
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(HIDDEN),
                              normalization(momentum=0.5), keras.layers.Activation("tanh"),
                              keras.layers.Dense(CLASSES)])
    rng = np.random.RandomState(17)
    model.set_weights([rng.uniform(0.5, 1.5, w.shape) for w in model.get_weights()])
    return model


def reference_batch_norm_fit() -> list[np.ndarray]:
    """One process, plain BatchNormalization, the global batch, one epoch of SGD."""
    use_floatx("float64")
    x, y = make_data()
    model = make_batch_norm_model(keras.layers.BatchNormalization)
    model.compile(optimizer=keras.optimizers.SGD(ETA["sgd"]), loss=loss(), jit_compile=False)
    model.fit(x, y, batch_size=BATCH_PER_WORKER * WORKERS, epochs=1, shuffle=False, verbose=0)
    return model.get_weights()


def reference_accumulated_fit(skipped_updates: int = 0) -> list[np.ndarray]:
    """One process, plain SGD, one epoch of make_data(passes=2) in batches of 2
    micro-batches x WORKERS x BATCH_PER_WORKER, without its first ``skipped_updates``
    batches."""
    use_floatx("float64")
    x, y = make_data(passes=2)
    skipped = skipped_updates * 2 * WORKERS * BATCH_PER_WORKER
    x, y = x[skipped:], y[skipped:]
    model = make_model()
    model.compile(optimizer=keras.optimizers.SGD(ETA["sgd"]), loss=loss(), jit_compile=False)
    model.fit(x, y, batch_size=2 * WORKERS * BATCH_PER_WORKER, epochs=1, shuffle=False,
              verbose=0)
    return model.get_weights()


VALIDATION_EXAMPLES = 21  # 11 + 10 on 2 workers: shares of different sizes


def make_validation_data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.RandomState(23)
    return rng.randn(VALIDATION_EXAMPLES, FEATURES), rng.randint(0, CLASSES, VALIDATION_EXAMPLES)
