"""Rank 0 joins an allreduce that rank 1 never joins: a hang the launcher must kill."""

import time

import horovod.torch as hvd
import torch

hvd.init()
print(f"rank {hvd.rank()} started", flush=True)
if hvd.rank() == 0:
    hvd.allreduce(torch.ones(1), name="only_rank_0")
else:
    time.sleep(3600)
