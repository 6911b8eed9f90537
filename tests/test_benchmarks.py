"""Benchmarks are not tests: CI runs their smoke versions (tiny settings) so that they keep
working, and checks that each writes its report and plot. Targets are judged by
``benchmarks/run.py`` itself, never here."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).parents[1] / "benchmarks"
# benchmark -> (result file stem, keys its report must hold)
REPORTS = {
    "overhead": ("overhead", {"entries", "target_ratio"}),
    "ddp": ("ddp", {"models", "targets"}),
    "scaling": ("scaling", {"models", "target_efficiency_conv_nets"}),
    "bandwidth": ("allreduce", {"sizes"}),
    "keras_throughput": ("keras", {"modes"}),
    "goyal": ("goyal", {"tuned_eta", "baselines", "large_batch"}),
    "sharding": ("sharding", {"models", "peak_rss_bytes", "targets"}),
}


@pytest.mark.parametrize("name", sorted(REPORTS))
def test_benchmark_smoke_run_writes_its_report_and_plot(name):
    done = subprocess.run([sys.executable, str(BENCHMARKS / "run.py"), "--smoke", "--only", name],
                          capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    folder = Path(done.stdout.strip().splitlines()[-1].removeprefix("results: "))
    stem, keys = REPORTS[name]
    report = json.loads((folder / f"{stem}.json").read_text())
    assert report["machine"]["torch"] and report["machine"]["cpus"] and report["settings"]
    assert keys <= set(report)
    assert (folder / f"{stem}.png").stat().st_size > 0
    assert "targets:" in done.stdout
    page = (folder / "README.md").read_text()  # benchmarks/README.md rendered from this run
    block = page.split(f"<!-- generated: {name} -->\n", 1)[1].split("<!-- end generated -->")[0]
    assert block.startswith("|") or block.split(":\n\n", 1)[1].startswith("|"), block


def test_the_benchmark_pages_match_the_committed_results():
    """The tables in benchmarks/README.md and the README's summary are generated from
    benchmarks/results/*.json; a hand edit or a result committed without regenerating
    them fails here."""
    done = subprocess.run([sys.executable, str(BENCHMARKS / "report.py"), "--check"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr
