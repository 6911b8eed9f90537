"""The textbook data-parallel step with TensorFlow: a GradientTape and a Keras optimizer.

Run:  horovodrun -np 2 python examples/seed_allreduce_tf.py

Weights w = [1.0, -1.0], learning rate 0.1; worker 0's gradient is [0.6, -0.2] and
worker 1's is [0.2, 0.4]. The step is computed twice, through
hvdtrain.adapters.tensorflow.DistributedGradientTape and through
hvdtrain.adapters.keras.DistributedOptimizer; for each, every rank prints:

    worker0_local_step [0.94, -0.98]
    allreduced_step [0.96, -1.01]
    gradient_mean [0.4, 0.1]
"""

import sys

import keras
import numpy as np
import tensorflow as tf

import hvdtrain.adapters.keras as hvk
import hvdtrain.adapters.tensorflow as hvtf

INITIAL_WEIGHTS = [1.0, -1.0]
GRADIENTS = {0: [0.6, -0.2], 1: [0.2, 0.4]}
LEARNING_RATE = 0.1


def shown(values) -> list[float]:
    return [round(float(v), 6) for v in np.asarray(values)]


def print_step(worker0_local, allreduced, gradient_mean) -> None:
    print(f"worker0_local_step {shown(worker0_local)}")
    print(f"allreduced_step {shown(allreduced)}")
    print(f"gradient_mean {shown(gradient_mean)}")


def local_step_of_worker0() -> tf.Tensor:
    """Each worker steps alone on its own gradient; rank 0's result is shared."""
    weights = tf.Variable(INITIAL_WEIGHTS, dtype=tf.float64)
    keras.optimizers.SGD(LEARNING_RATE).apply(
        [tf.constant(GRADIENTS[hvtf.rank()], tf.float64)], [weights])
    return hvtf.broadcast(tf.convert_to_tensor(weights), root_rank=0, name="worker0_local_step")


def step_with_tape() -> tuple[tf.Tensor, tf.Tensor]:
    weights = tf.Variable(INITIAL_WEIGHTS, dtype=tf.float64)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(weights * tf.constant(GRADIENTS[hvtf.rank()], tf.float64))
    gradient = hvtf.DistributedGradientTape(tape).gradient(loss, [weights])[0]
    weights.assign_sub(LEARNING_RATE * gradient)
    return weights, gradient


def step_with_keras_optimizer() -> tuple[np.ndarray, np.ndarray]:
    weights = keras.Variable(INITIAL_WEIGHTS, dtype="float64")
    optimizer = hvk.DistributedOptimizer(keras.optimizers.SGD(LEARNING_RATE))
    optimizer.apply([tf.constant(GRADIENTS[hvtf.rank()], tf.float64)], [weights])
    after = keras.ops.convert_to_numpy(weights)
    return after, (np.array(INITIAL_WEIGHTS) - after) / LEARNING_RATE


def main() -> int:
    hvtf.init()
    if hvtf.size() != 2:
        print(f"this example needs exactly 2 workers (horovodrun -np 2), got {hvtf.size()}",
              file=sys.stderr)
        return 2
    worker0_local = local_step_of_worker0()
    print("# through hvdtrain.adapters.tensorflow.DistributedGradientTape")
    print_step(worker0_local, *step_with_tape())
    print("# through hvdtrain.adapters.keras.DistributedOptimizer")
    print_step(worker0_local, *step_with_keras_optimizer())
    hvtf.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
