"""Step times of ``torch.nn.parallel.DistributedDataParallel`` (Gloo) under torchrun:
``torchrun --nproc-per-node 2 ddp_worker.py MODEL STEPS``.

The same model, batch, optimizer and thread count as step_worker.py; rank 0 prints
``RESULT {json}`` with the median step time.
"""

import json
import statistics
import sys
import time

import torch
import torch.distributed as dist
from models import BATCH_PER_WORKER, make_batch, make_model

WARMUP_STEPS = 5


def main() -> None:
    name, steps = sys.argv[1], int(sys.argv[2])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    model = torch.nn.parallel.DistributedDataParallel(make_model(name))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = make_batch(name, dist.get_rank())
    times = []
    for step in range(WARMUP_STEPS + steps):
        started = time.perf_counter()
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        if step >= WARMUP_STEPS:
            times.append(time.perf_counter() - started)
    median_step = statistics.median(times)
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps({
            "models": {name: {"median_step_s": median_step,
                              "samples_per_s": BATCH_PER_WORKER[name] * dist.get_world_size()
                              / median_step}}}), flush=True)
    # Both ranks leave the last collective before teardown: without this, a rank that
    # tears down while its peer is still closing Gloo's connections can abort
    # ("terminate called without an active exception"), seen once in CI.
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
