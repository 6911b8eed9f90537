"""4 MPI ranks as 2 independent data-parallel groups of 2: ``python groups.py FRAMEWORK``.

Ranks 0-1 form group 0 and ranks 2-3 group 1 (MPI.COMM_WORLD.Split). Each group
initialises hvdtrain's FRAMEWORK adapter (torch, keras or numpy) with its own
communicator and trains a model on data that depends on the group. Prints one
``REPORT {json}`` line: world rank, group, rank and size within the group, and a
checksum of the trained weights.
"""

import json
import sys

import numpy as np
from mpi4py import MPI

from hvdtrain.replicas import checksums

FRAMEWORK = sys.argv[1]
WORLD_RANK = MPI.COMM_WORLD.Get_rank()
GROUP = WORLD_RANK // 2
COMM = MPI.COMM_WORLD.Split(color=GROUP, key=WORLD_RANK)
RNG = np.random.RandomState(100 + GROUP)  # the group's data; its ranks share it
X, Y = RNG.randn(32, 4), RNG.randn(32, 1)


def my_rows(rank: int) -> slice:
    return slice(rank * 16, (rank + 1) * 16)


def train_torch() -> tuple[int, int, list[np.ndarray]]:
    import torch

    import hvdtrain.adapters.torch as hvt

    hvt.init(comm=COMM)
    torch.manual_seed(WORLD_RANK)  # differs per rank until broadcast_state
    model = torch.nn.Linear(4, 1).double()
    optimizer = hvt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         model.named_parameters())
    hvt.broadcast_state(model, optimizer)
    x, y = torch.from_numpy(X[my_rows(hvt.rank())]), torch.from_numpy(Y[my_rows(hvt.rank())])
    for _ in range(5):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    return hvt.rank(), hvt.size(), [p.detach().numpy() for p in model.parameters()]


def train_keras() -> tuple[int, int, list[np.ndarray]]:
    import keras

    import hvdtrain.adapters.keras as hvk

    hvk.init(comm=COMM)
    keras.config.set_floatx("float64")
    keras.utils.set_random_seed(WORLD_RANK)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer=hvk.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse",
                  jit_compile=False)
    rows = my_rows(hvk.rank())
    model.fit(X[rows], Y[rows], batch_size=16, epochs=5, verbose=0, shuffle=False,
              callbacks=[hvk.BroadcastInitialState(), hvk.ReplicaCheck()])
    return hvk.rank(), hvk.size(), model.get_weights()


def train_numpy() -> tuple[int, int, list[np.ndarray]]:
    import hvdtrain.adapters.numpy as hvn

    hvn.init(comm=COMM)
    weights = [np.random.RandomState(WORLD_RANK).randn(4, 1), np.zeros(1)]
    hvn.broadcast_in_place(weights)
    optimizer = hvn.DistributedSGD(weights, lr=0.1)
    x, y = X[my_rows(hvn.rank())], Y[my_rows(hvn.rank())]
    for _ in range(5):
        error = (x @ weights[0] + weights[1] - y) * 2 / len(y)
        optimizer.step([x.T @ error, error.sum(axis=0)])
    return hvn.rank(), hvn.size(), weights


rank, size, weights = {"torch": train_torch, "keras": train_keras, "numpy": train_numpy}[
    FRAMEWORK]()
print("REPORT " + json.dumps({
    "world_rank": WORLD_RANK, "group": GROUP, "rank": rank, "size": size,
    "weights": str(checksums((str(i), w) for i, w in enumerate(weights))),
}), flush=True)
