"""Benchmark 6: Goyal et al. 2017's Table 1 and Figures 1-2, in small, on the CPU.

Data: MNIST-1D (Greydanus 2020), made here by its generator: 25,000 training and
5,000 validation sequences of 40 values, 10 classes. Model and training:
goyal_worker.py (a small 1-D conv net, SGD with momentum), 2 ranks.

1. Accumulation is exact: one 2-rank x 4-pass run against one process on the
   concatenated batch (the "8-worker equivalent"); the largest parameter difference
   is reported.
2. The baseline (k = 1, global batch 32) trains for each η of a small grid; the η with
   the lowest mean validation error is the tuned η.
3. From the tuned η, k = 2 ... 64 (global batch 32k) train with (a) kη and no warmup,
   (b) the paper's constant warmup (η for 5 epochs, then kη), (c) hvdtrain's gradual
   warmup (η to kη over 5 epochs). Each rank runs micro-batches of at most 64 and
   ``backward_passes_per_step`` makes up the rest, so k = 64 is 2 ranks x 16 passes.

Every configuration runs with 3 seeds for the same number of epochs; the table reports
the final validation error, mean ± std. The paper leads us to expect (c) ≈ baseline up
to some k, (a) and (b) worse at large k; the result is whatever is measured.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from common import horovod_result, markdown_table, progress, pyplot, write_result

SAMPLES, TRAIN_SAMPLES = 30_000, 25_000
ETAS = (0.02, 0.05, 0.1)
KS = (2, 4, 8, 16, 32, 64)
WARMUPS = ("none", "constant", "gradual")
SEEDS = (1, 2, 3)
EPOCHS, MILESTONES = 30, (10, 20, 27)  # the paper's 90 epochs, x0.1 at 30, 60 and 80
BASE_BATCH = 32
MICRO_BATCH_MAX = 64  # per rank and backward pass: the largest that still runs fast
WORKERS = 2
CURVE_KS = (16, 32)  # the k of the Figure 2 panels
VERIFY = {"passes": 4, "micro_batch": 16, "steps": 10}
CONTROLLER = "mpi"  # lower small-message latency than Gloo here (see allreduce.json)
TIMEOUT_S = 1800


def make_data(folder: Path, samples: int, train_samples: int) -> Path:
    """MNIST-1D from its generator (seeded: the same data every time), as float32 in
    ``folder/mnist1d.npz``; no download."""
    from mnist1d.data import get_dataset_args, make_dataset

    args = get_dataset_args()
    args.num_samples, args.train_split = samples, train_samples / samples
    data = make_dataset(args)
    path = folder / "mnist1d.npz"
    np.savez(path, x=data["x"].astype(np.float32), y=data["y"],
             x_val=data["x_test"].astype(np.float32), y_val=data["y_test"])
    return path


def split_batch(k: int) -> tuple[int, int]:
    """(micro_batch, passes) per rank for a global batch of k x BASE_BATCH."""
    per_rank = k * BASE_BATCH // WORKERS
    micro_batch = min(per_rank, MICRO_BATCH_MAX)
    return micro_batch, per_rank // micro_batch


def _runs(label: str, k: int, eta: float, warmups, seeds) -> list[dict]:
    micro_batch, passes = split_batch(k)
    return [{"label": label, "k": k, "eta": eta, "warmup": warmup, "seed": seed,
             "micro_batch": micro_batch, "passes": passes}
            for warmup in warmups for seed in seeds]


def _train(data: Path, runs: list[dict], epochs: int, milestones, verify=None) -> dict:
    spec = Path(tempfile.mkdtemp(prefix="hvdtrain-goyal-")) / "runs.json"
    spec.write_text(json.dumps({"data": str(data), "epochs": epochs, "base_batch": BASE_BATCH,
                                "milestones": list(milestones), "runs": runs,
                                "verify": verify}))
    return horovod_result("goyal_worker.py", [str(spec)], np=WORKERS, controller=CONTROLLER,
                          timeout=TIMEOUT_S)


def _summary(runs: list[dict]) -> dict:
    errors = [100 * run["val_error"] for run in runs]
    first = runs[0]

    def mean_curve(key: str, scale: float = 1.0) -> list[float]:
        return [scale * statistics.mean(epoch) for epoch in zip(*(r[key] for r in runs),
                                                                strict=True)]

    return {"val_error_pct_mean": statistics.mean(errors),
            "val_error_pct_std": statistics.stdev(errors) if len(errors) > 1 else 0.0,
            "val_error_pct": errors, "seeds": [run["seed"] for run in runs],
            "global_batch": first["global_batch"], "micro_batch": first["micro_batch"],
            "passes": first["passes"], "steps_per_epoch": first["steps_per_epoch"],
            "target_lr": first["target_lr"],
            "train_error_pct_mean": mean_curve("train_error", 100.0),
            "train_error_pct": [[100 * e for e in run["train_error"]] for run in runs],
            "train_loss_mean": mean_curve("train_loss"),
            "seconds_per_run": statistics.mean(run["seconds"] for run in runs)}


def run(folder: Path, smoke: bool) -> dict:
    started = time.monotonic()
    samples, train_samples = (3_000, 2_500) if smoke else (SAMPLES, TRAIN_SAMPLES)
    epochs, milestones = (2, (1,)) if smoke else (EPOCHS, MILESTONES)
    seeds = SEEDS[:1] if smoke else SEEDS
    etas, ks = (ETAS[1:2], (8,)) if smoke else (ETAS, KS)  # smoke: k=8 accumulates
    progress(f"goyal: making MNIST-1D ({train_samples} training, "
             f"{samples - train_samples} validation sequences)")
    data = make_data(Path(tempfile.mkdtemp(prefix="hvdtrain-goyal-data-")), samples,
                     train_samples)
    baselines, verified = {}, None
    for eta in etas:
        progress(f"goyal: baseline (k=1, global batch {BASE_BATCH}), η={eta}, "
                 f"{len(seeds)} seeds" + ("" if verified else ", after the accumulation check"))
        result = _train(data, _runs("baseline", 1, eta, ["none"], seeds), epochs, milestones,
                        verify=None if verified else VERIFY)
        verified = verified or result["verify"]
        baselines[eta] = _summary(result["runs"])
        progress(f"goyal: baseline η={eta}: {_cell(baselines[eta])} % validation error")
    tuned = min(baselines, key=lambda eta: baselines[eta]["val_error_pct_mean"])
    large: dict[int, dict[str, dict]] = {}
    for k in ks:
        micro_batch, passes = split_batch(k)
        progress(f"goyal: k={k} (global batch {BASE_BATCH * k} = {WORKERS} ranks x "
                 f"{passes} passes x {micro_batch}), η={tuned}, kη={k * tuned:g}, "
                 f"{len(WARMUPS)} warmups x {len(seeds)} seeds")
        trained = _train(data, _runs(f"k{k}", k, tuned, WARMUPS, seeds), epochs,
                         milestones)["runs"]
        large[k] = {warmup: _summary([r for r in trained if r["warmup"] == warmup])
                    for warmup in WARMUPS}
        progress(f"goyal: k={k}: " + ", ".join(f"{warmup} {_cell(summary)}"
                                               for warmup, summary in large[k].items()))
    seconds = time.monotonic() - started
    write_result(folder, "goyal", {
        "data": f"MNIST-1D, made by mnist1d.data.make_dataset (seed 42): {train_samples} "
                f"training / {samples - train_samples} validation sequences of 40, 10 classes",
        "model": "1-D conv net: conv 1->16 (5, stride 2), conv 16->16 (3, stride 2), "
                 "linear 160->10, ReLU; 2.5 k parameters, no normalisation",
        "optimizer": "SGD momentum 0.9, weight decay 1e-4", "workers": WORKERS,
        "epochs": epochs, "milestones": list(milestones), "gamma": 0.1, "warmup_epochs": 5,
        "base_batch": BASE_BATCH, "micro_batch_max": MICRO_BATCH_MAX, "etas": list(etas),
        "ks": list(ks), "seeds": list(seeds), "controller": CONTROLLER,
    }, {"tuned_eta": tuned, "accumulation_check": verified,
        "baselines": {str(eta): s for eta, s in baselines.items()},
        "large_batch": {str(k): row for k, row in large.items()}, "seconds": seconds})
    _plot_error_vs_batch(folder / "goyal.png", baselines[tuned], tuned, large)
    _plot_curves(folder / "goyal_curves.png", baselines[tuned], tuned,
                 {k: large[k] for k in CURVE_KS if k in large} or large)
    progress(f"goyal: done in {seconds / 60:.1f} min")
    return {"tuned_eta": tuned, "baselines": baselines, "large_batch": large}


def _cell(summary: dict) -> str:
    return f"{summary['val_error_pct_mean']:.2f} ± {summary['val_error_pct_std']:.2f}"


def _plot_error_vs_batch(path: Path, baseline: dict, eta: float, large: dict) -> None:
    """Figure 1's shape: final validation error against the global batch (mean over
    seeds, bars from the best to the worst seed)."""
    plt = pyplot()
    figure, axes = plt.subplots(figsize=(7, 4.8))
    mean, std = baseline["val_error_pct_mean"], baseline["val_error_pct_std"]
    axes.axhspan(mean - std, mean + std, color="0.85")
    axes.axhline(mean, color="k", linewidth=1, label=f"baseline, batch {BASE_BATCH} (± std)")
    batches = [BASE_BATCH * k for k in large]
    for warmup in WARMUPS:
        means = [row[warmup]["val_error_pct_mean"] for row in large.values()]
        spreads = [(mean - min(row[warmup]["val_error_pct"]),
                    max(row[warmup]["val_error_pct"]) - mean)
                   for mean, row in zip(means, large.values(), strict=True)]
        axes.errorbar(batches, means, yerr=list(zip(*spreads, strict=True)), marker="o",
                      capsize=3, label=f"{warmup} warmup")
    axes.set_xscale("log", base=2)
    axes.set_yscale("log")
    axes.set_xticks(batches, [str(batch) for batch in batches])
    axes.set_xlabel("global batch (k x 32)")
    axes.set_ylabel("final validation error, % (mean; bars: best to worst seed)")
    epochs = len(baseline["train_loss_mean"])
    axes.set_title(f"MNIST-1D, 2 ranks x backward passes, η={eta} (tuned), {epochs} epochs")
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _plot_curves(path: Path, baseline: dict, eta: float, rows: dict) -> None:
    """Figure 2's shape: training error per epoch, the baseline (mean over seeds)
    against large k (one line per seed)."""
    plt = pyplot()
    figure, grid = plt.subplots(1, len(rows), figsize=(6 * len(rows), 4.5), squeeze=False)
    for axes, (k, row) in zip(grid.flat, rows.items(), strict=True):
        curve = baseline["train_error_pct_mean"]
        epochs = range(1, len(curve) + 1)
        axes.plot(epochs, curve, "k-", label=f"baseline, batch {BASE_BATCH}")
        for color, (warmup, summary) in zip(("C0", "C1", "C2"), row.items(), strict=True):
            for seed, seed_curve in enumerate(summary["train_error_pct"]):
                axes.plot(epochs, seed_curve, color=color, linewidth=1,
                          label=None if seed else f"batch {BASE_BATCH * k}, {warmup} warmup")
        axes.set_yscale("log")
        axes.set_xlabel("epoch")
        axes.set_ylabel("training error, % (one line per seed)")
        axes.set_title(f"k={k}: η={eta}, kη={k * eta:g}")
        axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def targets(summary: dict) -> list[tuple[str, bool]]:
    return []  # the paper's expectation is reported beside the measurement, not enforced


def tables(result: dict) -> str:
    """The report's tables (Markdown) from ``goyal.json``: the η tuning and Table 1."""
    eta = result["tuned_eta"]
    tuning = markdown_table(["η (k = 1)", "validation error, %"],
                            [[f"{float(value):g}" + (" (tuned)" if float(value) == eta else ""),
                              _cell(b)] for value, b in result["baselines"].items()])
    baseline = result["baselines"][str(eta)] if str(eta) in result["baselines"] \
        else result["baselines"][eta]
    rows = [["1 (baseline)", baseline["global_batch"], baseline["steps_per_epoch"], f"{eta:g}",
             _cell(baseline), "", ""]]
    for k, row in result["large_batch"].items():
        any_run = next(iter(row.values()))
        rows.append([k, any_run["global_batch"], any_run["steps_per_epoch"],
                     f"{any_run['target_lr']:g}",
                     *(_seeds_cell(row[w]) if w in row else "—" for w in WARMUPS)])
    table = markdown_table(["k", "global batch", "steps/epoch", "kη", "no warmup",
                            "constant warmup", "gradual warmup (hvdtrain)"], rows)
    check = result.get("accumulation_check")
    verified = "" if not check else (
        f"\n\nAccumulation check ({check['workers']} ranks x {check['passes']} passes x "
        f"{check['micro_batch']} examples, {check['steps']} steps, against one process on "
        f"the concatenated batch of {check['global_batch']}): largest parameter difference "
        + ", ".join(f"{d:.1e} in {dtype}"
                    for dtype, d in check["max_abs_parameter_difference"].items()) + ".")
    return tuning + "\n\n" + table + verified


def _seeds_cell(summary: dict) -> str:
    """Mean ± std, with the seeds' own errors when they disagree by more than 10 points
    (some trained and some diverged)."""
    errors = summary["val_error_pct"]
    cell = _cell(summary)
    return cell + (f" ({', '.join(f'{e:.2f}' for e in errors)})"
                   if max(errors) - min(errors) > 10 else "")
