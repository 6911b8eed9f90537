"""hvdtrain doctor (hvdtrain/jobs/doctor.py): a machine's check, with its two-rank smoke
run (hvdtrain/jobs/_smoke.py) under Gloo and MPI, each problem named with its fix."""

import subprocess
import sys
from pathlib import Path

from hvdtrain import horovod_patches
from hvdtrain.jobs.doctor import MPI_FIX, Report, check_versions


def test_doctor_names_a_missing_mpirun_and_its_fix(monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))
    report = Report()
    check_versions(report)
    assert "Open MPI (mpirun) is not on PATH" in report.problems
    assert MPI_FIX in capsys.readouterr().out


def test_doctor_is_green_on_this_machine():
    doctor = subprocess.run(
        [str(Path(sys.executable).with_name("hvdtrain")), "doctor"],
        capture_output=True, text=True, timeout=280,
    )
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    lines = doctor.stdout.splitlines()
    assert lines[-1].startswith("verdict: READY")
    for expected in ("Horovod", "torch", "TensorFlow", "Keras", "Open MPI", "mpi4py"):
        assert any(line.split()[:len(expected.split())] == expected.split()
                   for line in lines), expected
    smoke = {tuple(line.split()[:3]) for line in lines}
    for controller in ("gloo", "mpi"):
        for framework in ("PyTorch", "TensorFlow"):
            assert (controller, framework, "ok") in smoke, (controller, framework)
    for patch in horovod_patches.PATCHES:  # setup.sh installs the patched build
        assert f"  present  {patch.name}" in lines, patch.name
    assert "  GPU         none: a CPU-only build" in lines  # the pinned torch is the CPU one
    assert "warning" not in lines[-1]
