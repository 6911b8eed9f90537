"""A training loop on 2 ranks with one fault injected on rank 1: ``python faults.py MODE``.

MODE is one of: exception (rank 1 raises at step 3), sigkill (rank 1 is killed with
SIGKILL at step 3), skip (rank 1 skips one allreduce at step 3, the classic
rank-dependent code path), nonfinite (rank 1's loss is NaN at step 3).
Prints ``REPORT {json}`` with what happened on each rank that got to report it.
"""

import json
import os
import signal
import sys
import time

import torch

import hvdtrain.adapters.torch as hvt

MODE = sys.argv[1]


def report(**values) -> None:
    print("REPORT " + json.dumps({"rank": hvt.rank(), **values}), flush=True)


hvt.init()
report(event="started", pid=os.getpid(), stall_check=os.environ.get(
    "HOROVOD_STALL_CHECK_TIME_SECONDS"), stall_shutdown=os.environ.get(
    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"))
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
optimizer = hvt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                     model.named_parameters())
hvt.broadcast_state(model, optimizer)
x, y = torch.randn(16, 8), torch.randn(16, 1)
for step in range(20):
    faulty = hvt.rank() == 1 and step == 3
    if faulty and MODE == "exception":
        raise ValueError("injected failure on rank 1 at step 3")
    if faulty and MODE == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if faulty and MODE == "skip":
        time.sleep(600)  # never joins this step's allreduces
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    if faulty and MODE == "nonfinite":
        loss = loss * float("nan")
    loss.backward()
    try:
        optimizer.step()
    except hvt.NonFiniteGradientError as error:
        report(event="nonfinite", message=str(error))
        raise
report(event="finished")
