"""Benchmark 5: Keras 3 training throughput, 2 ranks against 1 process, for ``model.fit``
(hvdtrain's DistributedOptimizer) and a TensorFlow custom loop (DistributedGradientTape),
on the conv net with one thread per rank. 1-rank and 2-rank launches (Gloo) alternate
over rounds; the efficiency throughput(2) / (2 x throughput(1)) is the median of the
round ratios.
"""

from __future__ import annotations

from pathlib import Path

from common import bar_chart, horovod_result, interleaved, markdown_table, median, write_result

MODES = ("fit", "custom_loop")


def _launch(np: int, steps: int):
    return lambda: horovod_result("keras_worker.py", [str(steps)], np=np)


def run(folder: Path, smoke: bool) -> dict:
    steps, rounds = (2, 1) if smoke else (30, 5)
    measured = interleaved({"1 rank": _launch(1, steps), "2 ranks": _launch(2, steps)},
                           rounds, "keras throughput")
    modes = {}
    for mode in MODES:
        one = [r["modes"][mode]["samples_per_s"] for r in measured["1 rank"]]
        two = [r["modes"][mode]["samples_per_s"] for r in measured["2 ranks"]]
        modes[mode] = {"samples_per_s_1_rank": median(one), "samples_per_s_2_ranks": median(two),
                       "scaling_efficiency": median([b / (2 * a) for a, b in
                                                     zip(one, two, strict=True)])}
    write_result(folder, "keras", {"model": "conv", "batch_per_worker": 32,
                                   "steps_per_launch": steps, "rounds": rounds,
                                   "controller": "gloo", "threads_per_rank": 1},
                 {"modes": modes, "rounds": measured})
    bar_chart(folder / "keras.png", "Keras 3, conv net: samples/s",
              {f"{mode}\n{n}": modes[mode][f"samples_per_s_{n.replace(' ', '_')}"]
               for mode in MODES for n in ("1 rank", "2 ranks")}, "samples per second")
    return {"modes": modes}


def targets(summary: dict) -> list[tuple[str, bool]]:
    return []  # reported, no target in the issue


def tables(result: dict) -> str:
    """The report's table (Markdown) from ``keras.json``."""
    names = {"fit": "model.fit", "custom_loop": "TF custom loop"}
    rows = [[names.get(mode, mode), f"{m['samples_per_s_1_rank']:.0f} samples/s",
             f"{m['samples_per_s_2_ranks']:.0f} samples/s", f"{m['scaling_efficiency']:.2f}"]
            for mode, m in result["modes"].items()]
    return markdown_table(["loop", "1 rank", "2 ranks", "efficiency"], rows)
