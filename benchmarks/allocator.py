"""Benchmark 8: large buffers and the allocator. hvdtrain's default keeps freed blocks up
to 32 MiB in the process (``hvdtrain.allocator``); ``HVDTRAIN_KEEP_FREED_MEMORY=all``
keeps the larger ones too, which glibc otherwise maps afresh for every allocation, so
that each step faults their pages in again.

Contenders, one launch each per round, interleaved: hvdtrain's flat path under MPI and
Gloo, ZeRO-1 under Gloo and ZeRO-2 under MPI (sharding_worker.py, AdamW; the stages
benchmark 7 finds faster there on this model), and DDP with AdamW (Gloo, torchrun;
ddp_worker.py applies the same allocator settings), each with the default and with
``all``, on the 58.7 M-parameter ``large`` MLP (224 MiB of gradients, each of its
largest tensors 64 MiB). Per contender: the median step time, its median round ratio
with ``all`` to the default, and the peak resident memory. Target: ``all`` takes at
most 0.9 of the default's step time for every hvdtrain contender.
"""

from __future__ import annotations

from pathlib import Path

from common import interleaved, markdown_table, median, median_ratio, ms, pyplot, write_result
from sharding import ddp_contender, hvdtrain_contender

from hvdtrain.allocator import ALL, SWITCH

MODEL = "large"
STEPS = 6
TARGET_STEP_RATIO = 0.9
SETTINGS = {"default": {}, ALL: {SWITCH: ALL}}
HVDTRAIN = {"hvdtrain flat mpi": ("flat", "mpi"), "hvdtrain flat gloo": ("flat", "gloo"),
            "hvdtrain zero1 gloo": ("zero1", "gloo"), "hvdtrain zero2 mpi": ("zero2", "mpi")}
DDP = "DDP AdamW"


def run(folder: Path, smoke: bool) -> dict:
    model, steps, rounds = ("mlp", 1, 1) if smoke else (MODEL, STEPS, 5)
    bases = {name: (lambda env, m=mode, c=controller:
                    hvdtrain_contender(model, str(steps), m, c, env))
             for name, (mode, controller) in HVDTRAIN.items()}
    bases[DDP] = lambda env: ddp_contender(model, str(steps), "adamw", env)
    if smoke:  # that it still runs
        bases = {name: bases[name] for name in ("hvdtrain flat gloo", DDP)}
    contenders = {f"{name}, {setting}": make(env)
                  for name, make in bases.items() for setting, env in SETTINGS.items()}
    measured = interleaved(contenders, rounds, "allocator")
    results = {}
    for name in bases:
        steps_by = {setting: [r["models"][model]["median_step_s"]
                              for r in measured[f"{name}, {setting}"]] for setting in SETTINGS}
        results[name] = {setting: {
            "median_step_s": median(values), "rounds_s": values,
            "peak_rss_bytes": median([r["peak_rss_bytes"]
                                      for r in measured[f"{name}, {setting}"]]),
        } for setting, values in steps_by.items()}
        results[name][ALL]["step_ratio_to_default"] = median_ratio(steps_by[ALL],
                                                                   steps_by["default"])
    write_result(folder, "allocator", {"model": model, "steps_per_launch": steps,
                                       "rounds": rounds, "optimizer": "AdamW, lr 1e-4",
                                       "threads_per_rank": 1, "workers": 2,
                                       "switch": SWITCH},
                 {"contenders": results, "target_step_ratio": TARGET_STEP_RATIO})
    _plot(folder / "allocator.png", results, model)
    return {"contenders": results}


def _plot(path: Path, results: dict, model: str) -> None:
    """Left: step time, right: peak resident memory, each contender with both settings."""
    plt = pyplot()
    figure, (speed, memory) = plt.subplots(1, 2, figsize=(12, 4.5))
    names = list(results)
    positions = range(len(names))
    labels = [name.replace(" ", "\n") for name in names]
    for axes, key, scale, unit in ((speed, "median_step_s", 1e3, "ms per step"),
                                   (memory, "peak_rss_bytes", 2**-20, "peak MiB per rank")):
        for offset, setting in ((-0.2, "default"), (0.2, ALL)):
            axes.bar([p + offset for p in positions],
                     [results[n][setting][key] * scale for n in names], 0.4,
                     label=f"{SWITCH}={'1' if setting == 'default' else setting}")
        axes.set_xticks(list(positions), labels, fontsize=8)
        axes.set_ylabel(unit)
        axes.legend(fontsize=8, loc="lower right")
    speed.set_title(f"step time, {model} model, AdamW, 2 ranks")
    memory.set_title("peak resident memory")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def tables(result: dict) -> str:
    """The report's table (Markdown) from ``allocator.json``."""
    rows = []
    for name, settings in result["contenders"].items():
        default, kept = settings["default"], settings[ALL]
        rows.append([name, ms(default["median_step_s"]), ms(kept["median_step_s"]),
                     f"{kept['step_ratio_to_default']:.3f}",
                     f"{default['peak_rss_bytes'] / 2**20:.0f} MiB",
                     f"{kept['peak_rss_bytes'] / 2**20:.0f} MiB"])
    return markdown_table(["contender", "median step, default", f"median step, {ALL}",
                           f"{ALL} / default", "peak memory per rank, default",
                           f"peak memory per rank, {ALL}"], rows)


def targets(summary: dict) -> list[tuple[str, bool]]:
    verdicts = []
    for name, settings in summary["contenders"].items():
        if not name.startswith("hvdtrain"):
            continue
        ratio = settings[ALL]["step_ratio_to_default"]
        verdicts.append((f"{name}: step with {SWITCH}={ALL} / default's = {ratio:.3f} "
                         f"(target <= {TARGET_STEP_RATIO})", ratio <= TARGET_STEP_RATIO))
    return verdicts
