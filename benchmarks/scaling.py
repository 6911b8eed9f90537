"""Benchmark 3: scaling efficiency = throughput(2 ranks) / (2 x throughput(1 rank)) for
a compute-heavy model (the small conv net) and a communication-heavy one (the wide
MLP, 12.6 M parameters in 26 tensors), with the share of the 2-rank step spent waiting
for the gradient allreduce. 1-rank and 2-rank launches (Gloo) alternate over rounds;
the efficiency is the median of the round ratios. Target: ≥ 0.90 for the conv net.

A third contender, two independent 1-rank processes at once (no launcher, nothing
exchanged), gives the machine's own ceiling: what two busy cores achieve without any
communication, so that the loss due to Horovod can be told from the loss due to the
machine (shared memory bandwidth, neighbours on a shared host).
"""

from __future__ import annotations

from pathlib import Path

from common import concurrent_results, horovod_result, interleaved, median, pyplot, write_result

MODELS = ("conv", "wide")
TARGET_EFFICIENCY = 0.90


def _launch(np: int, steps: int):
    return lambda: horovod_result("step_worker.py", [",".join(MODELS), str(steps)], np=np)


def _independent(steps: int):
    return lambda: concurrent_results("step_worker.py", [",".join(MODELS), str(steps)], 2)


def run(folder: Path, smoke: bool) -> dict:
    steps, rounds = (2, 1) if smoke else (30, 5)
    measured = interleaved({"1 rank": _launch(1, steps), "2 ranks": _launch(2, steps),
                            "2 independent": _independent(steps)}, rounds, "scaling")
    models = {}
    for name in MODELS:
        one = [r["models"][name] for r in measured["1 rank"]]
        two = [r["models"][name] for r in measured["2 ranks"]]
        efficiency = median([b["samples_per_s"] / (2 * a["samples_per_s"])
                             for a, b in zip(one, two, strict=True)])
        ceiling = median([sum(p["models"][name]["samples_per_s"] for p in pair)
                          / (2 * a["samples_per_s"])
                          for a, pair in zip(one, measured["2 independent"], strict=True)])
        models[name] = {
            "parameters": two[0]["parameters"], "parameter_tensors": two[0]["parameter_tensors"],
            "batch_per_worker": two[0]["batch_per_worker"],
            "samples_per_s_1_rank": median([a["samples_per_s"] for a in one]),
            "samples_per_s_2_ranks": median([b["samples_per_s"] for b in two]),
            "scaling_efficiency": efficiency,
            "machine_ceiling_efficiency": ceiling,
            "allreduce_wait_share_2_ranks": median(
                [b["median_wait_s"] / b["median_step_s"] for b in two]),
            "median_step_s_1_rank": median([a["median_step_s"] for a in one]),
            "median_step_s_2_ranks": median([b["median_step_s"] for b in two]),
        }
    write_result(folder, "scaling", {"steps_per_launch": steps, "rounds": rounds,
                                     "controller": "gloo", "threads_per_rank": 1},
                 {"target_efficiency_conv": TARGET_EFFICIENCY, "models": models,
                  "rounds": measured})
    _plot(folder / "scaling.png", models)
    return {"models": models}


def _plot(path: Path, models: dict) -> None:
    plt = pyplot()
    figure, axes = plt.subplots(figsize=(8, 4))
    names = list(models)
    axes.bar([f"{n}\nefficiency" for n in names],
             [models[n]["scaling_efficiency"] for n in names], color="tab:blue")
    axes.bar([f"{n}\nmachine ceiling" for n in names],
             [models[n]["machine_ceiling_efficiency"] for n in names], color="tab:gray")
    axes.bar([f"{n}\nallreduce wait" for n in names],
             [models[n]["allreduce_wait_share_2_ranks"] for n in names], color="tab:orange")
    axes.axhline(TARGET_EFFICIENCY, color="tab:red", linestyle="--", label="target 0.90")
    axes.set_ylim(0, 0.05 + max(1.0, *(models[n]["machine_ceiling_efficiency"] for n in names)))
    axes.set_title("2 ranks vs 1: scaling efficiency, the machine's ceiling\n"
                   "(2 independent processes) and the share of the step waiting")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def targets(summary: dict) -> list[tuple[str, bool]]:
    conv = summary["models"]["conv"]
    return [(f"conv net scaling efficiency {conv['scaling_efficiency']:.3f} (target >= "
             f"{TARGET_EFFICIENCY}; this machine's ceiling without communication "
             f"{conv['machine_ceiling_efficiency']:.3f})",
             conv["scaling_efficiency"] >= TARGET_EFFICIENCY)]
