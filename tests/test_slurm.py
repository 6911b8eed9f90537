"""hvdtrain under a real Slurm (Debian's slurm-wlm and munge): a one-node cluster and one
of three nodes, which scripts/slurm-local.sh starts for this module and stops afterwards.

- ``srun -n 2 --mpi=pmix`` runs the torch demo by direct launch (Horovod's MPI
  controller through Open MPI's PMIx) to the very state ``horovodrun -np 2`` reaches.
- Inside an allocation, ``horovodrun -H "$(hvdtrain hosts)" --gloo`` takes its hosts
  from Slurm and reaches that state too.
- The sbatch scripts of examples/slurm train (torch and Keras), as a user submits them.
- Across nodes (three slurmd, each in a network-namespace host with its own name,
  address and sshd): ``srun -N 2 --mpi=pmix`` and ``horovodrun -H "$(hvdtrain hosts)"``
  in ``salloc -N 2`` reach the same state, one rank per node, and an elastic job in
  ``salloc -N 3`` whose discovery script reads the allocation goes on without a lost node.

Skipped, saying why, without root or Slurm (scripts/setup.sh installs it). Marked
``cluster``: ``pytest -m "not cluster"`` leaves them out locally; CI runs them.
"""

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from elastic_jobs import check_no_worker_left, check_shrunk
from harness import WORKERS
from ssh_hosts import SshHosts, why_unavailable
from test_examples import CHECKSUM_LINE, train

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]
ROOT = Path(__file__).parents[1]
SCRIPT = ROOT / "scripts" / "slurm-local.sh"
DEMO = ROOT / "examples" / "torch_train.py"
EPOCHS = "2"


def skip_without_slurm() -> None:
    if os.geteuid() != 0:
        pytest.skip("starting slurmctld and slurmd needs root")
    if shutil.which("srun") is None or not Path("/usr/sbin/slurmctld").exists():
        pytest.skip("needs Debian's slurm-wlm and munge (scripts/setup.sh installs them)")


@contextlib.contextmanager
def cluster(directory: Path, *nodes: str):
    """A running cluster (``nodes``: slurm-local.sh's NODE=NETNS); the environment of a
    client of it."""
    started = subprocess.run(["bash", str(SCRIPT), "start", str(directory), *nodes],
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
def slurm(tmp_path_factory):
    """The environment of a client of the running one-node cluster."""
    skip_without_slurm()
    with cluster(tmp_path_factory.mktemp("slurm")) as env:
        yield env


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


# Several nodes: each a network namespace with its own host name, address and sshd
# (tests/ssh_hosts.py), running a slurmd of its own (scripts/slurm-local.sh's node mode);
# the clients run on the first node, as on a login node.
NODES = ["node-a", "node-b", "node-c"]


@pytest.fixture(scope="module")
def nodes(tmp_path_factory):
    """The node hosts (an SshHosts) and the environment of a client on node-a."""
    skip_without_slurm()
    reason = why_unavailable()
    if reason:
        pytest.skip(reason)
    directory = tmp_path_factory.mktemp("slurm-nodes")
    with SshHosts(directory / "hosts", NODES) as hosts, \
            cluster(directory / "slurm", *(f"{name}={hosts.namespace(name)}"
                                           for name in NODES)) as env:
        yield hosts, env


def on_login_node(nodes, command: list[str], cwd: Path = ROOT, timeout: float = 240):
    hosts, env = nodes
    return subprocess.run(hosts.on("node-a", command), capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=cwd)


def test_srun_across_two_nodes_runs_the_demo_to_the_state_horovodrun_reaches(
        nodes, horovodrun_fingerprint, tmp_path):
    done = on_login_node(nodes, [
        "srun", "-N", "2", "-n", "2", "--mpi=pmix", "bash", "-c",
        'echo "rank $SLURM_PROCID on $(hostname)" >&2; exec "$0" "$@"',
        sys.executable, str(DEMO), "--epochs", EPOCHS, "--checkpoint", str(tmp_path / "d.pt")])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert {"rank 0 on node-a", "rank 1 on node-b"} <= set(done.stderr.splitlines())
    assert fingerprints(done.stdout) == [horovodrun_fingerprint], done.stdout[-3000:]
    assert "replicas identical" in done.stdout


def test_horovodrun_in_a_two_node_allocation_takes_its_hosts_from_slurm(
        nodes, horovodrun_fingerprint, tmp_path):
    hosts, _ = nodes
    job = ('echo "hosts: $(hvdtrain hosts)"; '
           'horovodrun -np "$SLURM_NTASKS" -H "$(hvdtrain hosts)" --gloo '
           f'--network-interfaces {hosts.interface} --ssh-identity-file {hosts.key} '
           f'{sys.executable} {DEMO} --epochs {EPOCHS} --checkpoint {tmp_path / "d.pt"}')
    done = on_login_node(nodes, ["salloc", "-N", "2", "-n", "2", "bash", "-c", job])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "hosts: node-a:1,node-b:1" in done.stdout
    assert fingerprints(done.stdout) == [horovodrun_fingerprint], done.stdout[-3000:]


def test_an_elastic_job_in_an_allocation_discovers_its_nodes_and_goes_on_without_one(
        nodes, tmp_path):
    """docs/clusters.md's discovery script (``hvdtrain hosts --lines``) inside
    ``salloc -N 3``: the worker on node-c kills itself mid-epoch, Horovod drops its host,
    and the other two go on from the last commit with the rule for 2 (the checks of
    tests/elastic_jobs.py)."""
    hosts, _ = nodes
    discover = tmp_path / "discover.sh"
    discover.write_text("#!/bin/sh\nexec hvdtrain hosts --lines\n")
    discover.chmod(0o755)
    done = on_login_node(nodes, [
        "salloc", "-N", "3", "-n", "3", "horovodrun", "--gloo", "-np", "3", "--min-np", "2",
        "--max-np", "3", "--host-discovery-script", str(discover),
        "--network-interfaces", hosts.interface, "--ssh-identity-file", str(hosts.key),
        sys.executable, str(WORKERS / "torch_elastic_train.py"), "shrink", str(tmp_path)],
        cwd=WORKERS)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    reports = [json.loads(line.split("REPORT ", 1)[1]) for line in done.stdout.splitlines()
               if "REPORT " in line]
    check_no_worker_left(reports, output)
    check_shrunk(reports, victim=2)
    assert sorted(r["host"] for r in reports if r["scenario"] == "started") == NODES
