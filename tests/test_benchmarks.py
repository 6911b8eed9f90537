"""Benchmarks are not tests: CI only runs their smoke versions so that they keep working."""

import json
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).parents[1] / "benchmarks"


def test_overhead_benchmark_smoke_run_writes_its_report():
    done = subprocess.run([sys.executable, str(BENCHMARKS / "run.py"), "--smoke"],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    results = Path(done.stdout.strip().splitlines()[-1].removeprefix("results: "))
    report = json.loads(results.read_text())
    assert report["machine"]["torch"] and report["settings"]["rounds"] == 2
    assert [entry["controller"] for entry in report["overhead"]] == ["gloo", "mpi"]
    for entry in report["overhead"]:
        assert set(entry["median_step_s"]) == {"horovod", "hvdtrain", "hvdtrain_unchecked"}
        assert all(seconds > 0 for seconds in entry["median_step_s"].values())
