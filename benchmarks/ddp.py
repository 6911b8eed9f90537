"""Benchmark 2: hvdtrain against PyTorch's DistributedDataParallel, the peer a PyTorch
user would pick instead, on a communication-bound model (the MLP) and a compute-heavy
one (convdense), under both of Horovod's controllers, with the machine's ceiling.

Contenders, interleaved over rounds (one launch each, both models per launch):

- hvdtrain with its defaults under MPI and under Gloo;
- hvdtrain the way it ran before these defaults ("Horovod's way"): allreduces started
  during backward by Horovod's hooks, Horovod's background thread cycling every 1 ms
  even when idle (``HVDTRAIN_IDLE_WAIT_MS=0``), Open MPI busy-polling
  (``OMPI_MCA_mpi_yield_when_idle=0``), under MPI and under Gloo;
- ``DistributedDataParallel`` (Gloo backend, launched by torchrun);
- one process alone, and two independent processes at once (the machine's ceiling:
  two busy cores, nothing exchanged).

Same models, batch, optimizer (SGD with momentum) and one compute thread per rank.
Per model: median step time, the median of the round ratios to DDP, the efficiency
(one process's step time / the 2-rank step time, at the same per-worker batch) and
where a rank's step goes (step_worker.py). Target: hvdtrain / DDP ≤ 1.00 under MPI
(the default launch) and ≤ 1.05 under Gloo, on both models.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
from common import (
    concurrent_results,
    horovod_result,
    interleaved,
    markdown_table,
    median,
    median_ratio,
    ms,
    pyplot,
    torchrun_result,
    write_result,
)

MODELS = ("mlp", "convdense")
DDP = "DDP gloo (torchrun)"
ALONE, CEILING = "1 process", "2 independent processes"
HOROVODS_WAY = {"HVDTRAIN_IDLE_WAIT_MS": "0", "OMPI_MCA_mpi_yield_when_idle": "0"}
TARGETS = {"hvdtrain mpi": 1.00, "hvdtrain gloo": 1.05}


def _hvdtrain(steps: int, controller: str, overlap: str = "auto",
              env: dict[str, str] | None = None):
    return lambda: horovod_result("step_worker.py", [",".join(MODELS), str(steps), overlap],
                                  controller=controller, env=env)["models"]


def _ddp(steps: int):
    return lambda: torchrun_result("ddp_worker.py", [",".join(MODELS), str(steps)])["models"]


def _processes(steps: int, copies: int):
    def measure() -> dict:
        results = concurrent_results("step_worker.py", [",".join(MODELS), str(steps)], copies)
        # Each independent process is one worker: the slower one sets the pace.
        return {name: max((r["models"][name] for r in results),
                          key=lambda m: m["median_step_s"]) for name in MODELS}
    return measure


def run(folder: Path, smoke: bool) -> dict:
    # 5 rounds left convdense's Gloo ratio swinging 0.96-1.09 between runs on this VM.
    steps, rounds = (3, 1) if smoke else (100, 10)
    contenders = {
        "hvdtrain mpi": _hvdtrain(steps, "mpi"),
        "hvdtrain gloo": _hvdtrain(steps, "gloo"),
        "hvdtrain mpi, Horovod's way": _hvdtrain(steps, "mpi", "overlap", HOROVODS_WAY),
        "hvdtrain gloo, Horovod's way": _hvdtrain(steps, "gloo", "overlap", HOROVODS_WAY),
        DDP: _ddp(steps),
        ALONE: _processes(steps, 1),
        CEILING: _processes(steps, 2),
    }
    if smoke:
        contenders = {name: contenders[name] for name in ("hvdtrain mpi", DDP, ALONE)}
    measured = interleaved(contenders, rounds, "ddp comparison")
    models = {}
    for model in MODELS:
        steps_by = {name: [r[model]["median_step_s"] for r in runs]
                    for name, runs in measured.items()}
        models[model] = {name: {
            "median_step_s": median(values),
            "median_ratio_to_ddp": median_ratio(values, steps_by[DDP]),
            "efficiency": median_ratio(steps_by[ALONE], values),
            "breakdown_s": {key.removeprefix("median_"): median(
                [r[model][key] for r in measured[name]]) for key in measured[name][0][model]
                if key.startswith("median_") and key != "median_step_s"},
            "rounds_s": values,
        } for name, values in steps_by.items()}
    write_result(folder, "ddp", {"models": MODELS, "steps_per_launch": steps, "rounds": rounds,
                                 "threads_per_rank": 1, "workers": 2,
                                 "horovods_way_env": HOROVODS_WAY},
                 {"targets": TARGETS, "models": models})
    _plot(folder / "ddp.png", models)
    return {"models": models}


def _plot(path: Path, models: dict) -> None:
    """One panel per model: each contender's median step time, DDP's as a line."""
    plt = pyplot()
    figure, panels = plt.subplots(1, len(models), figsize=(6 * len(models), 5))
    for axes, (model, entries) in zip(np.atleast_1d(panels), models.items(), strict=True):
        axes.bar([textwrap.fill(name, 14) for name in entries],
                 [entry["median_step_s"] * 1e3 for entry in entries.values()],
                 color="tab:blue")
        axes.axhline(entries[DDP]["median_step_s"] * 1e3, color="tab:red", linestyle="--",
                     label=DDP)
        axes.set_title(f"{model}: median step, 2 ranks x 1 thread")
        axes.set_ylabel("ms per step")
        axes.tick_params(axis="x", labelsize="small")
        axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def targets(summary: dict) -> list[tuple[str, bool]]:
    verdicts = []
    for model, entries in summary["models"].items():
        for name, limit in TARGETS.items():
            if name in entries:
                ratio = entries[name]["median_ratio_to_ddp"]
                verdicts.append((f"{model}: {name} step time / DDP's = {ratio:.3f} "
                                 f"(target <= {limit:.2f})", ratio <= limit))
    return verdicts


def tables(result: dict) -> str:
    """The report's tables (Markdown, one per model) from ``ddp.json``."""
    parts = []
    for model, contenders in result["models"].items():
        rows = []
        for name, c in contenders.items():
            parts_s = c.get("breakdown_s", {})
            rows.append([name, ms(c["median_step_s"]), f"{c['median_ratio_to_ddp']:.3f}",
                         f"{c['efficiency']:.2f}",
                         *(ms(parts_s[key]) if key in parts_s else "—" for key in (
                             "compute_s", "wait_s", "update_s", "main_cpu_s", "other_cpu_s"))])
        parts.append(f"{model}:\n\n" + markdown_table(
            ["contender", "median step", "ratio to DDP", "efficiency", "compute",
             "wait in synchronize", "update", "main-thread CPU", "other threads' CPU"], rows))
    return "\n\n".join(parts)
