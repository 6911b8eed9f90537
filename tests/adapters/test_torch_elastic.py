"""hvdtrain's torch DistributedOptimizer in a Horovod elastic job (Gloo, one host):
a worker that joins mid-training builds its optimizer while the others are inside
``hvd.elastic.run``, so nothing in the optimizer's construction may wait for them.
The job grows from 2 to 3 workers and ends with identical replicas."""

import json
import os
import signal
import subprocess
import sys

import pytest
from harness import WORKERS

from hvdtrain.launch import horovodrun_path

pytestmark = pytest.mark.timeout(240)


def test_a_worker_joining_an_elastic_job_trains_on_with_the_others(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:2\n")
    discover = tmp_path / "discover.sh"
    discover.write_text(f"#!/bin/sh\ncat {hosts}\n")
    discover.chmod(0o755)
    # Without --network-interfaces, Horovod's elastic Gloo launcher waits for 2 hosts.
    command = [horovodrun_path(), "--network-interfaces", "lo", "-np", "2", "--min-np", "2",
               "--max-np", "3", "--host-discovery-script", str(discover), sys.executable,
               str(WORKERS / "torch_elastic_join.py"), str(hosts)]
    job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
                           cwd=WORKERS, start_new_session=True)
    try:
        output, _ = job.communicate(timeout=200)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)  # the launcher and every worker it started
        output, _ = job.communicate()
        pytest.fail(f"the elastic job did not finish in 200 s:\n{output[-4000:]}")
    assert job.returncode == 0, output[-4000:]
    reports = [json.loads(line.split("REPORT ", 1)[1]) for line in output.splitlines()
               if "REPORT " in line]
    commits = [r for r in reports if r["scenario"] == "commit"]
    finished = [r for r in reports if r["scenario"] == "done"]
    assert {r["size"] for r in commits if r["step"] <= 20} == {2}, commits
    assert sorted(r["rank"] for r in finished) == [0, 1, 2], output[-4000:]
    assert {r["size"] for r in finished} == {3}
    assert len({r["fingerprint"] for r in finished}) == 1, finished
    for step in {r["step"] for r in commits}:  # replicas agree at every commit
        assert len({r["fingerprint"] for r in commits if r["step"] == step}) == 1, step
