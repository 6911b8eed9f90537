"""The textbook data-parallel step on plain NumPy arrays, through hvdtrain's NumPy adapter.

Run:  horovodrun --mpi -np 2 python examples/seed_allreduce_numpy.py
 or:  mpirun -np 2 python examples/seed_allreduce_numpy.py

Weights w = [1.0, -1.0], learning rate 0.1; worker 0's gradient is [0.6, -0.2] and
worker 1's is [0.2, 0.4]. Every rank prints:

    worker0_local_step [0.94, -0.98]
    allreduced_step [0.96, -1.01]
    gradient_mean [0.4, 0.1]
"""

import sys

import numpy as np

import hvdtrain.adapters.numpy as hvn

INITIAL_WEIGHTS = [1.0, -1.0]
GRADIENTS = {0: [0.6, -0.2], 1: [0.2, 0.4]}
LEARNING_RATE = 0.1


def shown(values: np.ndarray) -> list[float]:
    return [round(float(v), 6) for v in values]


def main() -> int:
    hvn.init()
    if hvn.size() != 2:
        print(f"this example needs exactly 2 workers (-np 2), got {hvn.size()}", file=sys.stderr)
        return 2
    gradient = np.array(GRADIENTS[hvn.rank()])

    local = np.array(INITIAL_WEIGHTS)
    local -= LEARNING_RATE * gradient  # this worker alone
    worker0_local = hvn.broadcast(local, root_rank=0)

    weights = np.array(INITIAL_WEIGHTS)
    hvn.DistributedSGD([weights], lr=LEARNING_RATE).step([gradient])

    print(f"worker0_local_step {shown(worker0_local)}")
    print(f"allreduced_step {shown(weights)}")
    print(f"gradient_mean {shown(hvn.allreduce_mean(gradient))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
