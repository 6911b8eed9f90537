"""hvdtrain's benchmarks: ``python benchmarks/run.py [--smoke]``.

So far: the wrapper overhead of hvdtrain's PyTorch DistributedOptimizer against raw
``horovod.torch.DistributedOptimizer`` (2 ranks, Gloo and MPI, contenders interleaved
within each run, at least 5 rounds, medians and their ratio). Results go to
``benchmarks/results/overhead.json`` with the machine, the versions and the settings;
``--smoke`` runs a tiny version (seconds) that only checks the benchmark still works,
and writes to a temporary folder instead.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from hvdtrain.consistency import software_versions
from hvdtrain.launch import CONTROLLERS, run_workers

HERE = Path(__file__).parent
TARGET_RATIO = 1.01


def machine() -> dict[str, object]:
    return {"platform": platform.platform(), "processor": platform.processor(),
            "cpus": os.cpu_count(),
            **software_versions("torch", "horovod", "tensorflow-cpu", "numpy")}


def overhead(controller: str, rounds: int, steps: int) -> dict[str, object]:
    out = Path(tempfile.mkdtemp(prefix="hvdtrain-bench-")) / f"overhead-{controller}.json"
    run_workers(HERE / "overhead_worker.py", [str(rounds), str(steps), str(out)],
                         controller=controller, timeout=900,
                         env={"OMP_NUM_THREADS": "1"}).check()
    measured = json.loads(out.read_text())
    rounds_s = measured["round_medians_s"]
    medians = {name: statistics.median(values) for name, values in rounds_s.items()}
    ratios = {
        name: statistics.median(ours / raw for ours, raw in zip(
            rounds_s[name], rounds_s["horovod"], strict=True))
        for name in rounds_s if name != "horovod"
    }
    return {**measured, "controller": controller, "median_step_s": medians,
            "median_ratio_over_horovod": ratios, "target_ratio": TARGET_RATIO}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny run, results not kept")
    args = parser.parse_args()
    rounds, steps = (2, 3) if args.smoke else (7, 40)
    folder = Path(tempfile.mkdtemp()) if args.smoke else HERE / "results"
    folder.mkdir(parents=True, exist_ok=True)
    report = {"machine": machine(), "settings": {"rounds": rounds, "steps_per_round": steps,
                                                  "threads_per_rank": 1}, "overhead": []}
    for controller in CONTROLLERS:
        started = time.monotonic()
        print(f"overhead: 2 ranks over {controller}, {rounds} interleaved rounds of {steps} "
              "steps ...", flush=True)
        entry = overhead(controller, rounds, steps)
        report["overhead"].append(entry)
        steps_ms = ", ".join(f"{name} {seconds * 1e3:.2f} ms"
                             for name, seconds in entry["median_step_s"].items())
        ratios = ", ".join(f"{name} {ratio:.3f}"
                           for name, ratio in entry["median_ratio_over_horovod"].items())
        print(f"  median step: {steps_ms}; median ratio to horovod: {ratios} "
              f"(target <= {TARGET_RATIO}) [{time.monotonic() - started:.0f} s]", flush=True)
    path = folder / "overhead.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
