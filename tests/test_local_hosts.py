"""hvdtrain.jobs.local_hosts in one process: the ssh stand-in runs Horovod's remote command
here and ends it when it is itself ended, and the discovery script prints what set()
offered."""

import signal
import subprocess
import time

import pytest

from hvdtrain.jobs.launch import process_alive
from hvdtrain.jobs.local_hosts import LocalHosts

pytestmark = pytest.mark.timeout(30)


def test_the_stand_in_runs_horovods_ssh_command_on_this_machine(tmp_path):
    hosts = LocalHosts.create(tmp_path, ["host-a"])
    # The shape of horovod.runner.util.remote.get_ssh_command's line, quoted as Horovod does.
    done = subprocess.run(
        "ssh -o PasswordAuthentication=no -o StrictHostKeyChecking=no host-a -p 2222 "
        "'cd /tmp > /dev/null 2>&1 ; echo ran on $HOST_LABEL'",
        shell=True, capture_output=True, text=True,
        env={**hosts.environment(), "HOST_LABEL": "this machine"})
    assert (done.returncode, done.stdout) == (0, "ran on this machine\n"), done.stderr


def _default_signals() -> None:
    """A shell cannot trap a signal ignored when it started, and a test run started with
    nohup, or in the background of a non-interactive shell, ignores SIGHUP or SIGINT: the
    stand-in gets the dispositions a launcher's child normally has."""
    for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_ending_the_stand_in_ends_its_command_as_sshd_ends_a_session(tmp_path, sig):
    """What Horovod's launcher does to stop a worker: it terminates the ssh process.
    Everything the command started must go, even a process that ignores SIGTERM."""
    hosts = LocalHosts.create(tmp_path, ["host-a"])
    pids = tmp_path / "pids"
    command = (f"cd /tmp > /dev/null 2>&1 ; sleep 300 & echo $! >> {pids} ; "
               f"sh -c 'trap \"\" TERM; echo $$ >> {pids}; while :; do sleep 1; done' & "
               "wait")
    stand_in = subprocess.Popen(["ssh", "-o", "StrictHostKeyChecking=no", "host-a", command],
                                env=hosts.environment(), preexec_fn=_default_signals)
    deadline = time.monotonic() + 10
    while (not pids.exists() or len(pids.read_text().split()) < 2) and time.monotonic() < deadline:
        time.sleep(0.05)
    started = [int(pid) for pid in pids.read_text().split()]
    stand_in.send_signal(sig)
    assert stand_in.wait(timeout=10) == 128 + sig
    time.sleep(0.2)
    assert not [pid for pid in started if process_alive(pid)]


def test_the_stand_in_exits_with_its_commands_status(tmp_path):
    hosts = LocalHosts.create(tmp_path, ["host-a"])
    done = subprocess.run(["ssh", "host-a", "exit 7"], env=hosts.environment())
    assert done.returncode == 7


def test_discovery_prints_the_hosts_last_offered(tmp_path):
    hosts = LocalHosts.create(tmp_path, ["host-a", "host-b"])
    discover = lambda: subprocess.run([str(hosts.discovery_script)], capture_output=True,  # noqa: E731
                                      text=True, check=True).stdout
    assert discover() == "host-a:1\nhost-b:1\n"
    hosts.set(["host-a", "host-b", "host-c"])
    assert discover() == "host-a:1\nhost-b:1\nhost-c:1\n"


@pytest.mark.parametrize("bad", [[], ["host-a:2"], [""], [" host-a"]])
def test_a_host_list_that_is_not_names_is_refused(tmp_path, bad):
    with pytest.raises(ValueError, match="hosts must be non-empty host names"):
        LocalHosts.create(tmp_path, bad)
