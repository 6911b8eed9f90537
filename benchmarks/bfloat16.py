"""Benchmark 9: bfloat16 on the wire (hvdtrain's Horovod patch 0011-bfloat16), 2 ranks.

Two measures, each interleaved over rounds:

- Horovod's allreduce of bfloat16 against float32 at the same element count (float32
  buffers of 1 MiB to 64 MiB), Gloo and MPI: one launch of bfloat16_worker.py per
  controller per round, which alternates the two dtypes inside it. Target: bfloat16 /
  float32 ≤ 0.6 at 16 MiB and above, under both controllers (half the bytes, and the
  sum converts each element to float32 and back).
- hvdtrain's ``DistributedOptimizer`` on the ``wide`` MLP (12.4 M parameters, the
  benchmark model with the most gradient bytes per unit of compute) with
  ``compression=None``, ``"fp16"`` and ``"bf16"``, flat (one allreduce after backward):
  one launch of step_worker.py per compression and controller per round. No target:
  the step time it buys is the result.
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
    write_result,
)

from hvdtrain.jobs.launch import CONTROLLERS

TARGET_RATIO, TARGET_FROM_BYTES = 0.6, 16 * 2**20
MODEL = "wide"
COMPRESSIONS = ("none", "fp16", "bf16")


def run(folder: Path, smoke: bool) -> dict:
    max_bytes, budget_s, rounds, steps = ((2**20, 0.02, 1, 2) if smoke
                                          else (64 * 2**20, 0.6, 5, 20))
    allreduces = interleaved(
        {controller: (lambda c=controller: horovod_result(
            "bfloat16_worker.py", [str(max_bytes), str(budget_s)], controller=c))
         for controller in CONTROLLERS}, rounds, "bfloat16 allreduce")
    sizes = []
    for index, row in enumerate(allreduces[CONTROLLERS[0]][0]["sizes"]):
        entry = {"elements": row["elements"], "float32_bytes": row["float32_bytes"]}
        for controller in CONTROLLERS:
            rows = [result["sizes"][index] for result in allreduces[controller]]
            entry[controller] = {
                "float32_s": median([r["float32_s"] for r in rows]),
                "bfloat16_s": median([r["bfloat16_s"] for r in rows]),
                "ratio": median_ratio([r["bfloat16_s"] for r in rows],
                                      [r["float32_s"] for r in rows])}
        sizes.append(entry)
    steps_run = interleaved(
        {f"{wire} {controller}": (lambda w=wire, c=controller: horovod_result(
            "step_worker.py", [MODEL, str(steps), "grouped", w], controller=c))
         for controller in CONTROLLERS for wire in COMPRESSIONS}, rounds, "bf16 compression")
    training = {}
    for controller in CONTROLLERS:
        plain = [r["models"][MODEL]["median_step_s"] for r in steps_run[f"none {controller}"]]
        for wire in COMPRESSIONS:
            times = [r["models"][MODEL]["median_step_s"]
                     for r in steps_run[f"{wire} {controller}"]]
            training[f"{wire} {controller}"] = {
                "median_step_s": median(times), "ratio_to_none": median_ratio(times, plain),
                "parameters": steps_run[f"{wire} {controller}"][0]["models"][MODEL][
                    "parameters"]}
    summary = {"sizes": sizes, "training": training}
    write_result(folder, "bfloat16", {"max_float32_bytes": max_bytes,
                                      "seconds_per_size": budget_s, "rounds": rounds,
                                      "workers": 2, "model": MODEL, "steps": steps,
                                      "overlap": False}, summary)
    _plot(folder / "bfloat16.png", sizes)
    return summary


def _plot(path: Path, sizes: list[dict]) -> None:
    plt = pyplot()
    figure, axes = plt.subplots(figsize=(6, 4))
    counts = [row["float32_bytes"] for row in sizes]
    for controller in CONTROLLERS:
        axes.plot(counts, [row[controller]["ratio"] for row in sizes], "o-", label=controller)
    axes.axhline(TARGET_RATIO, color="k", linestyle="--", label="target")
    axes.axhline(0.5, color="grey", linestyle=":", label="half the bytes")
    axes.set_xscale("log", base=2)
    axes.set_xlabel("float32 buffer size (bytes); bfloat16 sends half")
    axes.set_ylabel("bfloat16 / float32 allreduce time")
    axes.legend()
    figure.suptitle("Horovod allreduce with patch 0011, 2 ranks on one machine")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def targets(summary: dict) -> list[tuple[str, bool]]:
    return [(f"{row['float32_bytes'] >> 20} MiB of float32, {controller}: bfloat16 / "
             f"float32 allreduce time = {row[controller]['ratio']:.2f} (target <= "
             f"{TARGET_RATIO})", row[controller]["ratio"] <= TARGET_RATIO)
            for row in summary["sizes"] if row["float32_bytes"] >= TARGET_FROM_BYTES
            for controller in CONTROLLERS]


def tables(result: dict) -> str:
    """The report's tables (Markdown) from ``bfloat16.json``."""
    allreduce = markdown_table(
        ["elements (float32 size)", *(f"{c} float32 / bfloat16" for c in CONTROLLERS),
         *(f"{c} ratio" for c in CONTROLLERS)],
        [[f"{r['elements']:,} ({r['float32_bytes'] >> 20} MiB)",
          *(f"{ms(r[c]['float32_s'])} / {ms(r[c]['bfloat16_s'])}" for c in CONTROLLERS),
          *(f"{r[c]['ratio']:.2f}" for c in CONTROLLERS)] for r in result["sizes"]])
    training = result["training"]
    parameters = next(iter(training.values()))["parameters"]
    steps = markdown_table(
        [f"compression ({result['settings']['model']}, {parameters / 1e6:.1f} M parameters, "
         "flat)", *(f"{c} step" for c in CONTROLLERS),
         *(f"{c} / none" for c in CONTROLLERS)],
        [[wire, *(ms(training[f"{wire} {c}"]["median_step_s"]) for c in CONTROLLERS),
          *(f"{training[f'{wire} {c}']['ratio_to_none']:.2f}" for c in CONTROLLERS)]
         for wire in COMPRESSIONS])
    return allreduce + "\n\n" + steps
