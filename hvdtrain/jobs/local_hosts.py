"""Several host names on this one machine, for trying a Horovod elastic job here.

Horovod's elastic driver blacklists the host of a worker that fails, so workers that
share ``localhost`` cannot lose one and go on. Give each worker a host name of its
own instead: Horovod starts a worker on a host that is not this machine with
``ssh HOST COMMAND``, and an ``ssh`` early in ``PATH`` that runs COMMAND here makes
any name a host of this machine. Like sshd, it ends COMMAND when the launcher ends
the ssh process, so a job that stops leaves no worker behind. The host discovery
script prints a file that the caller (or a worker) rewrites to add or remove hosts
while the job runs. tests/ssh_hosts.py makes hosts with real sshd instead, where
root may create network namespaces.

Example::

    hosts = LocalHosts.create(Path("/tmp/job"), ["host-a", "host-b", "host-c"])
    subprocess.run([horovodrun_path(), "--gloo", "--network-interfaces", "lo",
                    "-np", "3", "--min-np", "2", "--max-np", "3",
                    "--host-discovery-script", str(hosts.discovery_script),
                    sys.executable, "train.py"], env=hosts.environment())
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["LocalHosts", "run_elastic_demo"]

# Horovod runs `ssh -o OPTION ... HOST [-p PORT] [-i FILE] [-o OPTION] COMMAND`. Like
# sshd, the stand-in runs COMMAND in a session of its own and ends that session when the
# connection goes: when the launcher terminates the stand-in (SIGTERM, SIGHUP, SIGINT),
# every process of COMMAND gets SIGTERM, and SIGKILL if one is left after the grace
# period. Without this, a worker whose job was stopped lived on, re-parented to init.
_SSH_STAND_IN = """\
#!/bin/sh
# hvdtrain's ssh stand-in (hvdtrain/jobs/local_hosts.py): runs the command on this machine.
host=""
while [ $# -gt 0 ]; do
  case "$1" in
    -o|-p|-i|-l) shift 2 ;;
    -*) shift ;;
    *) if [ -z "$host" ]; then host="$1"; shift; else break; fi ;;
  esac
done
setsid /bin/sh -c "$*" &
session=$!
hang_up() {
  kill -TERM "-$session" 2>/dev/null
  waited=0
  while kill -0 "-$session" 2>/dev/null && [ "$waited" -lt 3 ]; do
    sleep 1; waited=$((waited + 1))
  done
  kill -KILL "-$session" 2>/dev/null
}
trap 'hang_up; exit 143' TERM
trap 'hang_up; exit 129' HUP
trap 'hang_up; exit 130' INT
wait "$session"
"""


@dataclass(frozen=True)
class LocalHosts:
    """A folder holding ``bin/ssh`` (the stand-in), ``hosts`` (one ``NAME:1`` per
    line) and ``discover.sh`` (prints ``hosts``)."""

    directory: Path

    @classmethod
    def create(cls, directory: Path, hosts: Sequence[str]) -> LocalHosts:
        """Write the stand-in, the discovery script and ``hosts`` into ``directory``.

        Args:
            directory: an existing or new folder of the caller's.
            hosts: the host names the job starts with, one slot each.

        Returns:
            The LocalHosts of ``directory``.
        """
        made = cls(Path(directory))
        (made.directory / "bin").mkdir(parents=True, exist_ok=True)
        ssh = made.directory / "bin" / "ssh"
        ssh.write_text(_SSH_STAND_IN)
        ssh.chmod(0o755)
        made.discovery_script.write_text(f"#!/bin/sh\ncat '{made.directory / 'hosts'}'\n")
        made.discovery_script.chmod(0o755)
        made.set(hosts)
        return made

    @property
    def discovery_script(self) -> Path:
        """The script for ``horovodrun --host-discovery-script``."""
        return self.directory / "discover.sh"

    def set(self, hosts: Sequence[str]) -> None:
        """Offer exactly ``hosts`` (one slot each) from the next discovery on."""
        if not hosts or any(not name or ":" in name or name.strip() != name for name in hosts):
            raise ValueError(f"hosts must be non-empty host names without ':', got {hosts!r}")
        staged = self.directory / "hosts.new"
        staged.write_text("".join(f"{name}:1\n" for name in hosts))
        staged.replace(self.directory / "hosts")  # the driver never reads half a file

    def environment(self, base: Mapping[str, str] = os.environ) -> dict[str, str]:
        """``base`` with the stand-in first on ``PATH``, for ``horovodrun``'s process."""
        return {**base, "PATH": f"{self.directory / 'bin'}{os.pathsep}{base.get('PATH', '')}"}


def run_elastic_demo(worker_command: Sequence[str], hosts: Sequence[str], *, min_np: int,
                     summary: re.Pattern[str], say: Callable[[str], None]) -> int:
    """Run ``worker_command`` as an elastic Gloo job on this machine, one host name per
    worker, passing rank 0's lines to ``say``.

    Args:
        worker_command: the command every worker runs (``[sys.executable, script, ...]``).
        hosts: the host names to start with, one worker each.
        min_np: the fewest workers the job may go on with.
        summary: what rank 0's last line must match for the demo to have succeeded.
        say: prints one line.

    Returns:
        0 when the job exited 0 and rank 0 printed a ``summary`` line, else 1.
    """
    from hvdtrain.jobs.launch import horovodrun_path

    with tempfile.TemporaryDirectory(prefix="hvdtrain-elastic-demo-") as folder:
        local = LocalHosts.create(Path(folder), hosts)
        command = [horovodrun_path(), "--gloo", "--network-interfaces", "lo",
                   "-np", str(len(hosts)), "--min-np", str(min_np), "--max-np", str(len(hosts)),
                   "--host-discovery-script", str(local.discovery_script), *worker_command]
        job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, env={**local.environment(), "OMP_NUM_THREADS": "1"})
        last = None
        for line in job.stdout:
            text = re.sub(r"^\[\d+\]<std(out|err)>:", "", line.rstrip("\n"))
            if line.startswith("[0]<stdout>:"):
                say(text)
                last = text if summary.search(text) else last
            elif "exit with status code 137" in line:
                say("a worker was killed (SIGKILL): the others go on")
        returncode = job.wait()
    if returncode != 0 or last is None:
        say(f"the elastic job failed (exit {returncode})")
        return 1
    return 0
