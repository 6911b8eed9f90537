"""Benchmark 6: Goyal et al. 2017's Table 1 and Figures 1-2, in small, on the CPU.

Data: MNIST-1D (Greydanus 2020), made here by its generator: 25,000 training and
5,000 validation sequences of 40 values, 10 classes. Model and training:
goyal_worker.py (a small 1-D conv net, SGD with momentum), 2 ranks; two models, the
net without normalisation and the same net with batch normalisation whose statistics
are computed per worker batch of n = 16 examples, whatever k (the paper's section 2.3
with n = 16 instead of 32: a rank's share of the k = 1 batch is 16).

1. Accumulation is exact, for both models: one 2-rank x 4-pass run against one process
   on the concatenated batch (the "8-worker equivalent"; with BN the process
   normalises each worker's 16 examples on their own); the largest parameter
   difference is reported.
2. The baseline (k = 1, global batch 32) trains for each η of a small grid; the η with
   the lowest mean validation error is the tuned η. The BN model trains at the plain
   model's tuned η (so the two differ only by BN; and the benchmark stays within its
   30 minutes).
3. From the tuned η, k = 2 ... 64 (global batch 32k) train with (a) kη and no warmup,
   (b) the paper's constant warmup (η for 5 epochs, then kη), (c) hvdtrain's gradual
   warmup (η to kη over 5 epochs). Each rank runs micro-batches of at most 256 and
   ``backward_passes_per_step`` makes up the rest, so k = 64 is 2 ranks x 4 passes
   (with BN, each pass normalises its 16 groups of 16 on their own).
4. To separate kη from k: k = 16, 32 and 64 again with gradual warmup from a quarter
   of the tuned η (the same k, a quarter of kη), for both models.

Every configuration runs with 3 seeds for the same number of epochs (at small batches
the 3 seeds train side by side in one model, each copy on its own, to share a step's
fixed cost); the tables report
the final validation error, mean ± std. The paper leads us to expect (c) ≈ baseline up
to some k, (a) and (b) worse at large k, and BN to carry (c) further; the result is
whatever is measured.
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
MICRO_BATCH_MAX = 256  # per rank and backward pass: the fastest per example here
# Up to this micro-batch the seeds train side by side in one model (goyal_worker's
# make_model), which shares a step's fixed cost: 3 seeds of 16 take 1.1x one seed's
# time per step here, of 64 1.9x; of 128 3.2x, slower than one after another.
SEEDS_TOGETHER_MAX = 64
WORKERS = 2
CURVE_KS = (16, 32)  # the k of the Figure 2 panels
BN_GROUP = 16  # examples per worker batch that batch normalisation sees
MODELS = {"plain": None, "bn": BN_GROUP}  # name -> bn_group
MODEL_NAMES = {"plain": "MNIST-1D conv net",
               "bn": f"MNIST-1D conv net with BN (n = {BN_GROUP})"}
SMALLER_ETA_FACTOR, SMALLER_ETA_KS = 0.25, (16, 32, 64)
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


def _runs(label: str, k: int, eta: float, warmups, seeds, bn_group: int | None) -> list[dict]:
    """The worker's runs: the seeds side by side in one model up to micro-batches of
    SEEDS_TOGETHER_MAX, one seed per run above."""
    micro_batch, passes = split_batch(k)
    stacks = [list(seeds)] if micro_batch <= SEEDS_TOGETHER_MAX else [[seed] for seed in seeds]
    return [{"label": label, "k": k, "eta": eta, "warmup": warmup, "seeds": stack,
             "micro_batch": micro_batch, "passes": passes, "bn_group": bn_group}
            for warmup in warmups for stack in stacks]


def _train(data: Path, runs: list[dict], epochs: int, milestones,
           verify: list[dict] | None = None) -> dict:
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
    seeds = SEEDS[:2] if smoke else SEEDS
    # smoke: k=4 trains its seeds side by side, k=32 one by one and with 2 passes
    etas, ks = (ETAS[1:2], (4, 32)) if smoke else (ETAS, KS)
    smaller_ks = (32,) if smoke else SMALLER_ETA_KS
    progress(f"goyal: making MNIST-1D ({train_samples} training, "
             f"{samples - train_samples} validation sequences)")
    data = make_data(Path(tempfile.mkdtemp(prefix="hvdtrain-goyal-data-")), samples,
                     train_samples)
    tables, checks, smaller = {}, [], {}
    for model, bn_group in MODELS.items():
        model_etas = etas if model == "plain" else (tables["plain"]["tuned_eta"],)
        tables[model], check = _table(data, model, bn_group, model_etas, ks, seeds, epochs,
                                      milestones)
        checks.append(check)
        eta = tables[model]["tuned_eta"] * SMALLER_ETA_FACTOR
        progress(f"goyal: {model}, k={', '.join(map(str, smaller_ks))} with gradual warmup "
                 f"from η={eta:g} ({SMALLER_ETA_FACTOR:g} of the tuned η)")
        trained = _train(data, [run for k in smaller_ks for run in _runs(
            f"smaller-eta-k{k}", k, eta, ["gradual"], seeds, bn_group)], epochs,
            milestones)["runs"]
        smaller[model] = {"eta": eta, "large_batch": {
            str(k): _summary([r for r in trained if r["k"] == k]) for k in smaller_ks}}
    seconds = time.monotonic() - started
    plain = tables["plain"]
    write_result(folder, "goyal", {
        "data": f"MNIST-1D, made by mnist1d.data.make_dataset (seed 42): {train_samples} "
                f"training / {samples - train_samples} validation sequences of 40, 10 classes",
        "model": "1-D conv net: conv 1->16 (5, stride 2), conv 16->16 (3, stride 2), "
                 "linear 160->10, ReLU; 2.5 k parameters; 'plain' without normalisation, "
                 f"'bn' with batch normalisation after each convolution over groups of "
                 f"{BN_GROUP} examples (one emulated worker's batch)",
        "optimizer": "SGD momentum 0.9, weight decay 1e-4", "workers": WORKERS,
        "epochs": epochs, "milestones": list(milestones), "gamma": 0.1, "warmup_epochs": 5,
        "base_batch": BASE_BATCH, "micro_batch_max": MICRO_BATCH_MAX, "etas": list(etas),
        "ks": list(ks), "seeds": list(seeds), "controller": CONTROLLER,
        "bn_group": BN_GROUP, "smaller_eta_factor": SMALLER_ETA_FACTOR,
        "smaller_eta_ks": list(smaller_ks),
    }, {**plain, "accumulation_check": checks, "bn": tables["bn"], "smaller_eta": smaller,
        "seconds": seconds})
    _plot_error_vs_batch(folder / "goyal.png", tables, smaller)
    curve_ks = {k: plain["large_batch"][str(k)] for k in CURVE_KS if str(k) in
                plain["large_batch"]} or {int(k): row for k, row in plain["large_batch"].items()}
    _plot_curves(folder / "goyal_curves.png", plain["baselines"][str(plain["tuned_eta"])],
                 plain["tuned_eta"], curve_ks)
    progress(f"goyal: done in {seconds / 60:.1f} min")
    return {"tables": tables, "smaller_eta": smaller}


def _table(data: Path, model: str, bn_group: int | None, etas, ks, seeds, epochs,
           milestones) -> tuple[dict, dict]:
    """One model's η tuning and Table 1 (``tuned_eta``, ``baselines``, ``large_batch``),
    and its accumulation check."""
    baselines, check = {}, None
    for eta in etas:
        progress(f"goyal: {model}: baseline (k=1, global batch {BASE_BATCH}), η={eta}, "
                 f"{len(seeds)} seeds" + ("" if check else ", after the accumulation check"))
        result = _train(data, _runs("baseline", 1, eta, ["none"], seeds, bn_group), epochs,
                        milestones,
                        verify=None if check else [{**VERIFY, "bn_group": bn_group}])
        check = check or result["verify"][0]
        baselines[eta] = _summary(result["runs"])
        progress(f"goyal: {model}: baseline η={eta}: {_cell(baselines[eta])} % "
                 "validation error")
    tuned = min(baselines, key=lambda eta: baselines[eta]["val_error_pct_mean"])
    large: dict[str, dict[str, dict]] = {}
    for k in ks:
        micro_batch, passes = split_batch(k)
        progress(f"goyal: {model}: k={k} (global batch {BASE_BATCH * k} = {WORKERS} ranks x "
                 f"{passes} passes x {micro_batch}), η={tuned}, kη={k * tuned:g}, "
                 f"{len(WARMUPS)} warmups x {len(seeds)} seeds")
        trained = _train(data, _runs(f"k{k}", k, tuned, WARMUPS, seeds, bn_group), epochs,
                         milestones)["runs"]
        large[str(k)] = {warmup: _summary([r for r in trained if r["warmup"] == warmup])
                         for warmup in WARMUPS}
        progress(f"goyal: {model}: k={k}: " + ", ".join(
            f"{warmup} {_cell(summary)}" for warmup, summary in large[str(k)].items()))
    return {"tuned_eta": tuned, "baselines": {str(eta): s for eta, s in baselines.items()},
            "large_batch": large}, check


def _cell(summary: dict) -> str:
    return f"{summary['val_error_pct_mean']:.2f} ± {summary['val_error_pct_std']:.2f}"


def _plot_error_vs_batch(path: Path, tables: dict, smaller: dict) -> None:
    """Figure 1's shape, one panel per model: final validation error against the global
    batch (mean over seeds, bars from the best to the worst seed), and gradual warmup
    from the smaller η at the largest k."""
    plt = pyplot()
    figure, panels = plt.subplots(1, len(tables), figsize=(7 * len(tables), 4.8),
                                  squeeze=False, sharey=True)
    for axes, (model, table) in zip(panels.flat, tables.items(), strict=True):
        eta = table["tuned_eta"]
        baseline, large = table["baselines"][str(eta)], table["large_batch"]
        mean, std = baseline["val_error_pct_mean"], baseline["val_error_pct_std"]
        axes.axhspan(mean - std, mean + std, color="0.85")
        axes.axhline(mean, color="k", linewidth=1, label=f"baseline, batch {BASE_BATCH} (± std)")
        batches = [BASE_BATCH * int(k) for k in large]
        for warmup in WARMUPS:
            rows = [row[warmup] for row in large.values()]
            _errorbar(axes, batches, rows, label=f"{warmup} warmup", marker="o")
        if model in smaller:
            rows = smaller[model]["large_batch"]
            _errorbar(axes, [BASE_BATCH * int(k) for k in rows], list(rows.values()),
                      label=f"gradual warmup, η={smaller[model]['eta']:g}", marker="s",
                      linestyle="--", color="k")
        axes.set_xscale("log", base=2)
        axes.set_yscale("log")
        axes.set_xticks(batches, [str(batch) for batch in batches])
        axes.set_xlabel("global batch (k x 32)")
        axes.set_ylabel("final validation error, % (mean; bars: best to worst seed)")
        epochs = len(baseline["train_loss_mean"])
        axes.set_title(f"{MODEL_NAMES[model]}, η={eta}, {epochs} epochs", fontsize=10)
        axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _errorbar(axes, batches: list[int], summaries: list[dict], **style) -> None:
    means = [summary["val_error_pct_mean"] for summary in summaries]
    spreads = [(mean - min(summary["val_error_pct"]), max(summary["val_error_pct"]) - mean)
               for mean, summary in zip(means, summaries, strict=True)]
    axes.errorbar(batches, means, yerr=list(zip(*spreads, strict=True)), capsize=3, **style)


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
    """The report's tables (Markdown) from ``goyal.json``: per model the η tuning and
    Table 1, the accumulation checks, and the smaller-η runs."""
    parts = [_model_tables(result)]
    if "bn" in result:
        group = result["settings"]["bn_group"]
        parts.append(f"With batch normalisation over each worker's {group} examples:\n\n"
                     f"{_model_tables(result['bn'])}")
    checks = result.get("accumulation_check") or []
    for check in checks if isinstance(checks, list) else [checks]:
        norm = f", BN over {check['bn_group']}" if check.get("bn_group") else ""
        parts.append(
            f"Accumulation check ({check['workers']} ranks x {check['passes']} passes x "
            f"{check['micro_batch']} examples{norm}, {check['steps']} steps, against one "
            f"process on the concatenated batch of {check['global_batch']}): largest "
            "parameter difference " + ", ".join(
                f"{d:.1e} in {dtype}" for dtype, d in check["max_abs_parameter_difference"].items())
            + ".")
    if "smaller_eta" in result:
        rows = []
        for model, smaller in result["smaller_eta"].items():
            table = result if model == "plain" else result[model]
            for k, summary in smaller["large_batch"].items():
                tuned = table["large_batch"][k]["gradual"]
                rows.append([MODEL_NAMES[model], k, f"{tuned['target_lr']:g}", _seeds_cell(tuned),
                             f"{summary['target_lr']:g}", _seeds_cell(summary)])
        parts.append(markdown_table(
            ["model", "k", "kη (tuned η)", "gradual warmup", "kη (smaller η)",
             "gradual warmup, smaller η"], rows))
    return "\n\n".join(parts)


def _model_tables(result: dict) -> str:
    """One model's η tuning and Table 1."""
    eta = result["tuned_eta"]
    tuned = " (tuned)" if len(result["baselines"]) > 1 else " (the plain model's tuned η)"
    tuning = markdown_table(["η (k = 1)", "validation error, %"],
                            [[f"{float(value):g}" + (tuned if float(value) == eta else ""),
                              _cell(b)] for value, b in result["baselines"].items()])
    baseline = result["baselines"][str(eta)]
    rows = [["1 (baseline)", baseline["global_batch"], baseline["steps_per_epoch"], f"{eta:g}",
             _cell(baseline), "", ""]]
    for k, row in result["large_batch"].items():
        any_run = next(iter(row.values()))
        rows.append([k, any_run["global_batch"], any_run["steps_per_epoch"],
                     f"{any_run['target_lr']:g}",
                     *(_seeds_cell(row[w]) if w in row else "—" for w in WARMUPS)])
    table = markdown_table(["k", "global batch", "steps/epoch", "kη", "no warmup",
                            "constant warmup", "gradual warmup (hvdtrain)"], rows)
    return tuning + "\n\n" + table


def _seeds_cell(summary: dict) -> str:
    """Mean ± std, with the seeds' own errors when they disagree by more than 10 points
    (some trained and some diverged)."""
    errors = summary["val_error_pct"]
    cell = _cell(summary)
    return cell + (f" ({', '.join(f'{e:.2f}' for e in errors)})"
                   if max(errors) - min(errors) > 10 else "")
