"""An elastic hvdtrain job on a Ray cluster of 3 nodes started here (``ray start``, one
CPU each, the 2 others on their own loopback addresses so that Horovod's elastic
driver sees 3 hosts), through hvdtrain.jobs.ray.run and Horovod's elastic driver on Ray.

The worker is tests/workers/torch_elastic_train.py's (sharded SGD with momentum): rank 2
of 3 kills itself at step 14; the others must roll back to the last commit and finish
as 2, with the rate following k, every sample trained on and the momentum carried
through the re-shard, as the same job does under horovodrun (tests/elastic_jobs.py's
checks, on the reports the workers append to a file).
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="the ray extra is not installed (scripts/setup.sh "
                                    "installs it)")

from elastic_jobs import check_replay, check_shrunk

TESTS = Path(__file__).parent
NODES = ("127.0.0.1", "127.0.0.2", "127.0.0.3")  # the head, then one per other node
# `ray start` turns on token authentication, which a driver without the token refuses.
NO_AUTH = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def three_nodes():
    """The head and 2 more nodes, each a `ray start --block` process of its own, so that
    ending the process ends the node."""
    ray_cli = str(Path(sys.executable).with_name("ray"))
    temp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # short: Ray's socket paths
    port = _free_port()
    # In the nodes' own environment, not a job's runtime_env: then the workers Ray starts
    # ahead of time serve the job, instead of new ones (their start on a busy 2-core
    # machine outlasted the 10 s Horovod's elastic driver gives a new worker to answer).
    path = os.pathsep.join([str(TESTS / "workers"), str(TESTS.parent)])
    env = {**os.environ, **NO_AUTH, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
    common = ["--num-cpus=1", "--block", "--disable-usage-stats"]
    nodes = [subprocess.Popen([ray_cli, "start", "--head", f"--port={port}",
                               f"--node-ip-address={NODES[0]}", f"--temp-dir={temp}",
                               "--include-dashboard=false", *common], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)]
    try:
        _wait_for_nodes(f"{NODES[0]}:{port}", 1, env)
        for count, address in enumerate(NODES[1:], start=2):  # one by one: their ports
            nodes.append(subprocess.Popen(
                [ray_cli, "start", f"--address={NODES[0]}:{port}",
                 f"--node-ip-address={address}", *common], env=env,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
            _wait_for_nodes(f"{NODES[0]}:{port}", count, env)
        yield f"{NODES[0]}:{port}"
    finally:
        _stop(nodes, temp)


def _stop(nodes: list[subprocess.Popen], temp: str) -> None:
    """End the nodes' process groups, then any process of this cluster left (by its
    session folder, which every one of them names)."""
    for node in nodes:
        os.killpg(node.pid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    for node in nodes:
        try:
            node.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(node.pid, signal.SIGKILL)
            node.wait()
    subprocess.run(["pkill", "-KILL", "-f", temp], check=False)
    shutil.rmtree(temp, ignore_errors=True)


def _wait_for_nodes(address: str, count: int, env: dict, within_s: float = 60) -> None:
    script = (f"import ray; ray.init(address={address!r}, logging_level='ERROR'); "
              "print(sum(n['Alive'] for n in ray.nodes()))")
    deadline = time.monotonic() + within_s
    alive = 0
    while time.monotonic() < deadline:
        done = subprocess.run([sys.executable, "-c", script], capture_output=True,
                              text=True, env=env, timeout=60)
        if done.returncode == 0 and done.stdout.strip().isdigit():
            alive = int(done.stdout.strip())
            if alive >= count:
                return
        time.sleep(1)
    raise AssertionError(f"the Ray cluster at {address} has {alive} of {count} nodes")


@pytest.mark.timeout(300)
def test_an_elastic_job_on_ray_loses_a_worker_and_finishes_as_two(three_nodes, tmp_path):
    reports_file = tmp_path / "reports.jsonl"
    # The driver in a process of its own, as a user's script is (tests/workers/
    # ray_elastic_driver.py), so that nothing this test process did before can matter.
    done = subprocess.run(
        [sys.executable, str(TESTS / "workers" / "ray_elastic_driver.py"), three_nodes,
         str(reports_file)], capture_output=True, text=True, timeout=240,
        env={**os.environ, **NO_AUTH, "PYTHONPATH": os.pathsep.join(
            [str(TESTS / "workers"), str(TESTS.parent)])})
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-6000:]
    took = float(done.stdout.split("TOOK ")[1])
    reports = [json.loads(line.removeprefix("REPORT "))
               for line in reports_file.read_text().splitlines()]
    starts = [r for r in reports if r["scenario"] == "started" and r["size"] == 3]
    assert len(starts) == 3, starts
    recovery = check_shrunk(reports, victim=2)
    check_replay(reports)
    print(f"Ray elastic: recovery {recovery:.1f} s from the kill to the next completed step; "
          f"the job took {took:.1f} s")
