"""scripts/gpu-check.sh on a machine without a GPU (this one, and CI): its dry run shows
the Horovod build flags, skips every GPU step with the reason, and rehearses the
correctness checks on the CPU with the installed Horovod (2 ranks, Gloo)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(240)
ROOT = Path(__file__).parents[1]
CHECKS = ["build with NCCL", "build with host staging", "NCCL, 1 rank", "host-staged Gloo, 2 ranks",
          "NCCL, 2 ranks on one GPU", "DDP comparison"]
REHEARSED = ["equivalence, flat allreduce", "equivalence, per-tensor hooks", "NaN check",
             "bfloat16 allreduce", "join"]


def test_the_dry_run_skips_the_gpu_steps_saying_why_and_rehearses_the_checks(tmp_path):
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu-check.sh"), "--dry-run"], capture_output=True,
        text=True, timeout=200,
        env={**os.environ, "PYTHON": sys.executable, "HVDTRAIN_GPU_CHECK_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    flags = next(line for line in lines if line.startswith("gpu-check: build flags (host staging)"))
    assert "HOROVOD_WITH_PYTORCH=1" in flags and "HOROVOD_WITH_GLOO=1" in flags
    for check in CHECKS:
        assert any(line.startswith(f"gpu-check: SKIP {check}") and "dry run" in line
                   for line in lines), (check, done.stdout)
    for check in REHEARSED:
        assert any(line.startswith("gpu-check: PASS CPU, Gloo, 2 rank(s)") and check in line
                   for line in lines), (check, done.stdout)
    assert not [line for line in lines if "FAIL" in line], done.stdout


def test_an_unknown_option_is_refused_with_the_usage():
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu-check.sh"), "--gpu"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert "usage:" in done.stderr and "--dry-run" in done.stderr
