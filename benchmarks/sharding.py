"""Benchmark 7: sharded optimizer state (``DistributedOptimizer(shard_state=True)``,
ZeRO-1, and ``shard_gradients=True``, ZeRO-2) against the whole state (hvdtrain's flat
allreduce), and PyTorch DDP's ``ZeroRedundancyOptimizer`` against DDP with the whole
state, with AdamW on 2 ranks.

Contenders, one launch each per round, interleaved: hvdtrain flat, ZeRO-1 and ZeRO-2
under MPI and under Gloo (sharding_worker.py), DDP with AdamW and DDP with
ZeroRedundancyOptimizer over AdamW (Gloo, torchrun; ddp_worker.py). Each launch trains
the MLP, convdense and the 58.7 M-parameter ``large`` MLP. Per model: the median step
time and the optimizer-state bytes a rank holds; per launch: its peak resident memory
(the large model sets it). Targets: on the large model, state per rank sharded / whole
≤ 0.55; step time sharded / flat ≤ 1.05 under MPI and under Gloo on every model.
"""

from __future__ import annotations

from pathlib import Path

from common import (
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

MODELS = ("mlp", "convdense", "large")
MEMORY_MODEL = "large"
TARGET_STATE_RATIO, TARGET_STEP_RATIO = 0.55, 1.05
HVDTRAIN = {f"hvdtrain {mode} {controller}": (mode, controller)
            for controller in ("mpi", "gloo") for mode in ("flat", "zero1", "zero2")}
DDP = {"DDP AdamW": "adamw", "DDP ZeroRedundancyOptimizer": "zero"}
# (sharded contender, its whole-state peer)
PAIRS = {**{f"hvdtrain {mode} {controller}": f"hvdtrain flat {controller}"
            for controller in ("mpi", "gloo") for mode in ("zero1", "zero2")},
         "DDP ZeroRedundancyOptimizer": "DDP AdamW"}
HVDTRAIN_SHARDED = tuple(name for name in PAIRS if name.startswith("hvdtrain"))


# Timed steps per launch: about 2 s of each model (a tenth of a second of the MLP would
# be decided by one hiccup of the machine).
STEPS = {"mlp": 200, "convdense": 40, "large": 10}


def hvdtrain_contender(models: str, steps: str, mode: str, controller: str,
                      env: dict[str, str] | None = None):
    """A launch of sharding_worker.py: hvdtrain with AdamW, ``mode`` flat, zero1 or zero2."""
    return lambda: horovod_result("sharding_worker.py", [models, steps, mode],
                                  controller=controller, env=env)


def ddp_contender(models: str, steps: str, kind: str, env: dict[str, str] | None = None):
    """A torchrun launch of ddp_worker.py (``kind`` adamw or zero)."""
    return lambda: torchrun_result("ddp_worker.py", [models, steps, kind], env=env)


def run(folder: Path, smoke: bool) -> dict:
    models, rounds = (("mlp",), 1) if smoke else (MODELS, 5)
    steps = ",".join(f"{m}={1 if smoke else STEPS[m]}" for m in models)
    names = ",".join(models)
    contenders = {name: hvdtrain_contender(names, steps, mode, controller)
                  for name, (mode, controller) in HVDTRAIN.items()}
    contenders.update({name: ddp_contender(names, steps, kind) for name, kind in DDP.items()})
    if smoke:  # that they still run: one of each kind
        contenders = {name: contenders[name] for name in (
            "hvdtrain flat mpi", "hvdtrain zero1 mpi", "hvdtrain zero2 gloo",
            "DDP ZeroRedundancyOptimizer")}
    measured = interleaved(contenders, rounds, "sharded state")
    results = {}
    for model in models:
        steps_by = {name: [r["models"][model]["median_step_s"] for r in runs]
                    for name, runs in measured.items()}
        results[model] = {name: {
            "median_step_s": median(values),
            "state_bytes": measured[name][0]["models"][model]["state_bytes"],
            "rounds_s": values,
        } for name, values in steps_by.items()}
        for sharded, whole in PAIRS.items():
            if sharded not in steps_by or whole not in steps_by:
                continue
            entry = results[model][sharded]
            entry["step_ratio_to_whole"] = median_ratio(steps_by[sharded], steps_by[whole])
            entry["state_ratio_to_whole"] = entry["state_bytes"] / \
                results[model][whole]["state_bytes"]
    peak_rss = {name: median([r["peak_rss_bytes"] for r in runs])
                for name, runs in measured.items()}
    alone = {name: {key: median([r["collectives_alone"][key] for r in runs])
                    for key in runs[0]["collectives_alone"]}
             for name, runs in measured.items() if runs[0].get("collectives_alone")}
    write_result(folder, "sharding", {"models": models, "steps_per_launch": steps,
                                      "rounds": rounds, "optimizer": "AdamW, lr 1e-4",
                                      "threads_per_rank": 1, "workers": 2},
                 {"models": results, "peak_rss_bytes": peak_rss, "collectives_alone": alone,
                  "targets": {"state_ratio": TARGET_STATE_RATIO,
                              "step_ratio": TARGET_STEP_RATIO}})
    _plot(folder / "sharding.png", results, peak_rss)
    return {"models": results, "peak_rss_bytes": peak_rss}


def _plot(path: Path, results: dict, peak_rss: dict) -> None:
    """Left: state per rank and peak memory on the largest model; right: each sharded
    contender's step time over its whole-state peer's, per model."""
    plt = pyplot()
    figure, (memory, speed) = plt.subplots(1, 2, figsize=(13, 5))
    model = MEMORY_MODEL if MEMORY_MODEL in results else next(iter(results))
    names = list(results[model])
    positions = range(len(names))
    memory.bar([p - 0.2 for p in positions],
               [results[model][n]["state_bytes"] / 2**20 for n in names], 0.4,
               label="optimizer state per rank")
    memory.bar([p + 0.2 for p in positions], [peak_rss[n] / 2**20 for n in names], 0.4,
               label="peak resident memory per rank")
    labels = [n.replace("ZeroRedundancyOptimizer", "ZeroRedundancy-\nOptimizer").replace(" ", "\n")
              for n in names]
    memory.set_xticks(list(positions), labels, fontsize=7)
    memory.set_ylim(0, max(peak_rss.values()) / 2**20 * 1.2)  # room for the legend
    memory.set_ylabel("MiB")
    memory.set_title(f"memory, {model} model, AdamW, 2 ranks")
    memory.legend(fontsize=8, loc="upper center", ncol=2)
    shown = [p for p in PAIRS if p in names and PAIRS[p] in names]
    width = 0.8 / max(len(shown), 1)
    for offset, sharded in enumerate(shown):
        speed.bar([i + width * (offset - (len(shown) - 1) / 2) for i in range(len(results))],
                  [results[m][sharded]["step_ratio_to_whole"] for m in results], width,
                  label=f"{sharded} / {PAIRS[sharded]}")
    speed.axhline(1.0, color="k", linewidth=1)
    speed.axhline(TARGET_STEP_RATIO, color="tab:red", linestyle="--", label="target")
    speed.set_xticks(range(len(results)), list(results))
    highest = max(results[m][n]["step_ratio_to_whole"] for m in results for n in shown)
    speed.set_ylim(0.7, highest + 0.35)  # the ratios' range, with room for the legend
    speed.set_ylabel("step time, sharded / whole state")
    speed.set_title("the cost of sharding the state")
    speed.legend(fontsize=7, loc="upper left", ncol=2)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def tables(result: dict) -> str:
    """The report's table (Markdown) from ``sharding.json``."""
    rows = []
    for model, contenders in result["models"].items():
        for name, c in contenders.items():
            rows.append([model, name, ms(c["median_step_s"]),
                         f"{c['step_ratio_to_whole']:.3f}" if "step_ratio_to_whole" in c else "",
                         f"{c['state_bytes'] / 2**20:.1f} MiB",
                         f"{c['state_ratio_to_whole']:.3f}" if "state_ratio_to_whole" in c
                         else "",
                         f"{result['peak_rss_bytes'][name] / 2**20:.0f} MiB"])
    table = markdown_table(["model", "contender", "median step", "step / whole state's",
                            "optimizer state per rank", "state / whole state's",
                            "peak resident memory per rank (the launch)"], rows)
    alone = result.get("collectives_alone") or {}
    if not alone:
        return table
    collectives = markdown_table(
        ["launch", "buffer", "allreduce", "broadcast of each slice, in place",
         "reduce-scatter", "all-gather of a slice"],
        [[name, f"{a['elements'] * 4 / 2**20:.0f} MiB float32", ms(a["allreduce_s"]),
          ms(a["broadcast_slices_s"]) if "broadcast_slices_s" in a else "",
          ms(a["reducescatter_s"]), ms(a["allgather_s"])] for name, a in alone.items()])
    return f"{table}\n\nThe collectives alone, ranks otherwise idle:\n\n{collectives}"


def targets(summary: dict) -> list[tuple[str, bool]]:
    verdicts = []
    models = summary["models"]
    if MEMORY_MODEL in models:
        for sharded in PAIRS:
            if sharded not in models[MEMORY_MODEL]:
                continue
            ratio = models[MEMORY_MODEL][sharded]["state_ratio_to_whole"]
            verdicts.append((f"{MEMORY_MODEL}: {sharded} holds {ratio:.3f} of the whole "
                             f"state per rank (target <= {TARGET_STATE_RATIO})",
                             ratio <= TARGET_STATE_RATIO))
    for model in models:
        for sharded in HVDTRAIN_SHARDED:
            if "step_ratio_to_whole" not in models[model].get(sharded, {}):
                continue
            ratio = models[model][sharded]["step_ratio_to_whole"]
            verdicts.append((f"{model}: {sharded} step / {PAIRS[sharded]}'s = {ratio:.3f} "
                             f"(target <= {TARGET_STEP_RATIO})", ratio <= TARGET_STEP_RATIO))
    return verdicts
