"""``hvdtrain doctor``: is this machine ready for hvdtrain, and if not, what to do.

It prints the versions of the stack, what the installed Horovod was built with,
runs a 2-process allreduce under each controller (Gloo and MPI), and ends with a
one-line verdict. Every problem comes with the command that fixes it; the exit
status is 0 only when there is none.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import platform
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import hvdtrain
from hvdtrain import horovod_patches
from hvdtrain.jobs.launch import CONTROLLERS, LaunchError, run_workers

SETUP_FIX = "run `bash scripts/setup.sh` from the hvdtrain checkout (or `make setup`)"
REBUILD_FIX = (
    "if torch, TensorFlow or Open MPI changed since Horovod was built, rebuild it: remove "
    "~/.cache/hvdtrain/wheels (or $HVDTRAIN_CACHE/wheels) and run `bash scripts/setup.sh`"
)
MPI_FIX = "install Open MPI: `apt-get install -y openmpi-bin libopenmpi-dev` (as root)"

# framework label -> (distributions that provide it, Horovod module built for it)
FRAMEWORKS = {
    "PyTorch": (("torch",), "horovod.torch"),
    "TensorFlow": (("tensorflow-cpu", "tensorflow"), "horovod.tensorflow"),
}
_SMOKE_NAMES = {"PyTorch": "torch", "TensorFlow": "tensorflow"}
# Horovod's `<name>_built()` functions -> how people write the name
_TENSOR_OPERATIONS = {"mpi": "MPI", "gloo": "Gloo", "nccl": "NCCL", "ccl": "CCL", "ddl": "DDL"}
_CONTROLLERS = {"mpi": "MPI", "gloo": "Gloo"}


@dataclass
class Report:
    """What the doctor found: lines to print, problems (each with its fix) and warnings
    (what works, but less well than it could)."""

    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def line(self, text: str = "") -> None:
        print(text, flush=True)

    def problem(self, what: str, fix: str) -> None:
        self.problems.append(what)
        print(f"  PROBLEM: {what}\n    fix: {fix}", flush=True)

    def warning(self, what: str, fix: str) -> None:
        self.warnings.append(what)
        print(f"  WARNING: {what}\n    fix: {fix}", flush=True)


def distribution_version(*names: str) -> str | None:
    """The installed version of the first of ``names`` that is installed, else None."""
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def open_mpi_version() -> str | None:
    """Open MPI's version as ``mpirun --version`` reports it, or None without mpirun."""
    if shutil.which("mpirun") is None:
        return None
    out = subprocess.run(["mpirun", "--version"], capture_output=True, text=True).stdout
    match = re.search(r"Open MPI\)?\s+([\d.]+)", out)
    return match.group(1) if match else out.splitlines()[0] if out else "unknown"


def check_versions(report: Report) -> None:
    report.line("versions")
    versions = {
        "Python": platform.python_version(),
        "hvdtrain": hvdtrain.__version__,
        "Horovod": distribution_version("horovod"),
        "torch": distribution_version("torch"),
        "TensorFlow": distribution_version("tensorflow-cpu", "tensorflow"),
        "Keras": distribution_version("keras"),
        "Open MPI": open_mpi_version(),
        "mpi4py": distribution_version("mpi4py"),
    }
    for name, version in versions.items():
        report.line(f"  {name:<11} {version or 'not installed'}")
    if versions["Horovod"] is None:
        report.problem("Horovod is not installed", SETUP_FIX)
    if versions["Open MPI"] is None:
        report.problem("Open MPI (mpirun) is not on PATH", MPI_FIX)
    if versions["mpi4py"] is None:
        report.warning("mpi4py is not installed: the NumPy adapter (hvdtrain.adapters.numpy) "
                       "needs it; torch and Keras do not",
                       f"`{sys.executable} -m pip install mpi4py` (it builds against the MPI of "
                       "`mpicc` on PATH)")
    if versions["torch"] is None and versions["TensorFlow"] is None:
        report.problem("neither torch nor TensorFlow is installed", SETUP_FIX)


def check_horovod_build(report: Report) -> list[str]:
    """Report what Horovod was built with; return the frameworks it works with."""
    report.line("Horovod build")
    working, build_module = [], None
    for label, (distributions, module_name) in FRAMEWORKS.items():
        if distribution_version(*distributions) is None:
            report.line(f"  {label:<11} framework not installed (its adapter is unavailable)")
            continue
        try:
            module = importlib.import_module(module_name)
        except Exception as error:  # a broken extension raises ImportError or worse
            report.line(f"  {label:<11} NOT usable: {type(error).__name__}: {error}")
            report.problem(f"Horovod's {label} extension does not load", REBUILD_FIX)
            continue
        report.line(f"  {label:<11} built")
        working.append(label)
        build_module = build_module or module
    if build_module is None:
        return working
    def built(names: dict[str, str]) -> list[str]:
        return [label for name, label in names.items() if getattr(build_module, f"{name}_built")()]

    controllers = built(_CONTROLLERS)
    report.line(f"  controllers {', '.join(controllers) or 'none'}")
    report.line(f"  tensor ops  {', '.join(built(_TENSOR_OPERATIONS)) or 'none'}")
    gpu = gpu_build_line(build_module.cuda_built(), build_module.nccl_built(), visible_gpus())
    report.line(f"  GPU         {gpu}")
    for label in _CONTROLLERS.values():
        if label not in controllers:
            report.problem(f"Horovod was built without the {label} controller", SETUP_FIX)
    return working


def visible_gpus() -> int:
    """How many NVIDIA GPUs ``nvidia-smi -L`` lists here (0 without nvidia-smi)."""
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                                timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(line.startswith("GPU ") for line in listed.stdout.splitlines())


def gpu_build_line(cuda: bool, nccl: bool, gpus: int) -> str:
    """What the installed Horovod's GPU support is, and whether this machine can use it.

    >>> gpu_build_line(cuda=True, nccl=True, gpus=0).split(";")[0]
    'CUDA and NCCL built in'
    >>> gpu_build_line(cuda=False, nccl=False, gpus=0)
    'none: a CPU-only build'
    """
    if not cuda:
        return "none: a CPU-only build" + (
            f", although {gpus} GPU(s) are visible (rebuild with a CUDA build of torch: "
            "scripts/build-horovod.sh --install)" if gpus else "")
    built = "CUDA and NCCL" if nccl else "CUDA without NCCL (GPU tensors go through host memory)"
    if gpus:
        return f"{built} built in; {gpus} GPU(s) visible"
    return (f"{built} built in; no GPU visible here, so they are untested on this machine "
            "(scripts/gpu-check.sh tests them on a GPU machine; CPU training is unaffected)")


def check_horovod_patches(report: Report) -> None:
    """List each of hvdtrain's patches as present or missing, with what a missing one
    costs (:mod:`hvdtrain.horovod_patches`)."""
    report.line("hvdtrain's patches to Horovod")
    if distribution_version("horovod") is None:
        report.line("  skipped: Horovod is not installed")
        return
    present = horovod_patches.installed()
    for patch in horovod_patches.PATCHES:
        if patch.name in present:
            report.line(f"  present  {patch.name}")
        else:
            report.line(f"  MISSING  {patch.name}: without it, {patch.without}")
    missing = horovod_patches.missing_patches(present)
    if missing:
        report.warning(
            f"Horovod lacks {len(missing)} of hvdtrain's {len(horovod_patches.PATCHES)} "
            "patches (training is correct; see the costs above)",
            f"build and install the patched Horovod: `{horovod_patches.BUILD_COMMAND}` from "
            "the hvdtrain checkout (no root needed)")


def check_allreduce(report: Report, frameworks: list[str], timeout: float) -> None:
    report.line("smoke check: 2-process allreduce under horovodrun")
    if not frameworks:
        report.line("  skipped: no framework with a working Horovod extension")
        return
    smoke_script = Path(__file__).with_name("_smoke.py")
    for controller in CONTROLLERS:
        for label in frameworks:
            started = time.monotonic()
            try:
                result = run_workers(smoke_script, [_SMOKE_NAMES[label]], np=2,
                                     controller=controller, timeout=timeout)
            except LaunchError as error:
                report.problem(f"cannot launch horovodrun: {error}", SETUP_FIX)
                return
            seconds = time.monotonic() - started
            where = f"  {controller:<5} {label:<11}"
            if result.ok:
                report.line(f"{where} ok ({seconds:.1f} s)")
                continue
            report.line(f"{where} FAILED ({seconds:.1f} s)")
            report.line("    " + result.report().replace("\n", "\n    "))
            reason = "timed out" if result.timed_out else "failed"
            fix = MPI_FIX if controller == "mpi" and open_mpi_version() is None else REBUILD_FIX
            report.problem(f"the 2-process {label} allreduce over {controller} {reason}", fix)


def run_doctor(timeout: float = 120.0) -> int:
    """Run every check, print the report, return the exit status (0: all good)."""
    report = Report()
    report.line(f"hvdtrain doctor ({sys.executable})")
    check_versions(report)
    frameworks = check_horovod_build(report)
    check_horovod_patches(report)
    check_allreduce(report, frameworks, timeout)
    if report.problems:
        report.line(f"verdict: NOT READY - {len(report.problems)} problem(s): "
                    + "; ".join(report.problems))
        return 1
    report.line(f"verdict: READY - Horovod works with {' and '.join(frameworks)} "
                f"over {' and '.join(_CONTROLLERS[c] for c in CONTROLLERS)}"
                + "".join(f"; warning: {warning}" for warning in report.warnings))
    return 0
