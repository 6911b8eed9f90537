"""Trains a float64 linear model for a few steps, one rank per host: ``python
across_hosts.py OUTDIR``.

Rank r takes rows [r*BATCH, (r+1)*BATCH) of each step's batch of SIZE*BATCH samples
(the same data on every host, made from a seed), SGD with momentum through
DistributedOptimizer. Each rank writes OUTDIR/rank-<r>.json: its host name, rank,
size and the final weights, which the test compares with one process on the
concatenated batches (tests/test_ssh_cluster.py). A file, not a printed line: mpirun
relays a remote rank's output in pieces and can lose the last ones at exit.
"""

import json
import os
import socket
import sys
from pathlib import Path

import numpy as np
import torch

import hvdtrain.adapters.torch as hvt

STEPS, BATCH, LR, MOMENTUM = 12, 8, 0.05, 0.9
SEED = 7


def data(size: int) -> tuple[np.ndarray, np.ndarray]:
    """Every step's whole batch: x (STEPS, size*BATCH, 4), y (STEPS, size*BATCH)."""
    rng = np.random.default_rng(SEED)
    x = rng.standard_normal((STEPS, size * BATCH, 4))
    y = x @ np.array([1.0, -2.0, 0.5, 3.0]) + 0.1 * rng.standard_normal((STEPS, size * BATCH))
    return x, y


def main() -> None:
    hvt.init()
    torch.set_num_threads(1)
    rank, size = hvt.rank(), hvt.size()
    x, y = data(size)
    torch.manual_seed(100 + rank)  # different until broadcast_state
    model = torch.nn.Linear(4, 1).double()
    optimizer = hvt.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM), model.named_parameters())
    hvt.broadcast_state(model, optimizer)
    start = [model.weight.detach().numpy().ravel().tolist(), model.bias.item()]
    rows = slice(rank * BATCH, (rank + 1) * BATCH)
    for step in range(STEPS):
        optimizer.zero_grad()
        prediction = model(torch.from_numpy(x[step, rows])).squeeze(1)
        torch.nn.functional.mse_loss(prediction, torch.from_numpy(y[step, rows])).backward()
        optimizer.step()
    result = {"rank": rank, "size": size, "host": socket.gethostname(), "pid": os.getpid(),
              "start": start, "weight": model.weight.detach().numpy().ravel().tolist(),
              "bias": model.bias.item()}
    (Path(sys.argv[1]) / f"rank-{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
