"""Benchmarks are not tests: CI runs their smoke versions (tiny settings) so that they keep
working, and checks that each writes its report and plot. Targets are judged by
``benchmarks/run.py`` itself, never here."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

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
    if name == "goyal":  # accumulation is exact for both models, BN per worker included
        checks = report["accumulation_check"]
        assert [bool(check["bn_group"]) for check in checks] == [False, True]
        assert all(check["max_abs_parameter_difference"]["float64"] <= 1e-12 for check in checks)
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


def test_group_batch_norm_is_each_workers_batch_norm_on_its_own():
    """benchmarks/goyal_worker.py's GroupBatchNorm1d on 3 groups of 4 examples equals 3
    separate BatchNorm1d layers, one per group (an emulated worker's batch): the output,
    the gradients of the input and of the shared affine parameters (summed), and the
    running statistics (averaged)."""
    spec = importlib.util.spec_from_file_location("goyal_worker", BENCHMARKS / "goyal_worker.py")
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    generator = torch.Generator().manual_seed(3)
    grouped = worker.GroupBatchNorm1d(5, group=4).double()
    with torch.no_grad():
        grouped.weight.copy_(torch.rand(5, generator=generator, dtype=torch.float64) + 0.5)
        grouped.bias.copy_(torch.rand(5, generator=generator, dtype=torch.float64) - 0.5)
    separate = [torch.nn.BatchNorm1d(5).double() for _ in range(3)]
    for layer in separate:
        layer.load_state_dict(grouped.state_dict())
    x = torch.randn(12, 5, 7, generator=generator, dtype=torch.float64)
    scale = torch.randn(12, 5, 7, generator=generator, dtype=torch.float64)
    x_grouped, x_apart = x.clone().requires_grad_(), x.clone().requires_grad_()
    out_grouped = grouped(x_grouped)
    out_apart = torch.cat([layer(x_apart[4 * i:4 * i + 4]) for i, layer in enumerate(separate)])
    (out_grouped * scale).sum().backward()
    (out_apart * scale).sum().backward()
    assert torch.allclose(out_grouped, out_apart, atol=1e-12)
    assert torch.allclose(x_grouped.grad, x_apart.grad, atol=1e-12)
    for name in ("weight", "bias"):
        summed = sum(getattr(layer, name).grad for layer in separate)
        assert torch.allclose(getattr(grouped, name).grad, summed, atol=1e-12), name
    for name in ("running_mean", "running_var"):
        averaged = sum(getattr(layer, name) for layer in separate) / 3
        assert torch.allclose(getattr(grouped, name), averaged, atol=1e-12), name
    assert not torch.allclose(out_grouped, torch.nn.functional.batch_norm(  # groups matter
        x, None, None, grouped.weight, grouped.bias, training=True), atol=1e-3)
