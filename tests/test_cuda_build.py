"""The no-root install with pip's default torch, a CUDA build, on this machine without a
GPU (docs/setup.md, "Installing into your own environment"): as an ordinary user, a fresh
venv, `pip install torch==PIN numpy` from PyPI (the CUDA build, with the CUDA runtime and
NCCL as nvidia-* wheels), then the documented commands

    PYTHON=env/bin/python scripts/build-horovod.sh --install
    env/bin/python -m pip install --no-build-isolation -e '.[torch]'
    env/bin/hvdtrain doctor

and a 2-worker Gloo training run on the CPU that must reach the state the set-up's .venv
(CPU torch, CPU-only Horovod) reaches. Horovod is built with CUDA and NCCL from the
venv's nvidia-* wheels and the machine's nvcc, and once more with ``HVDTRAIN_CUDA=0``
(for the CPU only) for the same torch.

The user's pip reads PyPI, as a machine without this one's local wheel folder does. The
builds are cached in the user's own wheel cache (~/.cache/hvdtrain), so they compile when
the cache key changes (a patch, the build script's revision, torch's version) and take
seconds otherwise; ``HVDTRAIN_TEST_COLD_CACHE=1`` (``make cuda-build``) makes both compile.
The venv (4.7 GB) is deleted afterwards. pip does not keep wheels this large in its
cache, so each run downloads torch and its nvidia-* wheels again (about 3.5 GB, a minute
here).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_examples import CHECKSUM_LINE, train
from test_user_install import REPO, USER, as_user, copy_checkout

pytestmark = pytest.mark.install

EPOCHS = "2"
TORCH = next(line.split("==")[1] for line in (REPO / "constraints.txt").read_text().splitlines()
             if line.startswith("torch=="))
BUILD = REPO / "scripts" / "build-horovod.sh"
# What points pip at this machine's own wheels (the CPU build of torch among them).
LOCAL_PIP = ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_INDEX_URL", "PIP_NO_INDEX",
             "PIP_CONSTRAINT")

VENV = """
set -euo pipefail
cd "$WORK"
python3.11 -m venv env
env/bin/python -m pip install --quiet --disable-pip-version-check "torch==$TORCH" numpy
env/bin/python -c 'import torch; print("TORCH", torch.__version__, torch.version.cuda)'
"""

# One build and run; STEP lines name the step a failure stopped at.
INSTALL_AND_TRAIN = """
set -euo pipefail
cd "$WORK/hvdtrain"
export PYTHON="$WORK/env/bin/python"
echo "STEP cache key"
echo "KEY $(bash scripts/build-horovod.sh --cache-key)"
echo "STEP build-horovod.sh --install"
bash scripts/build-horovod.sh --install
echo "STEP pip install hvdtrain"
"$PYTHON" -m pip install --quiet --disable-pip-version-check --no-build-isolation -e '.[torch]'
echo "STEP import"
"$PYTHON" -c 'import horovod.torch as hvd
print("BUILT", "cuda" if hvd.cuda_built() else "-", "nccl" if hvd.nccl_built() else "-")'
echo "STEP shared libraries"
horovod="$("$PYTHON" -c 'import horovod, os; print(os.path.dirname(horovod.__file__))')"
ldd "$horovod"/torch/mpi_lib*.so | grep -E 'libnccl|libcudart' || true
echo "STEP hvdtrain doctor"
"$WORK/env/bin/hvdtrain" doctor
echo "STEP pip install scikit-learn (the example's digits)"
"$PYTHON" -m pip install --quiet --disable-pip-version-check scikit-learn
echo "STEP train"
"$WORK/env/bin/horovodrun" -np 2 --gloo "$PYTHON" examples/torch_train.py \\
    --epochs "$EPOCHS" --checkpoint "$WORK/run.pt"
echo "STEP done"
"""


def _user_env(work: Path, **extra: str) -> dict[str, str]:
    """The environment of the user's shell (runuser sets HOME and the user's names): pip
    reads PyPI alone (no local wheel folder or config, which would serve the CPU build of
    torch), and the wheel cache is cold on request."""
    env = {name: value for name, value in os.environ.items()
           if name not in LOCAL_PIP and not name.startswith(("HVDTRAIN_", "VIRTUAL_ENV"))}
    env.update(WORK=str(work), TORCH=TORCH, EPOCHS=EPOCHS, PIP_CONFIG_FILE=os.devnull, **extra)
    if os.environ.get("HVDTRAIN_TEST_COLD_CACHE") == "1":
        env["HVDTRAIN_CACHE"] = str(work / "cache")
    return env


def _as_user_run(work: Path, script: str, timeout: float,
                 **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*as_user(), "bash", "-c", script], capture_output=True, text=True,
                          timeout=timeout, cwd=work, env=_user_env(work, **extra))


def _failed_step(done: subprocess.CompletedProcess[str]) -> str:
    steps = re.findall(r"^STEP (.+)$", done.stdout, re.MULTILINE)
    return f"failed at step {steps[-1] if steps else 'before any step'!r}:\n" \
           f"{(done.stdout + done.stderr)[-6000:]}"


@pytest.fixture(scope="module")
def cuda_venv() -> Iterator[Path]:
    """A fresh venv with pip's default torch (the CUDA build), owned by the ordinary user,
    beside a copy of the checkout; yields the folder holding both."""
    prefix = as_user()
    work = Path(tempfile.mkdtemp(prefix="hvdtrain-cuda-build-"))
    try:
        copy_checkout(work / "hvdtrain")
        if prefix:
            subprocess.run(["chown", "-R", f"{USER}:{USER}", str(work)], check=True)
        done = _as_user_run(work, VENV, timeout=900)
        assert done.returncode == 0, f"the venv with torch=={TORCH}: {done.stderr[-4000:]}"
        version, cuda = re.search(r"^TORCH (\S+) (\S+)$", done.stdout, re.MULTILINE).groups()
        assert cuda != "None", (f"pip's default torch=={TORCH} from PyPI is {version}, not a "
                                "CUDA build: this test needs the CUDA build")
        yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="module")
def cpu_fingerprint(tmp_path_factory) -> str:
    """The final state of the same training with the set-up's .venv."""
    _, _, fingerprint = train(tmp_path_factory.mktemp("cpu"), "gloo", "--epochs", EPOCHS)
    return fingerprint


def _flags(work: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(BUILD), "--print-flags"], capture_output=True,
                          text=True, timeout=120,
                          env=_user_env(work, PYTHON=str(work / "env" / "bin" / "python"),
                                        **extra))


def _flag(flags: str, name: str) -> str | None:
    return next((line.split("=", 1)[1] for line in flags.splitlines()
                 if line.startswith(f"{name}=")), None)


def test_the_build_finds_cuda_and_nccl_in_the_venv_and_says_what_it_lacks(cuda_venv):
    site = next((cuda_venv / "env" / "lib").glob("python3.*")) / "site-packages"
    flags = _flags(cuda_venv)
    assert flags.returncode == 0, flags.stderr
    assert _flag(flags.stdout, "HOROVOD_GPU_OPERATIONS") == "NCCL"
    assert _flag(flags.stdout, "HVDTRAIN_CUDA_INCLUDE") == str(site / "nvidia" / "cu13" / "include")
    assert _flag(flags.stdout, "HOROVOD_NCCL_INCLUDE") == str(site / "nvidia" / "nccl" / "include")
    arches = _flag(flags.stdout, "HOROVOD_BUILD_CUDA_CC_LIST").split(",")
    assert "80" in arches and "90" in arches, arches  # torch's own list, not a GPU's

    cpu_only = _flags(cuda_venv, HVDTRAIN_CUDA="0")
    assert cpu_only.returncode == 0, cpu_only.stderr
    assert _flag(cpu_only.stdout, "HVDTRAIN_CUDA") == "0"
    assert _flag(cpu_only.stdout, "HVDTRAIN_NVCC") is None
    assert _flag(cpu_only.stdout, "HOROVOD_GPU_OPERATIONS") is None

    staged = _flags(cuda_venv, HVDTRAIN_NCCL="0")  # CUDA, GPU tensors through host memory
    assert _flag(staged.stdout, "HVDTRAIN_NVCC")
    assert _flag(staged.stdout, "HOROVOD_GPU_OPERATIONS") is None

    # A toolkit folder with the runtime but no nvcc: for the CPU only, saying how to get
    # nvcc; asked for CUDA by name, an error saying the same.
    runtime_only = cuda_venv / "runtime-only"
    runtime_only.mkdir()
    for part in ("include", "lib"):
        (runtime_only / part).symlink_to(site / "nvidia" / "cu13" / part)
    fallback = _flags(cuda_venv, HVDTRAIN_CUDA_HOME=str(runtime_only))
    assert fallback.returncode == 0, fallback.stderr
    assert _flag(fallback.stdout, "HVDTRAIN_CUDA") == "0"
    why = _flag(fallback.stdout, "HVDTRAIN_CPU_ONLY")
    assert "no nvcc for CUDA 13 was found" in why
    assert "pip install 'nvidia-cuda-nvcc==13.0.*'" in why
    no_nvcc = _flags(cuda_venv, HVDTRAIN_CUDA_HOME=str(runtime_only), HVDTRAIN_CUDA="1")
    assert no_nvcc.returncode != 0
    assert f"a CUDA build was asked for, but {why}; HVDTRAIN_CUDA=0" in no_nvcc.stderr

    nowhere = _flags(cuda_venv, HVDTRAIN_CUDA_HOME=str(cuda_venv / "nowhere"), HVDTRAIN_NCCL="1")
    assert nowhere.returncode != 0
    assert "no CUDA runtime headers and library were found" in nowhere.stderr

    wrong = _flags(cuda_venv, HVDTRAIN_CUDA="yes")
    assert wrong.returncode != 0 and "HVDTRAIN_CUDA=yes: use 1" in wrong.stderr


@pytest.mark.timeout(2400)
def test_a_cuda_torch_gets_a_cuda_and_nccl_horovod_that_trains_on_the_cpu(
        cuda_venv, cpu_fingerprint):
    done = _as_user_run(cuda_venv, INSTALL_AND_TRAIN, timeout=2300)
    assert done.returncode == 0, _failed_step(done)
    output = done.stdout + done.stderr
    key = re.search(r"^KEY (\S+)$", done.stdout, re.MULTILINE)[1]
    assert re.search(r"-cuda13\.\d+-sm[\d.]+-nccl$", key), key
    assert "with CUDA 13." in output and "with NCCL 2." in output, output[-3000:]
    assert "BUILT cuda nccl" in done.stdout
    site = next((cuda_venv / "env" / "lib").glob("python3.*")) / "site-packages"
    libraries = dict(re.findall(r"^\s*(lib(?:nccl|cudart)\.so\S*) => (\S+)", done.stdout,
                                re.MULTILINE))
    # Found from the extension's own run path, without torch having loaded them.
    assert Path(libraries["libnccl.so.2"]).resolve().is_relative_to(site / "nvidia"), libraries
    assert Path(libraries["libcudart.so.13"]).resolve().is_relative_to(site / "nvidia"), libraries
    assert "CUDA and NCCL built in; no GPU visible here" in done.stdout
    assert "verdict: READY" in done.stdout
    assert CHECKSUM_LINE.findall(done.stdout) == [cpu_fingerprint]
    print("compiled here" if "compiling" in output else f"from the user's wheel cache: {key}")


@pytest.mark.timeout(2400)
def test_hvdtrain_cuda_0_gets_a_cpu_only_horovod_for_the_same_torch(cuda_venv, cpu_fingerprint):
    done = _as_user_run(cuda_venv, INSTALL_AND_TRAIN, timeout=2300, HVDTRAIN_CUDA="0")
    assert done.returncode == 0, _failed_step(done)
    output = done.stdout + done.stderr
    key = re.search(r"^KEY (\S+)$", done.stdout, re.MULTILINE)[1]
    assert "-cuda" not in key and "-nccl" not in key, key
    assert "for the CPU only, as HVDTRAIN_CUDA=0 asks" in output
    assert "BUILT - -" in done.stdout
    assert "none: a CPU-only build" in done.stdout
    assert CHECKSUM_LINE.findall(done.stdout) == [cpu_fingerprint]
    print("compiled here" if "compiling" in output else f"from the user's wheel cache: {key}")
