"""Step times of hvdtrain's PyTorch optimizer on every rank of a horovodrun job (or one
process without a launcher), and where each step's time goes:
``python step_worker.py MODEL[,MODEL...] STEPS [auto|overlap|grouped|buckets]
[none|fp16|bf16]``.

For each model (benchmarks/models.py), after 5 warm-up steps, times STEPS steps of SGD
with momentum. The optional third argument is how the allreduces are issued (auto:
hvdtrain's default; overlap: one per tensor, started during backward, Horovod's way;
grouped: one grouped allreduce after backward; buckets: two groups started during
backward, DDP's way: the parameters backward reaches first, up to half the gradient
bytes, then the rest). The optional fourth is the optimizer's ``compression`` (none:
the gradients' own dtype). With more than one worker, the allreduce of one buffer as large
as all the gradients is also timed on its own, the ranks otherwise idle (what the step
would add with no overlap). Rank 0 prints ``RESULT {json}``:
per model, the median step time and samples per second over all workers, and the
median per step of: forward and backward (wall), waiting in ``synchronize()`` for
the allreduce (wall), the optimizer update (wall), this rank's main thread's CPU time
and the CPU time of its other threads (Horovod's background thread, MPI/Gloo), which
on a machine with a core per rank is taken from the main thread.
"""

import itertools
import json
import statistics
import sys
import time

import torch
from models import BATCH_PER_WORKER, make_batch, make_model, parameter_count

import hvdtrain.adapters.torch as hvt

WARMUP_STEPS = 5
OVERLAP = {"auto": None, "overlap": True, "grouped": False, "buckets": True}
ALONE_REPEATS = 20
COMPRESSIONS = {"none": None, "fp16": "fp16", "bf16": "bf16"}


def two_buckets(model: torch.nn.Module) -> list[list[torch.Tensor]]:
    """The parameters in two groups in backward order (the last layers' first), the first
    holding up to half the gradient bytes."""
    backward_order = list(model.parameters())[::-1]
    running = list(itertools.accumulate(p.numel() for p in backward_order))
    split = next(i for i, total in enumerate(running, start=1) if total >= running[-1] / 2)
    split = min(split, len(backward_order) - 1)
    return [backward_order[:split], backward_order[split:]]


def allreduce_alone_s(numel: int) -> float:
    """Median time of one averaging allreduce of ``numel`` float32s, nothing else running."""
    buffer = torch.zeros(numel)
    times = []
    for repeat in range(ALONE_REPEATS + 2):
        started = time.perf_counter()
        hvt.allreduce_(buffer, name="step_worker.alone")
        if repeat >= 2:
            times.append(time.perf_counter() - started)
    return statistics.median(times)


def measure(name: str, steps: int, mode: str, compression: str | None = None) -> dict:
    model = make_model(name)
    optimizer = hvt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01,
                                                         momentum=0.9),
                                         model.named_parameters(), overlap=OVERLAP[mode],
                                         compression=compression,
                                         groups=two_buckets(model) if mode == "buckets"
                                         else None)
    x, y = make_batch(name, hvt.rank())
    columns = {key: [] for key in ("step_s", "compute_s", "wait_s", "update_s",
                                   "main_cpu_s", "other_cpu_s")}
    for step in range(WARMUP_STEPS + steps):
        started, cpu, main_cpu = time.perf_counter(), time.process_time(), time.thread_time()
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        computed = time.perf_counter()
        optimizer.synchronize()
        synchronized = time.perf_counter()
        with optimizer.skip_synchronize():
            optimizer.step()
        ended = time.perf_counter()
        main = time.thread_time() - main_cpu
        if step >= WARMUP_STEPS:
            for key, value in (("step_s", ended - started), ("compute_s", computed - started),
                               ("wait_s", synchronized - computed),
                               ("update_s", ended - synchronized), ("main_cpu_s", main),
                               ("other_cpu_s", time.process_time() - cpu - main)):
                columns[key].append(value)
    medians = {f"median_{key}": statistics.median(values) for key, values in columns.items()}
    parameters, tensors = parameter_count(model)
    if hvt.size() > 1:
        medians["median_allreduce_alone_s"] = allreduce_alone_s(parameters)
    return {**medians,
            "samples_per_s": BATCH_PER_WORKER[name] * hvt.size() / medians["median_step_s"],
            "batch_per_worker": BATCH_PER_WORKER[name], "parameters": parameters,
            "parameter_tensors": tensors, "steps": steps, "overlap": optimizer.overlap}


def main() -> None:
    names, steps = sys.argv[1].split(","), int(sys.argv[2])
    mode = sys.argv[3] if len(sys.argv) > 3 else "auto"
    if mode not in OVERLAP:
        raise SystemExit(f"unknown mode {mode!r}; choose from {', '.join(OVERLAP)}")
    wire = sys.argv[4] if len(sys.argv) > 4 else "none"
    if wire not in COMPRESSIONS:
        raise SystemExit(f"unknown compression {wire!r}; choose from {', '.join(COMPRESSIONS)}")
    torch.set_num_threads(1)
    hvt.init()
    results = {name: measure(name, steps, mode, COMPRESSIONS[wire]) for name in names}
    if hvt.rank() == 0:
        print("RESULT " + json.dumps({"workers": hvt.size(), "models": results}), flush=True)


if __name__ == "__main__":
    main()
