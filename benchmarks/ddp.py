"""Benchmark 2: hvdtrain against PyTorch's DistributedDataParallel, the peer a PyTorch
user would pick instead, with a sweep of Horovod's fusion threshold and cycle time.

First a sweep: one launch of step_worker.py per (controller, fusion threshold, cycle
time). Then the comparison, interleaved over rounds: hvdtrain with Horovod's defaults
under Gloo and under MPI, hvdtrain with the sweep's fastest settings, and
``DistributedDataParallel`` (Gloo backend, launched by torchrun). Same model (the MLP),
batch, optimizer and one thread per rank. Target: hvdtrain's step time ≤ DDP's.
"""

from __future__ import annotations

import itertools
from pathlib import Path

from common import (
    bar_chart,
    horovod_result,
    interleaved,
    median,
    median_ratio,
    progress,
    torchrun_result,
    write_result,
)

from hvdtrain.launch import CONTROLLERS

MODEL = "mlp"
FUSION_MB = (4, 64)
CYCLE_MS = (0.5, 1, 5)


def _settings_env(fusion_mb: float, cycle_ms: float) -> dict[str, str]:
    return {"HOROVOD_FUSION_THRESHOLD": str(int(fusion_mb * 2**20)),
            "HOROVOD_CYCLE_TIME": str(cycle_ms)}


def _hvdtrain_step_s(steps: int, controller: str, env: dict[str, str] | None = None):
    def measure() -> float:
        result = horovod_result("step_worker.py", [MODEL, str(steps)], controller=controller,
                                env=env)
        return result["models"][MODEL]["median_step_s"]
    return measure


def _ddp_step_s(steps: int):
    def measure() -> float:
        return torchrun_result("ddp_worker.py", [MODEL, str(steps)])["models"][MODEL][
            "median_step_s"]
    return measure


def run(folder: Path, smoke: bool) -> dict:
    steps, rounds = (5, 1) if smoke else (200, 5)
    grid = list(itertools.product(CONTROLLERS, FUSION_MB, CYCLE_MS))
    if smoke:
        grid = grid[:1]
    sweep = []
    for number, (controller, fusion_mb, cycle_ms) in enumerate(grid, start=1):
        progress(f"ddp sweep {number}/{len(grid)}: {controller}, fusion {fusion_mb} MB, "
                 f"cycle {cycle_ms} ms")
        step_s = _hvdtrain_step_s(steps, controller, _settings_env(fusion_mb, cycle_ms))()
        sweep.append({"controller": controller, "fusion_mb": fusion_mb, "cycle_ms": cycle_ms,
                      "median_step_s": step_s})
    best = min(sweep, key=lambda entry: entry["median_step_s"])
    best_label = (f"hvdtrain {best['controller']} fusion {best['fusion_mb']} MB "
                  f"cycle {best['cycle_ms']} ms")
    contenders = {
        "hvdtrain gloo (Horovod defaults)": _hvdtrain_step_s(steps, "gloo"),
        "hvdtrain mpi (Horovod defaults)": _hvdtrain_step_s(steps, "mpi"),
        best_label: _hvdtrain_step_s(steps, best["controller"],
                                     _settings_env(best["fusion_mb"], best["cycle_ms"])),
        "DDP gloo (torchrun)": _ddp_step_s(steps),
    }
    if smoke:  # keep one hvdtrain contender and the peer
        contenders = {name: contenders[name] for name in (best_label, "DDP gloo (torchrun)")}
    measured = interleaved(contenders, rounds, "ddp comparison")
    ddp = measured["DDP gloo (torchrun)"]
    comparison = {name: {"median_step_s": median(values),
                         "median_ratio_to_ddp": median_ratio(values, ddp), "rounds_s": values}
                  for name, values in measured.items()}
    write_result(folder, "ddp", {"model": MODEL, "steps_per_launch": steps, "rounds": rounds,
                                 "threads_per_rank": 1, "workers": 2,
                                 "fusion_mb": FUSION_MB, "cycle_ms": CYCLE_MS},
                 {"sweep": sweep, "best": best, "comparison": comparison})
    bar_chart(folder / "ddp.png", "Step time, MLP 784-512-512-10, 2 ranks (median)",
              {name: entry["median_step_s"] * 1e3
               for name, entry in comparison.items()}, "ms per step")
    return {"comparison": comparison, "best": best, "best_label": best_label}


def targets(summary: dict) -> list[tuple[str, bool]]:
    ratios = {name: entry["median_ratio_to_ddp"]
              for name, entry in summary["comparison"].items() if name.startswith("hvdtrain")}
    fastest = min(ratios, key=ratios.get)
    return [(f"{fastest}: step time / DDP's = {ratios[fastest]:.3f} (target <= 1)",
             ratios[fastest] <= 1.0)]
