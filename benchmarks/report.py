"""The benchmark report: the tables of ``benchmarks/README.md`` and the summary in the
project's ``README.md``, generated from ``benchmarks/results/*.json``.

``python benchmarks/report.py`` rewrites every generated block from the results;
``--check`` only says whether the files match them (CI runs it, so no figure is ever
copied by hand and none goes stale). ``run.py`` calls :func:`update` after a run.

A generated block sits between ``<!-- generated: NAME -->`` and ``<!-- end generated
-->``; NAME is a benchmark module (its ``tables()`` and ``targets()``), ``machine`` or
``summary``. Everything outside the blocks is prose and is never touched.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

from common import HERE, markdown_table

RESULTS = HERE / "results"
DOCUMENTS = (HERE / "README.md", HERE.parent / "README.md")
# benchmark module -> the stem of the result file it writes
RESULT_FILES = {"overhead": "overhead", "ddp": "ddp", "scaling": "scaling",
                "bandwidth": "allreduce", "keras_throughput": "keras", "goyal": "goyal",
                "sharding": "sharding", "allocator": "allocator", "bfloat16": "bfloat16",
                "network": "network"}
BLOCK = re.compile(r"(<!-- generated: (\w+) -->\n)(.*?)(<!-- end generated -->)", re.DOTALL)
# The Goyal headline: gradual warmup "matches" the baseline within this many points.
GOYAL_MATCH_POINTS = 0.5


def load(folder: Path) -> dict[str, dict]:
    """The results in ``folder``, by benchmark module (those that are there)."""
    results = {}
    for module, stem in RESULT_FILES.items():
        path = folder / f"{stem}.json"
        if path.exists():
            results[module] = json.loads(path.read_text())
    return results


def benchmark_block(module_name: str, result: dict) -> str:
    """A benchmark's tables and its targets' verdicts."""
    module = importlib.import_module(module_name)
    text = module.tables(result)
    verdicts = module.targets(result)
    if verdicts:
        text += "\n\nTargets:\n\n" + "\n".join(
            f"- {'met' if met else '**missed**'}: {description}" for description, met in verdicts)
    return text


def machine_block(results: dict[str, dict]) -> str:
    """The machines and software the results were measured on (one line each)."""
    seen: dict[str, list[str]] = {}
    for module, result in results.items():
        m = result["machine"]
        line = (f"{m['processor']}, {m['cpus']} CPUs, {m['memory_gib']} GiB; Python "
                f"{m['python']}, hvdtrain {m['hvdtrain']}, Horovod {m['horovod']}, torch "
                f"{m['torch']}, TensorFlow {m['tensorflow-cpu']}, Keras {m['keras']}")
        seen.setdefault(line, []).append(f"{RESULT_FILES[module]}.json")
    return "\n".join(f"- {line} ({', '.join(files)})" for line, files in seen.items())


def summary_block(results: dict[str, dict]) -> str:
    """README.md's headline table: one row per measure, Gloo and MPI side by side."""
    rows = []
    ddp = results["ddp"]["models"]
    for model in ddp:
        rows.append(["step time / PyTorch DDP's, Gloo (torch)", model,
                     *(f"{ddp[model][f'hvdtrain {c}']['median_ratio_to_ddp']:.2f}"
                       for c in ("gloo", "mpi"))])
    by_place: dict[tuple[str, str], dict[str, float]] = {}
    for e in results["overhead"]["entries"]:
        place = (f"step time / raw Horovod's ({e['framework']})", e["model"])
        by_place.setdefault(place, {})[e["controller"]] = e["median_ratio"]["hvdtrain"]
    rows += [[measure, model, *(f"{ratios[c]:.2f}" if c in ratios else "—"
                                for c in ("gloo", "mpi"))]
             for (measure, model), ratios in by_place.items()]
    for model, m in results["scaling"]["models"].items():
        rows.append(["scaling efficiency, 2 ranks (torch)", model,
                     *(f"{m[c]['scaling_efficiency']:.2f}" for c in ("gloo", "mpi"))])
    keras = results["keras_throughput"]
    rows.append(["scaling efficiency, 2 ranks (Keras `fit`)", keras["settings"]["model"],
                 *(f"{keras['modes']['fit']['scaling_efficiency']:.2f}" if
                   keras["settings"]["controller"] == c else "—" for c in ("gloo", "mpi"))])
    sharding = results["sharding"]["models"]

    def sharded(model: str, key: str, mode: str) -> list[str]:
        return [f"{sharding[model][f'hvdtrain {mode} {c}'][key]:.2f}" for c in ("gloo", "mpi")]

    def zero(model: str, key: str) -> list[str]:  # DDP's peer runs over Gloo only
        return [f"{sharding[model]['DDP ZeroRedundancyOptimizer'][key]:.2f}", "—"]

    if "large" in sharding:
        rows.append(["optimizer state per rank / whole state's (AdamW, `shard_state=True`)",
                     "large (58.7 M)", *sharded("large", "state_ratio_to_whole", "zero1")])
        rows.append(["the same for DDP's ZeroRedundancyOptimizer", "large (58.7 M)",
                     *zero("large", "state_ratio_to_whole")])
    for model in ("mlp", "convdense", "large"):
        if model in sharding:
            rows.append(["step time ZeRO-1 (`shard_state`) / whole state's (AdamW)", model,
                         *sharded(model, "step_ratio_to_whole", "zero1")])
            rows.append(["step time ZeRO-2 (`shard_gradients`) / whole state's (AdamW)", model,
                         *sharded(model, "step_ratio_to_whole", "zero2")])
            rows.append(["the same for DDP's ZeroRedundancyOptimizer", model,
                         *zero(model, "step_ratio_to_whole")])
    goyal = results["goyal"]
    controller = goyal["settings"]["controller"]
    for table, model in ((goyal, "MNIST-1D conv net"),
                         (goyal.get("bn"), "MNIST-1D conv net with BN per worker")):
        if table is not None:
            largest = _largest_matching_k(table)
            rows.append([f"Goyal: largest k where gradual warmup is within "
                         f"{GOYAL_MATCH_POINTS} points of k = 1", model,
                         *(str(largest) if controller == c else "—" for c in ("gloo", "mpi"))])
    return markdown_table(["measure", "model", "Gloo", "MPI"], rows)


def _largest_matching_k(goyal: dict) -> int:
    baseline = goyal["baselines"][str(goyal["tuned_eta"])]["val_error_pct_mean"]
    largest = 1
    for k, row in sorted(goyal["large_batch"].items(), key=lambda item: int(item[0])):
        if row["gradual"]["val_error_pct_mean"] > baseline + GOYAL_MATCH_POINTS:
            break
        largest = int(k)
    return largest


def render(text: str, results: dict[str, dict]) -> str:
    """``text`` with every block whose results are there regenerated."""
    makers: dict[str, Callable[[], str]] = {
        module: (lambda m=module: benchmark_block(m, results[m])) for module in results}
    makers["machine"] = lambda: machine_block(results)
    if set(results) == set(RESULT_FILES):
        makers["summary"] = lambda: summary_block(results)

    def replace(match: re.Match) -> str:
        start, name, _old, end = match.groups()
        if name not in makers:
            if name not in RESULT_FILES and name not in ("machine", "summary"):
                raise ValueError(f"unknown generated block {name!r}: the names are "
                                 f"{', '.join([*RESULT_FILES, 'machine', 'summary'])}")
            return match.group(0)
        return f"{start}{makers[name]()}\n{end}"

    return BLOCK.sub(replace, text)


def update(folder: Path = RESULTS, documents: tuple[Path, ...] = DOCUMENTS,
           check: bool = False) -> list[str]:
    """Regenerate ``documents`` from the results in ``folder`` (or, with ``check``, only
    compare). Returns the unified diffs of the documents that were (or would be) changed."""
    results = load(folder)
    diffs = []
    for path in documents:
        old = path.read_text()
        new = render(old, results)
        if new != old:
            diffs.append("".join(difflib.unified_diff(
                old.splitlines(keepends=True), new.splitlines(keepends=True),
                str(path), f"{path} (from {folder})")))
            if not check:
                path.write_text(new)
    return diffs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="only say whether the documents match the results")
    parser.add_argument("--results", type=Path, default=RESULTS, help="the results folder")
    args = parser.parse_args()
    diffs = update(args.results, check=args.check)
    if args.check and diffs:
        print("".join(diffs))
        print("the generated blocks differ from the results: run "
              "`.venv/bin/python benchmarks/report.py` and commit the documents",
              file=sys.stderr)
        return 1
    for path in DOCUMENTS:
        print(f"{'checked' if args.check else 'written'}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
