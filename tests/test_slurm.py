"""hvdtrain under a real Slurm (Debian's slurm-wlm and munge), a one-node cluster that
scripts/slurm-local.sh starts for this module and stops afterwards.

- ``srun -n 2 --mpi=pmix`` runs the torch demo by direct launch (Horovod's MPI
  controller through Open MPI's PMIx) to the very state ``horovodrun -np 2`` reaches.
- Inside an allocation, ``horovodrun -H "$(hvdtrain hosts)" --gloo`` takes its hosts
  from Slurm and reaches that state too.
- The sbatch scripts of examples/slurm train (torch and Keras), as a user submits them.

Skipped, saying why, without root or Slurm (scripts/setup.sh installs it). Marked
``cluster``: ``pytest -m "not cluster"`` leaves them out locally; CI runs them.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_examples import CHECKSUM_LINE, train

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]
ROOT = Path(__file__).parents[1]
SCRIPT = ROOT / "scripts" / "slurm-local.sh"
DEMO = ROOT / "examples" / "torch_train.py"
EPOCHS = "2"


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """The environment of a client of the running cluster."""
    if os.geteuid() != 0:
        pytest.skip("starting slurmctld and slurmd needs root")
    if shutil.which("srun") is None or not Path("/usr/sbin/slurmctld").exists():
        pytest.skip("needs Debian's slurm-wlm and munge (scripts/setup.sh installs them)")
    directory = tmp_path_factory.mktemp("slurm")
    started = subprocess.run(["bash", str(SCRIPT), "start", str(directory)],
                             capture_output=True, text=True, timeout=90)
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        yield {**os.environ, "SLURM_CONF": str(directory / "slurm.conf"),
               "OMP_NUM_THREADS": "1", "PATH": f"{Path(sys.executable).parent}:"
                                               f"{os.environ['PATH']}"}
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop", str(directory)], capture_output=True,
                       timeout=90)


@pytest.fixture(scope="module")
def horovodrun_fingerprint(tmp_path_factory):
    """The demo's final state after horovodrun -np 2 --mpi, for comparison."""
    _, _, checksum = train(tmp_path_factory.mktemp("horovodrun"), "mpi", "--epochs", EPOCHS)
    return checksum


def fingerprints(output: str) -> list[str]:
    return CHECKSUM_LINE.findall(output)


def test_srun_runs_the_demo_to_the_state_horovodrun_reaches(slurm, horovodrun_fingerprint,
                                                            tmp_path):
    done = subprocess.run(
        ["srun", "-n", "2", "--mpi=pmix", sys.executable, str(DEMO), "--epochs", EPOCHS,
         "--checkpoint", str(tmp_path / "demo.pt")],
        capture_output=True, text=True, timeout=240, env=slurm, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert fingerprints(done.stdout) == [horovodrun_fingerprint], done.stdout[-3000:]
    assert "replicas identical" in done.stdout


def test_horovodrun_in_an_allocation_takes_its_hosts_from_slurm(slurm, horovodrun_fingerprint,
                                                                tmp_path):
    job = ('echo "hosts: $(hvdtrain hosts)"; '
           'horovodrun -np "$SLURM_NTASKS" -H "$(hvdtrain hosts)" --gloo '
           f'{sys.executable} {DEMO} --epochs {EPOCHS} --checkpoint {tmp_path / "demo.pt"}')
    done = subprocess.run(["salloc", "-n", "2", "bash", "-c", job], capture_output=True,
                          text=True, timeout=240, env=slurm, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    node = subprocess.run(["hostname", "-s"], capture_output=True, text=True).stdout.strip()
    assert f"hosts: {node}:2" in done.stdout
    assert fingerprints(done.stdout) == [horovodrun_fingerprint], done.stdout[-3000:]


@pytest.mark.parametrize(("script", "learned"), [
    ("torch.sbatch", CHECKSUM_LINE),
    ("keras.sbatch", re.compile(r"val_accuracy: [\d.]+")),
])
def test_the_sbatch_examples_train(slurm, tmp_path, script, learned):
    log = tmp_path / "job.out"
    done = subprocess.run(
        ["sbatch", "--wait", f"--output={log}", str(ROOT / "examples" / "slurm" / script),
         "--epochs", "1", *(["--checkpoint", str(tmp_path / "run.pt")]
                            if script == "torch.sbatch" else [])],
        capture_output=True, text=True, timeout=240, env=slurm, cwd=ROOT)
    output = log.read_text() if log.exists() else ""
    assert done.returncode == 0, done.stdout + done.stderr + output[-3000:]
    assert learned.search(output), output[-3000:]
