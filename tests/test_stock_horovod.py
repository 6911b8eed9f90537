"""hvdtrain on a stock Horovod: the same 0.28.1 source built with the build fixes only,
none of hvdtrain's patches and no marker (``scripts/build-horovod.sh --stock``, cached
like the patched wheel; ``make stock-horovod`` builds it). The wheel is unpacked into a
folder put first on every rank's PYTHONPATH, so the launcher and the workers import it
instead of the patched Horovod in .venv.

On it, hvdtrain must train exactly as on the patched build (against one process on the
concatenated batch), print the missing-patches notice once per host, choose Horovod's
own cycle time (no idle wait to pair the 0.1 ms cycle with), refuse ``JoinAtEpochEnd``
and a second ``join()`` on TensorFlow with a message saying why and how to fix it
(instead of hanging), and ``hvdtrain doctor`` must list every patch as missing.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from harness import Run, launch, max_difference
from workers.keras_common import make_model as make_keras_model
from workers.keras_common import reference_fit, use_floatx
from workers.torch_common import JOIN_STEPS, make_model, reference_run, uneven_reference_run

from hvdtrain import horovod_patches, runtime
from hvdtrain.jobs.launch import CONTROLLERS

REPO = Path(__file__).parents[1]
FLOAT64_TOLERANCE = 1e-10
NOTICE = "hvdtrain: this Horovod was built without hvdtrain's patches"
TORCH_SCENARIOS = ("runtime_defaults", "sgd", "adam_accumulate", "sgd_overlap", "join_uneven",
                   "skip_nonfinite", "sgd_float32", "sgd_bf16", "sgd_bfloat16")
KERAS_SCENARIOS = ("sgd", "join_uneven", "join_twice", "sgd_float32", "sgd_bf16", "sgd_bfloat16")
BF16_UNIT = 2.0**-8


def stock_wheel() -> Path | None:
    """The cached stock wheel for this interpreter's frameworks, or None."""
    env = {**os.environ, "PYTHON": sys.executable,
           "HVDTRAIN_HOROVOD_FRAMEWORKS": "pytorch tensorflow"}
    key = subprocess.run(["bash", str(REPO / "scripts" / "build-horovod.sh"), "--stock",
                          "--cache-key"], env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout.strip()
    cache = Path(os.environ.get("HVDTRAIN_CACHE", Path.home() / ".cache" / "hvdtrain"))
    return next((cache / "wheels" / key).glob("horovod-*.whl"), None)


@pytest.fixture(scope="session")
def stock_env(tmp_path_factory) -> dict[str, str]:
    """The environment that makes the launcher and every rank import the stock Horovod."""
    wheel = stock_wheel()
    if wheel is None:
        pytest.skip("no stock Horovod wheel in the cache: build it once with "
                    "`make stock-horovod` (about 8 minutes on 2 cores)")
    folder = tmp_path_factory.mktemp("stock-horovod")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(folder)
    return {"PYTHONPATH": f"{folder}{os.pathsep}{os.environ.get('PYTHONPATH', '')}".rstrip(
        os.pathsep)}


def _run(tmp_path_factory, env, script, controller, scenarios, **extra) -> Run:
    out_dir = tmp_path_factory.mktemp(f"stock-{script}-{controller}")
    # The ranks inherit this process's environment: what init() would choose must not
    # already be there (another test may have applied hvdtrain's defaults in-process).
    chosen = {**runtime.IDLE_WAIT_DEFAULTS, **runtime.CPU_ONLY_DEFAULTS}
    saved = {name: os.environ.pop(name) for name in chosen if name in os.environ}
    try:
        result = launch(script, str(out_dir), controller=controller,
                        env={**env, "HVDTRAIN_TEST_SCENARIOS": ",".join(scenarios), **extra})
    finally:
        os.environ.update(saved)
    return Run(result, out_dir)


@pytest.fixture(scope="module", params=CONTROLLERS)
def stock_torch_run(request, tmp_path_factory, stock_env) -> Run:
    return _run(tmp_path_factory, stock_env, "torch_adapter.py", request.param,
                TORCH_SCENARIOS)


@pytest.fixture(scope="module")
def stock_keras_run(tmp_path_factory, stock_env) -> Run:
    """Keras under Gloo only: the torch launches above cover both controllers on the stock
    build, and what Keras adds there (the refused joins) does not depend on one."""
    return _run(tmp_path_factory, stock_env, "keras_adapter.py", "gloo", KERAS_SCENARIOS,
                KERAS_BACKEND="tensorflow")


def _parameters(run: Run, name: str, rank: int) -> dict[str, torch.Tensor]:
    return torch.load(run.out_dir / f"{name}-rank{rank}.pt")


def _torch_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max((a[name].double() - b[name].double()).abs().max().item() for name in b)


def test_the_ranks_import_the_stock_build_and_init_chooses_its_defaults(stock_torch_run,
                                                                        stock_env):
    """No marker, so every patch is missing; without the idle wait neither it nor the
    0.1 ms cycle is set (Horovod's 1 ms stays)."""
    stock_folder = stock_env["PYTHONPATH"].split(os.pathsep)[0]
    for report in stock_torch_run.both("runtime_defaults"):
        assert report["patches"] == []
        assert report["horovod"].startswith(stock_folder)
        assert report["HOROVOD_CYCLE_TIME"] is None
        assert report["HVDTRAIN_IDLE_WAIT_MS"] is None


@pytest.mark.parametrize(("name", "kind", "passes"), [
    ("sgd", "sgd", 1), ("adam_accumulate", "adam", 2), ("sgd_overlap", "sgd", 1)])
def test_torch_trains_like_one_process_on_stock_horovod(stock_torch_run, name, kind, passes):
    """The flat allreduce, accumulation and Horovod's per-tensor hooks (``overlap``, which
    waits in Horovod's unpatched, spinning synchronize)."""
    reference = reference_run(kind, passes=passes)
    for rank in (0, 1):
        assert _torch_difference(_parameters(stock_torch_run, name, rank), reference) \
            <= FLOAT64_TOLERANCE


def test_torch_join_and_the_nonfinite_check_work_on_stock_horovod(stock_torch_run):
    reference = uneven_reference_run()
    for rank, report in enumerate(stock_torch_run.both("join_uneven")):
        assert report["steps"] == JOIN_STEPS[rank]
        assert _torch_difference(_parameters(stock_torch_run, "join_uneven", rank),
                                 reference) <= FLOAT64_TOLERANCE
    rank0, rank1 = stock_torch_run.both("skip_nonfinite")
    assert rank0["skipped"] == rank1["skipped"] == 1


def test_the_missing_patches_are_announced_once_in_one_line(stock_torch_run):
    # sgd_bfloat16 is refused there (test_bfloat16_parameters_are_refused_naming_patch_0011)
    stock_torch_run.require_clean(expected_failures=("sgd_bfloat16",))
    lines = [line for rank in stock_torch_run.result.ranks for line in rank.output.splitlines()
             if NOTICE in line]
    assert len(lines) == 1, lines
    for patch in horovod_patches.PATCHES:
        assert patch.name in lines[0]
    assert horovod_patches.BUILD_COMMAND in lines[0]


def test_keras_fit_trains_like_one_process_on_stock_horovod(stock_keras_run):
    reference = reference_fit("sgd", 1)
    for rank in (0, 1):
        assert max_difference(stock_keras_run.arrays("sgd", rank), reference) \
            <= FLOAT64_TOLERANCE


@pytest.mark.parametrize(("scenario", "what"), [
    ("join_uneven", "JoinAtEpochEnd on Keras's TensorFlow backend needs"),
    ("join_twice", "A second join() in one process on Keras's TensorFlow backend needs"),
])
def test_tensorflow_join_is_refused_with_the_reason_and_the_fix(stock_keras_run, scenario,
                                                                 what):
    """Without patch 0005 a rank's second join on TensorFlow returns at once and the job
    hangs; on the stock build hvdtrain refuses instead, on every rank, and the launch
    goes on to its next scenario and ends."""
    failures = stock_keras_run.failures.get(scenario, {})
    assert set(failures) == {0, 1}, stock_keras_run.result.report()[-4000:]
    for trace in failures.values():
        message = trace.strip().splitlines()[-1]
        assert message.startswith(f"RuntimeError: {what} hvdtrain's Horovod patch "
                                  f"{horovod_patches.STATEFUL_JOIN}"), message
        assert "the job would hang" in message
        assert horovod_patches.BUILD_COMMAND in message
    assert stock_keras_run.result.ok, stock_keras_run.result.report()[-4000:]


def test_bf16_compression_goes_through_the_allgather_on_stock_horovod(stock_torch_run,
                                                                      stock_keras_run):
    """Without patch 0011, compression="bf16" sends bfloat16 through Horovod's allgather
    (per tensor on torch, so its optimizer overlaps) and stays within 2u of the distance
    the float32 run travelled, as the native path does (measured: 0.47u and 0.41u)."""
    assert stock_torch_run.report("sgd_bf16")["overlap"] is True
    exact = _parameters(stock_torch_run, "sgd_float32", 0)
    initial = {k: v.detach() for k, v in make_model(dtype=torch.float32).named_parameters()}
    travelled = _torch_difference(exact, initial)
    for rank in (0, 1):
        difference = _torch_difference(_parameters(stock_torch_run, "sgd_bf16", rank), exact)
        assert 0 < difference <= 2 * BF16_UNIT * travelled
    exact = stock_keras_run.arrays("sgd_float32")
    use_floatx("float32")
    travelled = max_difference(exact, make_keras_model().get_weights())
    difference = max_difference(stock_keras_run.arrays("sgd_bf16"), exact)
    assert 0 < difference <= 2 * BF16_UNIT * travelled


@pytest.mark.parametrize(("framework", "what"), [
    ("torch", "A DistributedOptimizer over bfloat16 parameters needs"),
    ("keras", "Averaging bfloat16 gradients (of bfloat16 variables) needs"),
])
def test_bfloat16_parameters_are_refused_naming_patch_0011(stock_torch_run, stock_keras_run,
                                                           framework, what):
    """Horovod 0.28.1 cannot reduce bfloat16: hvdtrain says so on every rank, naming the
    patch and the build command, instead of Horovod's "Invalid tensor type"."""
    run = stock_torch_run if framework == "torch" else stock_keras_run
    failures = run.failures.get("sgd_bfloat16", {})
    assert set(failures) == {0, 1}, run.result.report()[-4000:]
    for trace in failures.values():
        message = trace.strip().splitlines()[-1]
        assert message.startswith(f"RuntimeError: {what} hvdtrain's Horovod patch "
                                  f"{horovod_patches.BFLOAT16}"), message
        assert horovod_patches.BUILD_COMMAND in message


def test_doctor_lists_every_patch_as_missing(stock_env):
    script = ("from hvdtrain.jobs.doctor import Report, check_horovod_patches\n"
              "report = Report()\ncheck_horovod_patches(report)\n"
              "print('warnings', len(report.warnings), 'problems', len(report.problems))\n")
    done = subprocess.run([sys.executable, "-c", script], env={**os.environ, **stock_env},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    for patch in horovod_patches.PATCHES:
        assert f"MISSING  {patch.name}: without it, {patch.without}" in done.stdout
    assert "warnings 1 problems 0" in done.stdout
    assert horovod_patches.BUILD_COMMAND in done.stdout
