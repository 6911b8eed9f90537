"""Runs on every rank: step time of hvdtrain's DistributedOptimizer against raw Horovod's.

``python overhead_worker.py ROUNDS STEPS OUT.json``. Three copies of the same MLP,
wrapped by ``horovod.torch.DistributedOptimizer``, by
``hvdtrain.adapters.torch.DistributedOptimizer`` (default: with the non-finite check)
and by the latter with ``check_nonfinite=False``, train in rotation (A B C, B C A, ...)
for ROUNDS rounds of STEPS timed steps each, one compute thread per rank. Rank 0
writes each round's median step time per contender to OUT.json.
"""

import json
import statistics
import sys
import time

import horovod.torch as hvd
import torch

import hvdtrain.adapters.torch as hvt

ROUNDS, STEPS, OUT = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
BATCH, WIDTH, WARMUP_STEPS = 64, 512, 3


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(784, WIDTH), torch.nn.ReLU(), torch.nn.Linear(WIDTH, WIDTH),
        torch.nn.ReLU(), torch.nn.Linear(WIDTH, 10),
    )


def contender(wrap):
    model = make_model()
    optimizer = wrap(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                     model.named_parameters())
    return model, optimizer


def step_times(model, optimizer, x, y, steps: int) -> list[float]:
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        times.append(time.perf_counter() - started)
    return times


def main() -> None:
    torch.set_num_threads(1)
    hvt.init()
    generator = torch.Generator().manual_seed(hvt.rank())
    x = torch.randn(BATCH, 784, generator=generator)
    y = torch.randint(0, 10, (BATCH,), generator=generator)
    contenders = {
        "horovod": contender(lambda o, n: hvd.DistributedOptimizer(o, named_parameters=n)),
        "hvdtrain": contender(lambda o, n: hvt.DistributedOptimizer(o, n)),
        "hvdtrain_unchecked": contender(
            lambda o, n: hvt.DistributedOptimizer(o, n, check_nonfinite=False)),
    }
    names = list(contenders)
    medians = {name: [] for name in contenders}
    for round_number in range(ROUNDS):
        shift = round_number % len(names)  # A B C, B C A, C A B: none always goes first
        for name in names[shift:] + names[:shift]:
            model, optimizer = contenders[name]
            step_times(model, optimizer, x, y, WARMUP_STEPS)
            medians[name].append(statistics.median(step_times(model, optimizer, x, y, STEPS)))
    if hvt.rank() == 0:
        with open(OUT, "w") as file:
            json.dump({"round_medians_s": medians, "batch_per_worker": BATCH,
                       "model": f"MLP 784-{WIDTH}-{WIDTH}-10", "steps_per_round": STEPS,
                       "workers": hvt.size()}, file)


if __name__ == "__main__":
    main()
