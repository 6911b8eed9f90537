"""Step times of hvdtrain's PyTorch optimizer on every rank of a horovodrun job (or one
process without a launcher), and where each step's time goes:
``python step_worker.py MODEL[,MODEL...] STEPS [auto|overlap|grouped]``.

For each model (benchmarks/models.py), after 5 warm-up steps, times STEPS steps of SGD
with momentum. The optional third argument is DistributedOptimizer's ``overlap``
(auto: hvdtrain's default; overlap: allreduces started during backward, Horovod's
way; grouped: one grouped allreduce after backward). Rank 0 prints ``RESULT {json}``:
per model, the median step time and samples per second over all workers, and the
median per step of: forward and backward (wall), waiting in ``synchronize()`` for
the allreduce (wall), the optimizer update (wall), this rank's main thread's CPU time
and the CPU time of its other threads (Horovod's background thread, MPI/Gloo), which
on a machine with a core per rank is taken from the main thread.
"""

import json
import statistics
import sys
import time

import torch
from models import BATCH_PER_WORKER, make_batch, make_model, parameter_count

import hvdtrain.adapters.torch as hvt

WARMUP_STEPS = 5
OVERLAP = {"auto": None, "overlap": True, "grouped": False}


def measure(name: str, steps: int, overlap: bool | None) -> dict:
    model = make_model(name)
    optimizer = hvt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01,
                                                         momentum=0.9),
                                         model.named_parameters(), overlap=overlap)
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
    return {**medians,
            "samples_per_s": BATCH_PER_WORKER[name] * hvt.size() / medians["median_step_s"],
            "batch_per_worker": BATCH_PER_WORKER[name], "parameters": parameters,
            "parameter_tensors": tensors, "steps": steps, "overlap": optimizer.overlap}


def main() -> None:
    names, steps = sys.argv[1].split(","), int(sys.argv[2])
    overlap = OVERLAP[sys.argv[3] if len(sys.argv) > 3 else "auto"]
    torch.set_num_threads(1)
    hvt.init()
    results = {name: measure(name, steps, overlap) for name in names}
    if hvt.rank() == 0:
        print("RESULT " + json.dumps({"workers": hvt.size(), "models": results}), flush=True)


if __name__ == "__main__":
    main()
