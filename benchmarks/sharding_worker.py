"""Step time and memory of hvdtrain's PyTorch optimizer with AdamW, its state whole or
sharded: ``python sharding_worker.py MODEL[,MODEL...] STEPS flat|zero1|zero2``.

For each model (benchmarks/models.py), after 3 warm-up steps, times STEPS steps (one
number, or one per model: ``mlp=200,convdense=40,large=10``) of
``DistributedOptimizer(AdamW)``: ``flat`` the whole state (one flat allreduce),
``zero1`` with ``shard_state=True``, ``zero2`` with ``shard_gradients=True``; and counts
the bytes of the optimizer state this rank holds. Rank 0 prints ``RESULT {json}``: per
model the median step time and the state bytes (the largest over the ranks), and the
launch's peak resident memory (the largest over the ranks; one launch per contender,
so it is that contender's).
A sharded launch also times, ranks otherwise idle, the collectives on a buffer as large
as the last model's parameters: Horovod's allreduce (what the flat and zero1 paths send
for the gradients), its reduce-scatter (what zero2 sends), and the in-place broadcast of
each rank's slice and the all-gather of one slice (how the sharded paths share the
stepped parameters: the all-gather up to 32 MiB, the broadcasts above).
"""

import json
import resource
import statistics
import sys
import time

import torch
from models import make_batch, make_model, optimizer_state_bytes, parameter_count, timed_steps

import hvdtrain.adapters.torch as hvt

WARMUP_STEPS = 3
MODES = {"flat": {}, "zero1": {"shard_state": True}, "zero2": {"shard_gradients": True}}


def measure(name: str, steps: int, sharding: dict) -> dict:
    model = make_model(name)
    optimizer = hvt.DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-4),
                                         model.named_parameters(), **sharding)
    x, y = make_batch(name, hvt.rank())
    times = []
    for step in range(WARMUP_STEPS + steps):
        started = time.perf_counter()
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        if step >= WARMUP_STEPS:
            times.append(time.perf_counter() - started)
    held = max(hvt.allgather_object(optimizer_state_bytes(optimizer)))
    parameters, _ = parameter_count(model)
    return {"median_step_s": statistics.median(times), "state_bytes": held,
            "parameters": parameters}


def collectives_alone(numel: int, repeats: int = 3) -> dict:
    """Median seconds of one allreduce, in-place broadcast of every rank's slice,
    reduce-scatter and all-gather (of a slice) of a float32 buffer of ``numel`` elements
    (rounded up to an even split)."""
    numel += -numel % hvt.size()
    buffer = torch.zeros(numel)
    length = numel // hvt.size()
    part = buffer[:length].clone()

    def broadcast_slices() -> None:
        handles = [hvt.broadcast_async_(buffer[r * length:(r + 1) * length], root_rank=r,
                                        name=f"alone.broadcast.{r}") for r in range(hvt.size())]
        for handle in handles:
            hvt.synchronize(handle)

    operations = {"allreduce_s": lambda: hvt.allreduce_(buffer, name="alone.allreduce"),
                  "broadcast_slices_s": broadcast_slices,
                  "reducescatter_s": lambda: hvt.reducescatter(buffer, name="alone.rs"),
                  "allgather_s": lambda: hvt.allgather(part, name="alone.allgather")}
    timed = {}
    for key, operation in operations.items():
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            operation()
            times.append(time.perf_counter() - started)
        timed[key] = statistics.median(times)
    return {"elements": numel, **timed}


def main() -> None:
    names, steps, mode = sys.argv[1].split(","), sys.argv[2], sys.argv[3]
    if mode not in MODES:
        raise SystemExit(f"unknown mode {mode!r}; choose from {', '.join(MODES)}")
    torch.set_num_threads(1)
    hvt.init()
    results = {name: measure(name, timed_steps(steps, name), MODES[mode]) for name in names}
    peak = max(hvt.allgather_object(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024))
    alone = collectives_alone(results[names[-1]]["parameters"]) if MODES[mode] else None
    if hvt.rank() == 0:
        print("RESULT " + json.dumps({"models": results, "peak_rss_bytes": peak,
                                      "collectives_alone": alone}), flush=True)


if __name__ == "__main__":
    main()
