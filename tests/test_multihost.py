"""Two simulated hosts: network namespaces joined by a veth pair, ``mpirun`` across them.

A remote-shell agent that enters the other namespace (``ip netns exec``) stands in for
ssh. The job must train across the "hosts", and when the link is cut mid-training it
must end within 60 s, non-zero, with a message naming the lost host, and leave no
worker behind. Needs root and ``ip netns`` (iproute2); skipped, saying why, without.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from harness import WORKERS
from ssh_hosts import why_no_namespaces

from hvdtrain.jobs.launch import process_alive
from hvdtrain.runtime import LAUNCHER_DEFAULTS

DEADLINE_SECONDS = 60
SUBNET = "10.231.{}.0/24"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


class TwoHosts:
    """Namespaces ``<tag>a`` and ``<tag>b`` holding the ends of one veth pair."""

    def __init__(self, tag: str, octet: int) -> None:
        self.namespaces = (f"{tag}a", f"{tag}b")
        self.links = (f"{tag}va", f"{tag}vb")
        self.addresses = (f"10.231.{octet}.1", f"10.231.{octet}.2")
        self.subnet = SUBNET.format(octet)

    def create(self) -> None:
        for namespace in self.namespaces:
            _ip("netns", "add", namespace)
        _ip("link", "add", self.links[0], "type", "veth", "peer", "name", self.links[1])
        for namespace, link, address in zip(self.namespaces, self.links, self.addresses,
                                            strict=True):
            _ip("link", "set", link, "netns", namespace)
            _ip("-n", namespace, "addr", "add", f"{address}/24", "dev", link)
            _ip("-n", namespace, "link", "set", link, "up")
            _ip("-n", namespace, "link", "set", "lo", "up")

    def delete(self) -> None:
        for namespace in self.namespaces:  # deleting a namespace deletes its veth end
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True, timeout=30)

    def cut(self) -> None:
        _ip("-n", self.namespaces[0], "link", "set", self.links[0], "down")

    def write_agent(self, path: Path) -> Path:
        """The rsh agent: ``agent HOST command...`` runs the command in HOST's namespace."""
        cases = "\n".join(f"  {address}) namespace={namespace} ;;" for address, namespace
                          in zip(self.addresses, self.namespaces, strict=True))
        path.write_text(f"""#!/bin/sh
host=$1; shift
case "$host" in
{cases}
  *) echo "agent: unknown host $host" >&2; exit 1 ;;
esac
exec ip netns exec "$namespace" sh -c "$*"
""")
        path.chmod(0o755)
        return path


def _why_namespaces_cannot_be_made() -> str | None:
    if shutil.which("mpirun") is None:
        return "needs Open MPI's mpirun"
    return why_no_namespaces()


@pytest.fixture
def two_hosts():
    reason = _why_namespaces_cannot_be_made()
    if reason:
        pytest.skip(reason)
    hosts = TwoHosts(f"hvd{os.getpid() % 100000}", octet=os.getpid() % 250 + 1)
    try:
        hosts.create()
        yield hosts
    finally:
        hosts.delete()


class _Output:
    """Collects a process's merged output lines on a thread, so the test can wait on them."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(process,), daemon=True)
        self._thread.start()

    def _read(self, process: subprocess.Popen) -> None:
        for line in process.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, predicate, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate(self.lines):
                return True
            time.sleep(0.2)
        return False

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


def _both_ranks_past_step_30(lines: list[str]) -> bool:
    progress = [re.fullmatch(r"PROGRESS rank (\d+) step (\d+)", line) for line in lines]
    return {m[1] for m in progress if m and int(m[2]) >= 30} >= {"0", "1"}


def test_cutting_the_link_between_two_hosts_ends_the_job(two_hosts, tmp_path):
    agent = two_hosts.write_agent(tmp_path / "agent.sh")
    env = {**os.environ, **LAUNCHER_DEFAULTS, "PYTHONUNBUFFERED": "1"}
    command = [
        "ip", "netns", "exec", two_hosts.namespaces[0],
        "mpirun", "--allow-run-as-root", "-np", "2",
        "-H", ",".join(f"{address}:1" for address in two_hosts.addresses),
        "--mca", "plm_rsh_agent", str(agent),
        "--mca", "btl_tcp_if_include", two_hosts.subnet,
        "--mca", "oob_tcp_if_include", two_hosts.subnet,
        "-x", "PATH", "-x", "PYTHONPATH", "-x", "PYTHONUNBUFFERED",
        sys.executable, str(WORKERS / "multihost.py"),
    ]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path.cwd()), env.get("PYTHONPATH")]))
    job = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, start_new_session=True)
    output = _Output(job)
    try:
        both_training = output.wait_for(_both_ranks_past_step_30, timeout=120)
        assert both_training, f"the job never trained across the hosts:\n{output.text[-3000:]}"
        two_hosts.cut()
        cut_at = time.monotonic()
        try:
            returncode = job.wait(timeout=DEADLINE_SECONDS + 30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the job still ran {DEADLINE_SECONDS + 30} s after the link was cut")
        elapsed = time.monotonic() - cut_at
    finally:
        if job.poll() is None:
            os.killpg(job.pid, 9)
            job.wait()
    started = [json.loads(line.removeprefix("REPORT ")) for line in output.lines
               if line.startswith("REPORT ")]
    assert sorted(r["rank"] for r in started) == [0, 1]
    assert all(r["mean_rank"] == 0.5 for r in started)  # the allreduce crossed the link
    assert returncode != 0
    assert elapsed < DEADLINE_SECONDS, f"the job ended {elapsed:.0f} s after the cut"
    assert "lost communication with a remote daemon" in output.text
    assert two_hosts.addresses[1] in output.text  # names the lost host
    time.sleep(2)
    assert not [r["pid"] for r in started if process_alive(r["pid"])], "a rank outlived the job"
