"""The checks of scripts/gpu-check.sh, run on each rank: ``python gpu_check_worker.py
MODE``. Rank 0 prints one ``gpu-check: PASS|FAIL NAME: detail`` line per check.

- ``correctness`` (horovodrun, 1 or 2 ranks): on CUDA float64 tensors, hvdtrain's
  DistributedOptimizer through the flat allreduce (its default) and through Horovod's
  per-tensor hooks started during backward (``overlap=True``) trains to the weights of
  one plain-PyTorch process on the concatenated batch, computed on the CPU
  (tests/workers/torch_common.py, the same reference the CPU tests use); a NaN in one
  rank's loss raises NonFiniteGradientError on every rank; with 2 ranks and uneven
  shares, ``join()`` divides by the ranks that sent gradients, as one process on the
  remaining batches would; bfloat16 (Horovod patch 0011: NCCL's ncclBfloat16 and the
  CUDA scaling kernels) allreduces a sum, an average, a pre- and post-scaled sum and a
  grouped (fused) average within (N - 1 + roundings) x 2**-8 of the exact sums.
  Without a GPU the same checks run on the CPU (the dry run
  of gpu-check.sh rehearses them so).
- ``speed`` (horovodrun or torchrun, 2 ranks on one GPU): the median step time of
  benchmarks/models.py's convdense model on CUDA with hvdtrain's optimizer (under
  horovodrun) or DistributedDataParallel (under torchrun, Gloo backend), printed as
  ``RESULT {json}``.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "workers"), str(ROOT / "benchmarks")]

from bfloat16 import bound_ratio  # noqa: E402
from torch_common import (  # noqa: E402
    JOIN_STEPS,
    STEPS,
    global_rows,
    loss_fn,
    make_data,
    make_model,
    make_optimizer,
    reference_run,
    rows,
    schedule,
    train_uneven_share,
    uneven_reference_run,
)

TOLERANCE = 1e-12
SPEED_STEPS, SPEED_WARMUP = 60, 10
# The checks run on the CPU where there is no GPU: the dry run proves them there.
DEVICE = (torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
          if torch.cuda.is_available() else torch.device("cpu"))


def verdict(name: str, passed: bool, detail: str) -> None:
    print(f"gpu-check: {'PASS' if passed else 'FAIL'} {name}: {detail}", flush=True)


def max_difference(model: torch.nn.Module, reference: dict[str, torch.Tensor]) -> float:
    return max(float((p.detach().cpu() - reference[name]).abs().max())
               for name, p in model.named_parameters())


def train_cuda(hvt, **wrapping) -> torch.nn.Module:
    """The reference's 20 SGD steps on this rank's rows, on the GPU, LR from the schedule."""
    x, y = make_data()
    x, y = x.to(DEVICE), y.to(DEVICE)
    model = make_model(seed=123 if hvt.rank() == 0 else 999).to(DEVICE)
    optimizer = hvt.DistributedOptimizer(make_optimizer("sgd", model.parameters()),
                                         model.named_parameters(), **wrapping)
    hvt.broadcast_state(model, optimizer)
    plan = schedule(1, base_lr=optimizer.param_groups[0]["lr"])
    for step in range(STEPS):
        for group in optimizer.param_groups:
            group["lr"] = plan.lr_at(step)
        optimizer.zero_grad()
        part = global_rows(step, 1) if hvt.size() == 1 else rows(step, 0, hvt.rank(), 1)
        loss_fn(model, x[part], y[part]).backward()
        optimizer.step()
    return model


def check_equivalence(hvt, label: str) -> None:
    reference = reference_run("sgd")
    for path, wrapping in (("flat allreduce", {"overlap": False}),
                           ("per-tensor hooks", {"overlap": True})):
        difference = max_difference(train_cuda(hvt, **wrapping), reference)
        if hvt.rank() == 0:
            verdict(f"{label} equivalence, {path}", difference <= TOLERANCE,
                    f"{hvt.size()} rank(s) on {DEVICE.type} float64 vs one process on the "
                    f"concatenated batch: max difference {difference:.1e} (limit {TOLERANCE:g})")


def start_on_device(hvt):
    """The data, the reference's initial model and its wrapped SGD, on DEVICE."""
    x, y = make_data()
    model = make_model().to(DEVICE)
    optimizer = hvt.DistributedOptimizer(make_optimizer("sgd", model.parameters()),
                                         model.named_parameters())
    return x.to(DEVICE), y.to(DEVICE), model, optimizer


def check_nonfinite(hvt, label: str) -> None:
    from hvdtrain.nonfinite import NonFiniteGradientError

    x, y, model, optimizer = start_on_device(hvt)
    raised = "nothing"
    for step in range(3):
        optimizer.zero_grad()
        loss = loss_fn(model, x[rows(step, 0, 0, 1)], y[rows(step, 0, 0, 1)])
        if step == 1 and hvt.rank() == hvt.size() - 1:
            loss = loss * float("nan")
        loss.backward()
        try:
            optimizer.step()
        except NonFiniteGradientError as error:
            raised = f"NonFiniteGradientError at step {step}: {str(error)[:90]}..."
            break
    flags = hvt.allgather_object(raised.startswith("NonFiniteGradientError at step 1"))
    if hvt.rank() == 0:
        verdict(f"{label} NaN check", all(flags),
                f"a NaN in rank {hvt.size() - 1}'s loss at step 1; every rank raised: "
                f"{flags}; rank 0: {raised}")


def check_join(hvt, label: str) -> None:
    x, y, model, optimizer = start_on_device(hvt)
    train_uneven_share(hvt.rank(), model, optimizer, x, y)
    last = hvt.join()
    hvt.broadcast_state(model, optimizer, root_rank=last)
    difference = max_difference(model, uneven_reference_run())
    if hvt.rank() == 0:
        verdict(f"{label} join", difference <= TOLERANCE,
                f"uneven shares {JOIN_STEPS} steps on {DEVICE.type}, join(): max difference "
                f"{difference:.1e} from one process on the remaining batches")


def check_bfloat16(hvt, label: str) -> None:
    """Horovod's bfloat16 allreduce on DEVICE against the exact (float64) sum of every
    rank's tensor, within patch 0011's bound: each of the N - 1 additions and each
    scaling rounds once, by at most 2**-8 of the magnitudes summed."""
    size = hvt.size()

    def tensor_of(rank: int, numel: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(31 * rank + numel)
        return torch.randn(numel, generator=generator, dtype=torch.float64)

    def ratio(result: torch.Tensor, numel: int, scale: float, roundings: int) -> float:
        every = [tensor_of(r, numel).to(torch.bfloat16) for r in range(size)]
        return bound_ratio(result.detach().cpu(), every, scale, roundings)

    def mine(numel: int) -> torch.Tensor:
        return tensor_of(hvt.rank(), numel).to(torch.bfloat16).to(DEVICE)

    worst = {
        "sum": ratio(hvt.allreduce(mine(1001), name="gpu.bf16.sum", op=hvt.Sum), 1001, 1.0,
                     size - 1),
        "average": ratio(hvt.allreduce(mine(1 << 20), name="gpu.bf16.avg", op=hvt.Average),
                         1 << 20, 1.0 / size, size),
        "scaled": ratio(hvt.allreduce(mine(4097), name="gpu.bf16.scaled", op=hvt.Sum,
                                      prescale_factor=0.5, postscale_factor=3.0), 4097, 1.5,
                        size + 1),
        "grouped": max(ratio(result, numel, 1.0 / size, size) for result, numel in zip(
            hvt.grouped_allreduce([mine(n) for n in (7, 300, 65_537)], name="gpu.bf16.group",
                                  op=hvt.Average), (7, 300, 65_537), strict=True)),
    }
    if hvt.rank() == 0:
        verdict(f"{label} bfloat16 allreduce", max(worst.values()) <= 1.0,
                "error / patch 0011's bound: " + ", ".join(
                    f"{case} {value:.2f}" for case, value in worst.items()) + " (at most 1)")


def correctness() -> None:
    import horovod.torch as hvd

    import hvdtrain.adapters.torch as hvt

    hvt.init()
    if DEVICE.type == "cuda":
        torch.cuda.set_device(DEVICE)
        transport = "NCCL" if hvd.nccl_built() else "host-staged Gloo"
    else:
        transport = "CPU, Gloo"
    label = f"{transport}, {hvt.size()} rank(s)"
    check_equivalence(hvt, label)
    check_nonfinite(hvt, label)
    check_bfloat16(hvt, label)
    if hvt.size() == 2:
        check_join(hvt, label)


def synchronize() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def step_times(model, optimizer, step) -> float:
    from models import make_batch

    x, y = (t.to(DEVICE) for t in make_batch("convdense", int(os.environ.get("RANK", 0))))
    times = []
    for index in range(SPEED_WARMUP + SPEED_STEPS):
        synchronize()
        started = time.perf_counter()
        step(model, optimizer, x, y)
        synchronize()
        if index >= SPEED_WARMUP:
            times.append(time.perf_counter() - started)
    return statistics.median(times)


def plain_step(model, optimizer, x, y) -> None:
    optimizer.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()


def speed() -> None:
    from models import make_model as make_benchmark_model

    model = make_benchmark_model("convdense").to(DEVICE)
    sgd = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if "TORCHELASTIC_RUN_ID" in os.environ:  # torchrun: DDP
        import torch.distributed as dist

        dist.init_process_group("gloo")
        os.environ["RANK"] = str(dist.get_rank())
        wrapped = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[DEVICE] if DEVICE.type == "cuda" else None)
        median = step_times(wrapped, sgd, plain_step)
        rank, contender = dist.get_rank(), "DDP (Gloo backend)"
        dist.destroy_process_group()
    else:
        import hvdtrain.adapters.torch as hvt

        hvt.init()
        os.environ["RANK"] = str(hvt.rank())
        optimizer = hvt.DistributedOptimizer(sgd, model.named_parameters())
        hvt.broadcast_state(model, optimizer)
        median = step_times(model, optimizer, plain_step)
        rank, contender = hvt.rank(), "hvdtrain"
    if rank == 0:
        print("RESULT " + json.dumps({"contender": contender, "step_s": median}), flush=True)


if __name__ == "__main__":
    {"correctness": correctness, "speed": speed}[sys.argv[1]]()
