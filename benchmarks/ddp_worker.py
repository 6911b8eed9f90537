"""Step times of ``torch.nn.parallel.DistributedDataParallel`` (Gloo) under torchrun:
``torchrun --nproc-per-node 2 ddp_worker.py MODEL[,MODEL...] STEPS [sgd|adamw|zero]``.

The same models, batches, optimizer and thread count as step_worker.py (SGD with
momentum; ``adamw`` and ``zero``, torch's ``ZeroRedundancyOptimizer`` over AdamW, are
sharding_worker.py's peers). STEPS is one number for every model or one per model
(``mlp=200,large=10``). Rank 0 prints ``RESULT {json}`` with, per model, the median
step time, the median CPU time per step of the main thread and of the other threads
(DDP's communication) and the bytes of optimizer state a rank holds (the largest), and
the launch's peak resident memory (the largest over the ranks).
"""

import json
import resource
import statistics
import sys
import time

import torch
import torch.distributed as dist
from models import (
    BATCH_PER_WORKER,
    make_batch,
    make_model,
    optimizer_state_bytes,
    timed_steps,
)
from torch.distributed.optim import ZeroRedundancyOptimizer

from hvdtrain.allocator import keep_freed_memory

WARMUP_STEPS = 5


def make_optimizer(kind: str, parameters) -> torch.optim.Optimizer:
    if kind == "sgd":
        return torch.optim.SGD(parameters, lr=0.01, momentum=0.9)
    if kind == "adamw":
        return torch.optim.AdamW(parameters, lr=1e-4)
    if kind == "zero":
        return ZeroRedundancyOptimizer(parameters, optimizer_class=torch.optim.AdamW, lr=1e-4)
    raise SystemExit(f"unknown optimizer {kind!r}; choose from sgd, adamw, zero")


def measure(name: str, steps: int, kind: str) -> dict:
    model = torch.nn.parallel.DistributedDataParallel(make_model(name))
    optimizer = make_optimizer(kind, model.parameters())
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
    held: list[int | None] = [None] * dist.get_world_size()
    dist.all_gather_object(held, optimizer_state_bytes(optimizer))
    return {"median_step_s": median_step, "state_bytes": max(held),
            "samples_per_s": BATCH_PER_WORKER[name] * dist.get_world_size() / median_step,
            "median_main_cpu_s": statistics.median(main_cpu),
            "median_other_cpu_s": statistics.median(other_cpu)}


def main() -> None:
    names, steps = sys.argv[1].split(","), sys.argv[2]
    kind = sys.argv[3] if len(sys.argv) > 3 else "sgd"
    torch.set_num_threads(1)
    # hvdtrain's init() does this for its contenders: the same allocator on both sides,
    # so the comparison measures the distributed training and not malloc.
    keep_freed_memory()
    dist.init_process_group("gloo")
    results = {name: measure(name, timed_steps(steps, name), kind) for name in names}
    peaks: list[int | None] = [None] * dist.get_world_size()
    dist.all_gather_object(peaks, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps({"models": results, "peak_rss_bytes": max(peaks)}),
              flush=True)
    # Both ranks leave the last collective before teardown: without this, a rank that
    # tears down while its peer is still closing Gloo's connections can abort
    # ("terminate called without an active exception"), seen once in CI.
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
