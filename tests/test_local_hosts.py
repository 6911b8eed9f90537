"""hvdtrain.local_hosts in one process: the ssh stand-in runs Horovod's remote command
here, and the discovery script prints what set() offered."""

import subprocess

import pytest

from hvdtrain.local_hosts import LocalHosts

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
