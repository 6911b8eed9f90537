"""Step times of ``torch.nn.parallel.DistributedDataParallel`` (Gloo) under torchrun:
``torchrun --nproc-per-node 2 ddp_worker.py MODEL[,MODEL...] STEPS``.

The same models, batches, optimizer and thread count as step_worker.py; rank 0 prints
``RESULT {json}`` with, per model, the median step time and the median CPU time per
step of the main thread and of the other threads (DDP's communication).
"""

import json
import statistics
import sys
import time

import torch
import torch.distributed as dist
from models import BATCH_PER_WORKER, make_batch, make_model

from hvdtrain.allocator import keep_freed_memory

WARMUP_STEPS = 5


def measure(name: str, steps: int) -> dict:
    model = torch.nn.parallel.DistributedDataParallel(make_model(name))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = make_batch(name, dist.get_rank())
    times, main_cpu, other_cpu = [], [], []
    for step in range(WARMUP_STEPS + steps):
        started, cpu, main = time.perf_counter(), time.process_time(), time.thread_time()
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        if step >= WARMUP_STEPS:
            times.append(time.perf_counter() - started)
            main_cpu.append(time.thread_time() - main)
            other_cpu.append(time.process_time() - cpu - main_cpu[-1])
    median_step = statistics.median(times)
    return {"median_step_s": median_step,
            "samples_per_s": BATCH_PER_WORKER[name] * dist.get_world_size() / median_step,
            "median_main_cpu_s": statistics.median(main_cpu),
            "median_other_cpu_s": statistics.median(other_cpu)}


def main() -> None:
    names, steps = sys.argv[1].split(","), int(sys.argv[2])
    torch.set_num_threads(1)
    # hvdtrain's init() does this for its contenders: the same allocator on both sides,
    # so the comparison measures the distributed training and not malloc.
    keep_freed_memory()
    dist.init_process_group("gloo")
    results = {name: measure(name, steps) for name in names}
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps({"models": results}), flush=True)
    # Both ranks leave the last collective before teardown: without this, a rank that
    # tears down while its peer is still closing Gloo's connections can abort
    # ("terminate called without an active exception"), seen once in CI.
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
