"""Benchmark 6: Goyal et al. 2017's Table 1 at small scale on the CPU.

scikit-learn's digits, an MLP, SGD with momentum (goyal_worker.py), 2 ranks. The
baseline trains with a global batch of 32 for each η of a small grid; the η with the
lowest mean validation error is the tuned η. Then global batches k = 8 and 16 times
larger (per-worker batches of 128 and 256) train with (a) kη and no warmup, (b)
hvdtrain's gradual warmup to kη over 5 epochs, (c) the paper's constant warmup (η for
5 epochs, then kη). The large batches train from the tuned η and, when it differs,
from the smallest η of the grid too (kη then stays smaller). Every configuration runs
with 5 seeds; the table reports the final validation error, mean ± std. The paper
leads us to expect (b) ≈ baseline and (a), (c) worse; the result is whatever is
measured.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path

from common import horovod_result, progress, pyplot, write_result

ETAS = (0.01, 0.03, 0.1)
KS = (8, 16)
WARMUPS = ("none", "constant", "gradual")
BASE_BATCH = 32
CONTROLLER = "mpi"  # lower small-message latency than Gloo here (see allreduce.json)


def _runs(label: str, per_worker: int, eta: float, warmups, seeds) -> list[dict]:
    return [{"label": label, "batch_per_worker": per_worker, "eta": eta, "warmup": warmup,
             "seed": seed} for warmup in warmups for seed in seeds]


def _train(runs: list[dict], epochs: int, milestones: list[int]) -> list[dict]:
    spec = Path(tempfile.mkdtemp(prefix="hvdtrain-goyal-")) / "runs.json"
    spec.write_text(json.dumps({"epochs": epochs, "milestones": milestones, "runs": runs}))
    return horovod_result("goyal_worker.py", [str(spec)], controller=CONTROLLER,
                          timeout=1800)["runs"]


def _summary(runs: list[dict]) -> dict:
    errors = [100 * run["val_error"] for run in runs]
    losses = [run["train_loss"] for run in runs]
    return {"val_error_pct_mean": statistics.mean(errors),
            "val_error_pct_std": statistics.stdev(errors) if len(errors) > 1 else 0.0,
            "val_error_pct": errors, "seeds": [run["seed"] for run in runs],
            "train_loss_mean": [statistics.mean(epoch) for epoch in zip(*losses, strict=True)],
            "steps_per_epoch": runs[0]["steps_per_epoch"]}


def run(folder: Path, smoke: bool) -> dict:
    epochs, milestones = (2, [1]) if smoke else (30, [20, 25])
    seeds = [1] if smoke else [1, 2, 3, 4, 5]
    etas, ks = (ETAS[-1:], KS[:1]) if smoke else (ETAS, KS)
    baselines = {}
    for eta in etas:
        progress(f"goyal: baseline, global batch {BASE_BATCH}, eta {eta}, {len(seeds)} seeds")
        baselines[eta] = _summary(_train(_runs("baseline", BASE_BATCH // 2, eta, ["gradual"],
                                               seeds), epochs, milestones))
    tuned = min(baselines, key=lambda eta: baselines[eta]["val_error_pct_mean"])
    rows: dict[float, dict[int, dict]] = {}
    for eta in dict.fromkeys([tuned, min(etas)]):
        rows[eta] = {}
        for k in ks:
            progress(f"goyal: k={k} (global batch {BASE_BATCH * k}), eta {eta}, warmups "
                     f"{', '.join(WARMUPS)}, {len(seeds)} seeds each")
            trained = _train(_runs(f"k{k}", BASE_BATCH * k // 2, eta, WARMUPS, seeds), epochs,
                             milestones)
            rows[eta][k] = {warmup: _summary([r for r in trained if r["warmup"] == warmup])
                            for warmup in WARMUPS}
    write_result(folder, "goyal", {
        "data": "scikit-learn digits: 1437 train / 360 validation", "workers": 2,
        "model": "MLP 64-128-128-10", "optimizer": "SGD momentum 0.9, weight decay 1e-4",
        "epochs": epochs, "milestones": milestones, "gamma": 0.1, "warmup_epochs": 5,
        "base_batch": BASE_BATCH, "etas": list(etas), "seeds": seeds, "controller": CONTROLLER,
    }, {"tuned_eta": tuned, "baselines": {str(eta): s for eta, s in baselines.items()},
        "large_batch": {str(eta): {str(k): row for k, row in by_k.items()}
                        for eta, by_k in rows.items()}})
    _plot(folder / "goyal.png", baselines, rows)
    return {"tuned_eta": tuned, "baselines": baselines, "rows": rows}


def _plot(path: Path, baselines: dict, rows: dict) -> None:
    """Training-loss curves: one panel per (η, k), the baseline at that η in black."""
    plt = pyplot()
    panels = [(eta, k, row) for eta, by_k in rows.items() for k, row in by_k.items()]
    columns = len(next(iter(rows.values())))
    figure, grid = plt.subplots(len(rows), columns, figsize=(5.5 * columns, 4 * len(rows)),
                                squeeze=False)
    for axes, (eta, k, row) in zip(grid.flat, panels, strict=True):
        baseline = baselines[eta]["train_loss_mean"]
        axes.plot(range(1, len(baseline) + 1), baseline, "k-",
                  label=f"baseline, batch {BASE_BATCH}")
        for warmup, summary in row.items():
            axes.plot(range(1, len(summary["train_loss_mean"]) + 1),
                      summary["train_loss_mean"], label=f"k={k}, {warmup} warmup")
        axes.set_yscale("log")
        axes.set_xlabel("epoch")
        axes.set_ylabel("training loss (mean over seeds)")
        axes.set_title(f"η={eta}, global batch {BASE_BATCH * k} (k={k}, kη={k * eta:g})")
        axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def targets(summary: dict) -> list[tuple[str, bool]]:
    return []  # the paper's expectation is reported beside the measurement, not enforced
