"""Failure behaviour, with faults injected into real 2-rank horovodrun jobs.

Every job must end (no hang), within 60 s, with a non-zero status, a message naming
the failed rank and what went wrong, and no process left behind.
"""

import io
import random
import subprocess
import sys
import time
import zipfile

import numpy as np
import pytest
from harness import WORKERS, launch, reports, single_process

from hvdtrain.jobs.launch import process_alive
from hvdtrain.runtime import RUNTIME_DEFAULTS
from hvdtrain.watchdog import EXIT_CODE

DEADLINE_SECONDS = 60


def run_fault(mode, controller, **env):
    """Run faults.py MODE (or, for modes "keras" and "numpy", keras_skip.py and
    numpy_skip.py) and check the job ended in time, non-zero, with no rank left behind."""
    started = time.monotonic()
    worker = (f"{mode}_skip.py",) if mode in ("keras", "numpy") else ("faults.py", mode)
    result = launch(*worker, controller=controller, timeout=120, env=env)
    elapsed = time.monotonic() - started
    assert not result.timed_out and result.returncode != 0
    assert elapsed < DEADLINE_SECONDS, f"{mode} under {controller} took {elapsed:.0f} s"
    pids = [r["pid"] for r in reports(result) if r.get("event") == "started"]
    assert len(pids) == 2
    time.sleep(1)  # the launcher reaps its children on its way out
    assert not [pid for pid in pids if process_alive(pid)], "a rank outlived the job"
    return result


def test_runtime_defaults_reach_the_ranks():
    result = run_fault("exception", "gloo")
    for report in reports(result):
        if report.get("event") == "started":
            assert report["stall_check"] == RUNTIME_DEFAULTS["HOROVOD_STALL_CHECK_TIME_SECONDS"]
            assert report["stall_shutdown"] == RUNTIME_DEFAULTS[
                "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"]


def test_an_exception_on_one_rank_ends_the_job_naming_that_rank(controller):
    result = run_fault("exception", controller)
    assert result.ranks[1].exit_code == 1
    assert "hvdtrain: rank 1 failed: ValueError: injected failure on rank 1 at step 3" \
        in result.ranks[1].output
    assert "hvdtrain: rank 0 stopped because another rank failed" in result.ranks[0].output


def test_a_killed_rank_ends_the_job_naming_that_rank(controller):
    result = run_fault("sigkill", controller)
    assert result.ranks[1].exit_code is None  # killed before it could record one
    if controller == "gloo":
        assert "Process name: 1" in result.launcher_output
        assert "Exit code: 137" in result.launcher_output
    else:
        assert "process rank 1" in result.launcher_output
        assert "signal 9" in result.launcher_output


def test_a_skipped_collective_is_reported_then_shut_down_under_mpi():
    result = run_fault("skip", "mpi", HOROVOD_STALL_CHECK_TIME_SECONDS="3",
                       HOROVOD_STALL_SHUTDOWN_TIME_SECONDS="8")
    rank0 = result.ranks[0].output
    assert "Missing ranks:" in rank0
    assert "1: [allreduce.hvdtrain.gradients.torch.float32]" in rank0
    assert "stalled for longer than 8 seconds. Will shutdown." in rank0


def test_a_skipped_collective_under_gloo_is_ended_by_the_watchdog():
    """Horovod's stall check never fires under Gloo; hvdtrain's watchdog does."""
    result = run_fault("skip", "gloo", HVDTRAIN_COLLECTIVE_TIMEOUT_SECONDS="6")
    assert result.ranks[0].exit_code is None  # the watchdog ends the process with os._exit
    assert f"Exit code: {EXIT_CODE}" in result.launcher_output
    assert ("hvdtrain: rank 0 of 2 waited 6 s (limit 6 s) for the gradient allreduce of "
            "step 3 (allreduce.weight, allreduce.bias); rank 1 did not complete it") \
        in result.ranks[0].output


def test_a_keras_rank_that_stops_joining_is_ended_by_the_watchdog_callback():
    result = run_fault("keras", "gloo", HVDTRAIN_COLLECTIVE_TIMEOUT_SECONDS="6")
    assert f"Exit code: {EXIT_CODE}" in result.launcher_output
    assert ("waited 6 s (limit 6 s) for the gradient allreduce of training step 3 "
            "(counting train-function calls from 0); rank 1 did not complete it") \
        in result.ranks[0].output


def test_a_numpy_rank_that_stops_joining_is_ended_by_the_watchdog():
    result = run_fault("numpy", "mpi", HVDTRAIN_COLLECTIVE_TIMEOUT_SECONDS="6")
    assert ("hvdtrain: rank 0 of 2 waited 6 s (limit 6 s) for the gradient Allreduce of "
            "step 3; rank 1 did not complete it") in result.ranks[0].output


def test_a_nonfinite_gradient_stops_every_rank_naming_the_step(controller):
    result = run_fault("nonfinite", controller)
    messages = {r["rank"]: r["message"] for r in reports(result) if r.get("event") == "nonfinite"}
    assert sorted(messages) == [0, 1]
    for message in messages.values():
        assert "NaN or Inf at optimizer step 3" in message
        assert "skip_nonfinite=True" in message


@pytest.mark.parametrize(("check", "details"), [
    ("optimizer class", ["'SGD' on rank 0", "'Adam' on rank 1"]),
    ("param groups", ["number of param groups is 1 on rank 0 but 2 on rank 1"]),
    ("batch size", ["batch_size_per_worker is 32 on rank 0 but 16 on rank 1"]),
    ("versions", ["hvdtrain is", "'0.0.0-other' on rank 1"]),
])
def test_ranks_that_start_differently_are_stopped_before_the_first_step(check, details):
    by_check = {}
    for report in reports(launch("disagree.py", controller="gloo", timeout=120).check()):
        by_check.setdefault(report["check"], {})[report["rank"]] = report["error"]
    for rank in (0, 1):
        error = by_check[check][rank]
        assert error is not None, (check, rank)
        for detail in details:
            assert detail in error


def killed_writer(command: list[str], seed: int, rounds: int):
    """Start ``command`` (a worker that saves checkpoints back to back and prints
    "saved N" after each) ``rounds`` times, killing it at a random moment, almost
    always in the middle of a write; yields the last step it confirmed each time."""
    rng = random.Random(seed)
    for _ in range(rounds):
        writer = subprocess.Popen([sys.executable, *command], stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, text=True)
        assert writer.stdout.readline().startswith("saved ")
        time.sleep(rng.uniform(0.0, 0.4))
        writer.kill()
        printed, _ = writer.communicate()
        yield int(([line for line in printed.splitlines() if line] or ["saved 1"])[-1]
                  .split()[1])


def test_sigkill_while_writing_checkpoints_never_loses_the_previous_one(tmp_path):
    """Rank 0 (here a single worker, no launcher) saves 8 MB checkpoints and is killed."""
    import torch

    for last_confirmed in killed_writer(
            [str(WORKERS / "checkpoint_single.py"), "loop", str(tmp_path)], 2026, 8):
        payload = torch.load(tmp_path / "ckpt.pt", weights_only=True)
        step = payload["extra"]["step"]
        assert step in (last_confirmed, last_confirmed + 1)
        assert all(bool((t == step).all()) for t in payload["model"].values())


def keras_file_weights(path) -> list:
    """Every array in a ``.keras`` file, read without Keras (a zip with model.weights.h5)."""
    import h5py

    values = []
    with zipfile.ZipFile(path) as archive, \
            h5py.File(io.BytesIO(archive.read("model.weights.h5"))) as weights:
        weights.visititems(lambda name, item: values.append(item[()])
                           if isinstance(item, h5py.Dataset) else None)
    return values


def test_sigkill_while_writing_keras_checkpoints_never_loses_the_previous_one(tmp_path):
    """The same for hvdtrain.adapters.keras.save_model (``.keras`` files of 8 MB); the
    file is read without Keras."""
    for last_confirmed in killed_writer(
            [str(WORKERS / "keras_checkpoint_single.py"), str(tmp_path)], 2027, 6):
        values = keras_file_weights(tmp_path / "ckpt.keras")
        steps = {float(v) for array in values for v in np.unique(array)}
        assert len(values) == 4 and len(steps) == 1, steps
        assert steps.pop() in (last_confirmed, last_confirmed + 1)


def test_bad_checkpoint_files_are_named_with_what_is_wrong(tmp_path):
    errors, stderr = single_process("checkpoint_single.py", "errors", str(tmp_path))
    expected = {"empty": "is empty (0 bytes)", "truncated": "is truncated or not a PyTorch file",
                "foreign": "not an hvdtrain checkpoint",
                "unsafe": "not unpickled (weights_only=True)", "missing": "does not exist"}
    for name, what in expected.items():
        assert str(tmp_path / f"{name}.pt") in errors[name] and what in errors[name], name
    assert "running as a single worker" in stderr  # no launcher: a one-line notice
