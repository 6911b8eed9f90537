"""Step times of hvdtrain's PyTorch optimizer on every rank of a horovodrun job (or one
process without a launcher): ``python step_worker.py MODEL[,MODEL...] STEPS``.

For each model (benchmarks/models.py), after 5 warm-up steps, times STEPS steps and
the part of each spent waiting for the gradient allreduce (inside ``synchronize()``,
after backward has queued every gradient). Rank 0 prints ``RESULT {json}``: per model,
the median step time, the median wait, samples per second over all workers, and the
model's size.
"""

import json
import statistics
import sys
import time

import torch
from models import BATCH_PER_WORKER, make_batch, make_model, parameter_count

import hvdtrain.adapters.torch as hvt

WARMUP_STEPS = 5


def measure(name: str, steps: int) -> dict:
    model = make_model(name)
    optimizer = hvt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01,
                                                         momentum=0.9),
                                         model.named_parameters())
    x, y = make_batch(name, hvt.rank())
    step_s, wait_s = [], []
    for step in range(WARMUP_STEPS + steps):
        started = time.perf_counter()
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        waiting = time.perf_counter()
        optimizer.synchronize()
        waited = time.perf_counter() - waiting
        optimizer.step()
        if step >= WARMUP_STEPS:
            step_s.append(time.perf_counter() - started)
            wait_s.append(waited)
    median_step = statistics.median(step_s)
    parameters, tensors = parameter_count(model)
    return {"median_step_s": median_step, "median_wait_s": statistics.median(wait_s),
            "samples_per_s": BATCH_PER_WORKER[name] * hvt.size() / median_step,
            "batch_per_worker": BATCH_PER_WORKER[name], "parameters": parameters,
            "parameter_tensors": tensors, "steps": steps}


def main() -> None:
    names, steps = sys.argv[1].split(","), int(sys.argv[2])
    torch.set_num_threads(1)
    hvt.init()
    results = {name: measure(name, steps) for name in names}
    if hvt.rank() == 0:
        print("RESULT " + json.dumps({"workers": hvt.size(), "models": results}), flush=True)


if __name__ == "__main__":
    main()
