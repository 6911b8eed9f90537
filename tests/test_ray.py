"""hvdtrain jobs on a local Ray cluster started here (no network), through
hvdtrain.jobs.ray.run and Horovod's RayExecutor: 2 workers over Gloo.

Training is compared with one process on the concatenated batch, as the horovodrun
tests do (tests/workers/ray_jobs.py runs the same training as their workers); failures
must end the job naming the rank, and in the times docs/failures.md gives.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

ray = pytest.importorskip("ray", reason="the ray extra is not installed (scripts/setup.sh "
                                        "installs it)")

import hvdtrain.jobs.ray  # noqa: E402
from hvdtrain.jobs.launch import LaunchError  # noqa: E402

TESTS = Path(__file__).parent
WORKERS = 2
CPUS = 3


@pytest.fixture(scope="module")
def cluster():
    """A local Ray cluster of 3 CPUs (2 workers and the room to start them)."""
    path = os.pathsep.join([str(TESTS / "workers"), str(TESTS.parent)])
    ray.init(address="local", num_cpus=CPUS, include_dashboard=False, log_to_driver=True,
             runtime_env={"env_vars": {"PYTHONPATH": path, "KERAS_BACKEND": "tensorflow",
                                       "OMP_NUM_THREADS": "1",
                                       "TF_CPP_MIN_LOG_LEVEL": "2"}})
    yield
    ray.shutdown()


def _ray_jobs():
    """tests/workers/ray_jobs.py, imported as the workers import it (a top-level module:
    Ray ships its functions by name)."""
    if str(TESTS / "workers") not in sys.path:
        sys.path.insert(0, str(TESTS / "workers"))
    import ray_jobs
    return ray_jobs


@pytest.mark.timeout(240)
def test_torch_training_on_ray_equals_one_process(cluster):
    from workers.torch_common import reference_run

    jobs = _ray_jobs()
    results = hvdtrain.jobs.ray.run(jobs.torch_train, num_workers=WORKERS, args=["adamw"],
                               timeout_s=180)
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["size"] == WORKERS for r in results)
    assert results[0]["pid"] != results[1]["pid"]
    expected = reference_run("adamw")
    for result in results:
        for name, value in result["parameters"].items():
            difference = (torch.tensor(value, dtype=torch.float64) - expected[name]).abs().max()
            assert difference <= 1e-10, (result["rank"], name, float(difference))
    assert results[0]["lrs"] == results[1]["lrs"]


@pytest.mark.timeout(240)
def test_keras_training_on_ray_equals_one_process(cluster):
    from workers.keras_common import reference_fit

    jobs = _ray_jobs()
    results = hvdtrain.jobs.ray.run(jobs.keras_fit, num_workers=WORKERS, args=["sgd"],
                               timeout_s=180)
    expected = reference_fit("sgd")
    for result in results:
        for mine, theirs in zip(result["weights"], expected, strict=True):
            assert np.abs(np.asarray(mine) - theirs).max() <= 1e-10, result["rank"]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("how, process_died, expected, within_s", [
    ("raise", False, "rank 1 of 2 failed: ValueError: rank 1 found a corrupt shard", 60),
    ("kill", True, "rank 1 of 2 died", 60),
])
def test_a_failing_worker_ends_the_job_naming_its_rank(cluster, how, process_died, expected,
                                                       within_s):
    jobs = _ray_jobs()
    started = time.monotonic()
    with pytest.raises(hvdtrain.jobs.ray.RankFailed) as failure:
        hvdtrain.jobs.ray.run(jobs.fail, num_workers=WORKERS, args=[how], timeout_s=120)
    assert failure.value.rank == 1
    assert expected in str(failure.value)
    assert time.monotonic() - started < within_s
    _no_worker_left()


@pytest.mark.timeout(240)
def test_a_stalled_collective_ends_the_job_with_the_watchdogs_report(cluster):
    jobs = _ray_jobs()
    started = time.monotonic()
    with pytest.raises(hvdtrain.jobs.ray.RankFailed) as failure:
        hvdtrain.jobs.ray.run(jobs.fail, num_workers=WORKERS, args=["skip"], timeout_s=120,
                         env={"HVDTRAIN_COLLECTIVE_TIMEOUT_SECONDS": "4"})
    message = str(failure.value)
    assert failure.value.rank == 0
    assert "rank 0 of 2 was ended by the collective watchdog" in message
    assert "rank 1 did not complete it" in message
    assert time.monotonic() - started < 60
    _no_worker_left()


@pytest.mark.timeout(120)
def test_a_job_past_its_timeout_is_stopped(cluster):
    jobs = _ray_jobs()
    with pytest.raises(LaunchError, match="did not finish within 3 s"):
        hvdtrain.jobs.ray.run(jobs.fail, num_workers=WORKERS, args=["none"], timeout_s=3)
    _no_worker_left()


def test_bad_arguments_are_refused_before_anything_starts(cluster):
    with pytest.raises(ValueError, match="either num_workers"):
        hvdtrain.jobs.ray.run(print)
    with pytest.raises(ValueError, match="num_workers"):
        hvdtrain.jobs.ray.run(print, num_workers=0)
    with pytest.raises(ValueError, match="max_workers=1 is below min_workers=2"):
        hvdtrain.jobs.ray.run(print, min_workers=2, max_workers=1)


def _no_worker_left(within_s: float = 20) -> None:
    """Every worker of the job is gone: the cluster's CPUs are all free again."""
    deadline = time.monotonic() + within_s
    while ray.available_resources().get("CPU", 0) < CPUS and time.monotonic() < deadline:
        time.sleep(0.5)
    assert ray.available_resources().get("CPU", 0) == CPUS, ray.available_resources()


@pytest.mark.timeout(300)
def test_the_ray_example_reaches_the_state_horovodrun_reaches(tmp_path):
    """`python examples/ray_train.py` (its own local Ray) trains 2 epochs and resumes to
    3 from its checkpoint, to the very state `horovodrun -np 2 --gloo` reaches with
    examples/torch_train.py in one go: the same script, data shares and collectives."""
    from test_examples import CHECKSUM_LINE

    from hvdtrain.jobs.launch import run_workers

    # One thread per worker, as the example gives each Ray worker (one CPU): torch's
    # sums over 2 threads round differently.
    plain = run_workers(TESTS.parent / "examples" / "torch_train.py",
                        ["--epochs", "3", "--checkpoint", str(tmp_path / "horovodrun.pt")],
                        np=2, controller="gloo", timeout=180,
                        env={"OMP_NUM_THREADS": "1"}).check()
    expected = CHECKSUM_LINE.search(plain.ranks[0].output)[1]
    checkpoint = tmp_path / "ray" / "run.pt"
    env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}

    def ray_train(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, str(TESTS.parent / "examples" / "ray_train.py"), "--workers", "2",
             "--checkpoint", str(checkpoint), "--", *args],
            capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done.stdout + done.stderr

    ray_train("--epochs", "2")
    output = ray_train("--epochs", "3", "--resume")
    assert "resuming after epoch 2" in output and "replicas identical" in output, output
    assert CHECKSUM_LINE.search(output)[1] == expected
