"""Step time of hvdtrain's PyTorch DistributedOptimizer against raw Horovod's, on every
rank: ``python overhead_worker.py ROUNDS STEPS [MODEL]``.

Nine copies of MODEL (models.py; default the MLP), wrapped by
``horovod.torch.DistributedOptimizer``, by
``hvdtrain.adapters.torch.DistributedOptimizer`` (default: with the non-finite check,
its bound summed while the gradients are copied), by the latter with
``check_nonfinite=False``, with ``overlap=True`` (Horovod's per-tensor allreduces during
the backward pass instead of one after it), by the latter taking the bound with a
``dot`` after the copy (before the fused packing), by the latter checking the old way
(reading every averaged gradient instead of the bound carried in the allreduce), and
with ``skip_nonfinite=True`` both ways (the old way also votes with one more
collective), and the default again with its steps not timed
(:func:`hvdtrain.step_timing.paused`), train in rotation (A B C ..., B C ... A, ...) for
ROUNDS rounds of STEPS timed steps each, one compute thread per rank, all under
hvdtrain's runtime defaults (``hvt.init()`` applies them to the process). The non-finite
checks are also timed on their own (wall time of their parts per step), since the
difference of two noisy step times is a poor measure of 0.1 ms: a check with a bound is
what packing the gradients with it takes beyond packing them without it (the unchecked
contender's), plus the look at the reduced bound. Rank 0 prints ``RESULT {json}`` with
each round's median step time per contender, the median time of one check each way, and
the step timing's time per step between its exchanges (``timing_s``, a ``StepTimer``'s
two calls).
"""

import contextlib
import functools
import json
import statistics
import sys
import time

import horovod.torch as hvd
import torch
from common import rotated
from models import BATCH_PER_WORKER, make_batch, make_model

import hvdtrain.adapters.torch as hvt
from hvdtrain import step_timing
from hvdtrain.adapters.torch.tally import flat_with_tally

WARMUP_STEPS = 3


def contender(name: str, wrap):
    model = make_model(name)
    optimizer = wrap(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                     model.named_parameters())
    return model, optimizer


def time_the_check(optimizer, parts: dict[str, str]) -> dict[str, list[float]]:
    """Make ``optimizer`` record the wall time of each part of its non-finite check:
    ``parts`` maps a part's name to the optimizer method that does it."""
    times = {part: [] for part in parts}

    def timed(method, part):
        def call(*args, **kwargs):
            started = time.perf_counter()
            result = method(*args, **kwargs)
            times[part].append(time.perf_counter() - started)
            return result
        return call

    for part, method in parts.items():
        setattr(optimizer, method, timed(getattr(optimizer, method), part))
    return times


def median_total(times: dict[str, list[float]]) -> float:
    """The median time of one check: the sum of its parts' medians."""
    return sum(statistics.median(part) for part in times.values())


def without_the_bound(optimizer):
    """``optimizer`` checking gradients the way hvdtrain did before the bound carried in
    the allreduce: by reading every averaged gradient (its fallback path)."""
    optimizer._flat_with_tally = functools.partial(flat_with_tally, bound=False)
    return optimizer


def with_a_dot_bound(optimizer):
    """``optimizer`` taking the bound the way hvdtrain did before the fused packing:
    torch's ``cat``, then a ``dot`` over the copy."""
    optimizer._flat_with_tally = functools.partial(flat_with_tally, bound=True, fused=False)
    return optimizer


def timing_seconds(calls: int = 20_000) -> float:
    """What the step timing adds to a step on this rank, between exchanges: a
    ``StepTimer``'s two calls (the exchange, one small allreduce per window, is not in it)."""
    timer = step_timing.StepTimer(
        _Alone(), lambda numbers, name: numbers,
        step_timing.TimingSettings(window_s=1e9, lines=False, metrics_path=None))
    for _ in range(step_timing.SETTLING_STEPS + 1):  # past the first exchange
        timer.reduction_started(0)
        timer.reduction_finished(0)
    started = time.perf_counter()
    for _ in range(calls):
        timer.reduction_started(0)
        timer.reduction_finished(0)
    return (time.perf_counter() - started) / calls


class _Alone:
    """One worker, for :func:`timing_seconds`'s timer."""

    def rank(self) -> int:
        return 0

    def size(self) -> int:
        return 1


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
    rounds, steps = int(sys.argv[1]), int(sys.argv[2])
    name = sys.argv[3] if len(sys.argv) > 3 else "mlp"
    torch.set_num_threads(1)
    hvt.init()
    x, y = make_batch(name, hvt.rank())
    wrappers = {
        "horovod": lambda o, n: hvd.DistributedOptimizer(o, named_parameters=n),
        "hvdtrain": lambda o, n: hvt.DistributedOptimizer(o, n),
        "hvdtrain_unchecked": lambda o, n: hvt.DistributedOptimizer(o, n, check_nonfinite=False),
        "hvdtrain_overlap": lambda o, n: hvt.DistributedOptimizer(o, n, overlap=True),
        "hvdtrain_read_check": lambda o, n: without_the_bound(hvt.DistributedOptimizer(o, n)),
        "hvdtrain_dot_check": lambda o, n: with_a_dot_bound(hvt.DistributedOptimizer(o, n)),
        # skip_nonfinite=True: the bound makes the skip decision without a vote collective
        "hvdtrain_skip": lambda o, n: hvt.DistributedOptimizer(o, n, skip_nonfinite=True),
        "hvdtrain_skip_read_vote": lambda o, n: without_the_bound(
            hvt.DistributedOptimizer(o, n, skip_nonfinite=True)),
        # the default, its steps not timed (step_timing.paused() around them)
        "hvdtrain_untimed": lambda o, n: hvt.DistributedOptimizer(o, n),
    }
    contenders = {label: contender(name, wrap) for label, wrap in wrappers.items()}
    # The bound, taken while packing the gradients before the allreduce, and the look at
    # it after; the old way reads the averaged gradients after the allreduce.
    check_times = time_the_check(contenders["hvdtrain"][1], {
        "pack": "_flat_with_tally", "look": "_bound_proves_finite"})
    unchecked_pack_times = time_the_check(contenders["hvdtrain_unchecked"][1],
                                          {"pack": "_flat_with_tally"})
    dot_check_times = time_the_check(contenders["hvdtrain_dot_check"][1], {
        "pack": "_flat_with_tally", "look": "_bound_proves_finite"})
    read_check_times = time_the_check(contenders["hvdtrain_read_check"][1], {
        "read": "_first_nonfinite_gradient"})
    names = list(contenders)
    medians = {name: [] for name in contenders}
    for round_number in range(rounds):
        for contender_name in rotated(names, round_number):
            model, optimizer = contenders[contender_name]
            with (step_timing.paused() if contender_name == "hvdtrain_untimed"
                  else contextlib.nullcontext()):
                step_times(model, optimizer, x, y, WARMUP_STEPS)
                medians[contender_name].append(
                    statistics.median(step_times(model, optimizer, x, y, steps)))
    if hvt.rank() == 0:
        print("RESULT " + json.dumps({"round_medians_s": medians, "model": name,
                                      "batch_per_worker": BATCH_PER_WORKER[name],
                                      "check_s": median_total(check_times)
                                      - median_total(unchecked_pack_times),
                                      "dot_check_s": median_total(dot_check_times)
                                      - median_total(unchecked_pack_times),
                                      "read_check_s": median_total(read_check_times),
                                      "timing_s": timing_seconds(),
                                      "workers": hvt.size()}), flush=True)


if __name__ == "__main__":
    main()
