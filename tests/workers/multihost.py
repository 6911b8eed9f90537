"""Trains until stopped, one rank per simulated host: ``python multihost.py``.

Prints ``REPORT {json}`` once at start (pid, the mean of the ranks' numbers as an
allreduce across the hosts computes it) and a progress line every 10 steps, so that
the test knows when training is under way before it cuts the link.
"""

import json
import os
import time

import torch

import hvdtrain.adapters.torch as hvt

hvt.init()
mean_rank = hvt.allreduce(torch.tensor(float(hvt.rank()), dtype=torch.float64)).item()
print("REPORT " + json.dumps({"rank": hvt.rank(), "size": hvt.size(), "pid": os.getpid(),
                              "mean_rank": mean_rank}), flush=True)
torch.manual_seed(hvt.rank())
model = torch.nn.Linear(8, 1)
optimizer = hvt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                     model.named_parameters())
hvt.broadcast_state(model, optimizer)
x, y = torch.randn(16, 8), torch.randn(16, 1)
step = 0
while True:
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()
    step += 1
    if step % 10 == 0:
        print(f"PROGRESS rank {hvt.rank()} step {step}", flush=True)
    time.sleep(0.02)
