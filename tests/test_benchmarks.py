"""Benchmarks are not tests: CI runs their smoke versions (tiny settings) so that they keep
working, and checks that each writes its report and plot. Targets are judged by
``benchmarks/run.py`` itself, never here."""

import doctest
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import ssh_hosts
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
    "allocator": ("allocator", {"contenders", "target_step_ratio"}),
    "bfloat16": ("bfloat16", {"sizes", "training"}),
    "network": ("network", {"collectives", "fits", "training", "model_check", "projection"}),
}
# Needs hosts with sshd in network namespaces (root): a cluster test.
CLUSTER_BENCHMARKS = {"network"}


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.cluster)
                                  if name in CLUSTER_BENCHMARKS else name
                                  for name in sorted(REPORTS)])
def test_benchmark_smoke_run_writes_its_report_and_plot(name):
    if name in CLUSTER_BENCHMARKS:
        reason = ssh_hosts.why_unavailable()
        if reason:
            pytest.skip(reason)
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
        for table in (report, report["bn"]):  # seeds side by side (k=4) and one by one (k=32)
            assert [row["gradual"]["seeds"] for row in table["large_batch"].values()] == \
                [[1, 2], [1, 2]]
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


def _goyal_worker():
    spec = importlib.util.spec_from_file_location("goyal_worker", BENCHMARKS / "goyal_worker.py")
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    return worker


@pytest.mark.parametrize("bn_group", [None, 4])
def test_goyal_seeds_side_by_side_train_as_nets_made_alone(bn_group):
    """goyal_worker's make_model with 3 seeds is 3 nets, each as a lone net made after
    its seed (conv, [BN], ReLU, conv, [BN], ReLU, linear) would be: the same initial
    values, outputs, per-copy losses and gradients, each copy reading its own inputs."""
    worker = _goyal_worker()
    seeds = (4, 5, 6)
    stacked = worker.make_model(seeds, torch.float64, bn_group)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(8, 3, 40, generator=generator, dtype=torch.float64)
    y = torch.randint(0, 10, (8, 3), generator=generator)
    worker.copy_losses(stacked(x), y).sum().backward()
    first, second, classifier = (layer for layer in stacked
                                 if isinstance(layer, torch.nn.Conv1d))
    for i, seed in enumerate(seeds):
        torch.manual_seed(seed)
        alone = [torch.nn.Conv1d(1, 16, 5, stride=2, padding=2), torch.nn.Conv1d(
            16, 16, 3, stride=2, padding=1), torch.nn.Linear(160, 10)]
        norms = [worker.GroupBatchNorm1d(16, bn_group) if bn_group else torch.nn.Identity()
                 for _ in range(2)]
        net = torch.nn.Sequential(alone[0], norms[0], torch.nn.ReLU(), alone[1], norms[1],
                                  torch.nn.ReLU(), torch.nn.Flatten(), alone[2]).double()
        logits = net(x[:, i:i + 1])
        torch.nn.functional.cross_entropy(logits, y[:, i]).backward()
        assert torch.allclose(stacked(x)[:, i], logits, atol=1e-12), seed
        for layer, lone in zip((first, second, classifier), alone, strict=True):
            rows = slice(i * lone.weight.shape[0], (i + 1) * lone.weight.shape[0])
            for name in ("weight", "bias"):
                mine, theirs = getattr(layer, name), getattr(lone, name)
                assert torch.equal(mine[rows].detach().reshape(theirs.shape),
                                   theirs.detach()), (seed, name)  # before any step
                assert torch.allclose(mine.grad[rows].reshape(theirs.shape), theirs.grad,
                                      atol=1e-12), (seed, name)


def test_group_batch_norm_is_each_workers_batch_norm_on_its_own():
    """benchmarks/goyal_worker.py's GroupBatchNorm1d on 3 groups of 4 examples equals 3
    separate BatchNorm1d layers, one per group (an emulated worker's batch): the output,
    the gradients of the input and of the shared affine parameters (summed), and the
    running statistics (averaged)."""
    worker = _goyal_worker()
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


def _benchmark_module(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_ring_model_is_fitted_back_from_times_it_made():
    """Times of the three collectives on 2 and 4 workers, made by the closed form with a
    known alpha and beta and perturbed by up to 5 %: the fit finds them again within
    5 %, and its doctest (a 1 Gbit/s ring) holds."""
    ring = _benchmark_module("ring_model")
    alpha, beta = 3e-4, 8 / 1e9  # 0.3 ms a message, 1 Gbit/s
    points = []
    for index, (operation, workers, nbytes) in enumerate(
            (op, n, 2**k) for op in ring.OPERATIONS for n in (2, 4) for k in range(14, 25, 2)):
        messages, moved = ring.ring_terms(operation, workers, nbytes)
        wobble = 1 + 0.05 * ((-1) ** index) * (index % 3) / 2
        points.append((operation, workers, nbytes, (messages * alpha + moved * beta) * wobble))
    fitted = ring.fit_ring(points)
    assert fitted.alpha_s == pytest.approx(alpha, rel=0.05)
    assert fitted.beta_s_per_byte == pytest.approx(beta, rel=0.05)
    assert doctest.testmod(ring).failed == 0


def test_the_step_model_hides_communication_behind_backward_only_with_overlap():
    ring = _benchmark_module("ring_model")
    links = ring.RingLinks(alpha_s=1e-4, beta_s_per_byte=8e-9)
    step = ring.StepModel(compute_s=0.3, gradient_bytes=10_000_000)
    communication = 2 * 1e-4 + 10_000_000 * 8e-9  # 2 workers: 2 messages, n bytes each way
    assert step.step_s(links, 2) == pytest.approx(0.3 + communication)
    assert step.step_s(links, 2, overlap=True) == pytest.approx(0.3)  # 0.08 s < 0.2 s hidden
    assert step.efficiency(links, 1) == 1.0
    efficiencies = [step.efficiency(links, n) for n in (2, 8, 64, 256)]
    assert efficiencies == sorted(efficiencies, reverse=True)
    assert step.communication_s(links, 8, compressed=True) < step.communication_s(links, 8)
    with pytest.raises(ValueError, match="operation must be one of"):
        ring.ring_terms("broadcast", 2, 10)
