"""Runs on every rank: allreduce, broadcast and allgather with horovod.torch.

Prints one ``REPORT {json}`` line with what this rank got, for the test to compare
with the values it computes itself.
"""

import json

import horovod.torch as hvd
import torch

hvd.init()
rank, size = hvd.rank(), hvd.size()
mine = torch.arange(6, dtype=torch.float64) * (rank + 1) + rank
report = {
    "rank": rank,
    "size": size,
    "sent": mine.tolist(),
    "average": hvd.allreduce(mine, name="average").tolist(),
    "sum": hvd.allreduce(mine, op=hvd.Sum, name="sum").tolist(),
    "broadcast": hvd.broadcast(mine, root_rank=0, name="broadcast").tolist(),
    "allgather": hvd.allgather(mine.view(1, -1), name="allgather").tolist(),
}
print("REPORT " + json.dumps(report))
hvd.shutdown()
