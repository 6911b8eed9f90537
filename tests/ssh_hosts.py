"""Hosts reached over real ssh, on this one machine: each a network namespace with its
own host name, address and ``sshd`` (Debian's openssh-server), joined by a bridge.

What a cluster gives a launcher, and what the one-machine ssh stand-in
(hvdtrain.jobs.local_hosts) only imitates: a real sshd session per worker, a network
interface and address per host, and host names that resolve to those addresses
(Horovod's Gloo rendezvous resolves ``gethostname()``; see
../shared/reference/clusters.md).

Everything is made per run and removed afterwards: the namespaces (the bridge lives
in one of its own, so this machine's network is untouched), one key for the client
and one per host, and the files ``ip netns exec`` lays over ``/etc`` inside a
namespace (``/etc/netns/NS/hosts`` and ``/etc/netns/NS/ssh/ssh_config``: this
machine's own ``/etc/hosts`` and ``~/.ssh`` are left alone). Needs root, iproute2,
util-linux's ``unshare`` and openssh-server (and iproute2's ``tc`` for
:meth:`SshHosts.limit_rate`); :func:`why_unavailable` says what is missing.

Example::

    with SshHosts(tmp_path, ["host-a", "host-b"]) as hosts:
        subprocess.run(hosts.on("host-a", [horovodrun_path(), "-H", "host-a:1,host-b:1",
                                          "--network-interfaces", hosts.interface,
                                          "--ssh-identity-file", str(hosts.key), ...]))
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

SSHD = "/usr/sbin/sshd"
INTERFACE = "eth0"  # each host's link to the bridge: the same name on every host
_NETNS_ETC = Path("/etc/netns")


def why_no_namespaces() -> str | None:
    """Why network namespaces cannot be made here, or None when they can."""
    if shutil.which("ip") is None:
        return "needs iproute2's `ip` command; scripts/setup.sh installs it"
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    probe = f"hvdprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"this machine refuses network namespaces: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def why_unavailable() -> str | None:
    """Why hosts with sshd cannot be made here, or None when they can."""
    for tool, package in (("unshare", "util-linux"), ("ssh-keygen", "openssh-client"),
                          ("ssh", "openssh-client")):
        if shutil.which(tool) is None:
            return f"needs `{tool}` ({package}); scripts/setup.sh installs it"
    if not os.access(SSHD, os.X_OK):
        return f"needs {SSHD} (openssh-server); scripts/setup.sh installs it"
    return why_no_namespaces()


def _run(*command: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed: {done.stderr.strip()}")


class SshHosts:
    """``names`` as hosts with real sshd; a context manager that makes and removes them.

    Attributes:
        key: the private key every host accepts (``horovodrun --ssh-identity-file``).
        interface: the hosts' network interface (``--network-interfaces``).
        addresses: each host's address, by name.
    """

    def __init__(self, directory: Path, names: Sequence[str]) -> None:
        self.directory = Path(directory)
        self.names = list(names)
        tag = f"{os.getpid() % 100000}"
        self._namespaces = {name: f"hvd{tag}h{i}" for i, name in enumerate(self.names)}
        self._switch = f"hvd{tag}sw"
        octet = os.getpid() % 250 + 1
        self.addresses = {name: f"10.232.{octet}.{i + 1}" for i, name in enumerate(self.names)}
        self.interface = INTERFACE
        self.key = self.directory / "client_key"
        self._sshd: dict[str, subprocess.Popen] = {}

    def __enter__(self) -> SshHosts:
        try:
            self._create()
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.remove()

    def namespace(self, name: str) -> str:
        """Host ``name``'s network namespace (``ip netns exec`` takes it)."""
        return self._namespaces[name]

    def on(self, name: str, command: Sequence[str]) -> list[str]:
        """``command`` as run on host ``name`` (its network, host name and /etc files)."""
        return ["ip", "netns", "exec", self._namespaces[name], "unshare", "--uts", "sh", "-c",
                f'hostname {name} && exec "$@"', "sh", *command]

    def limit_rate(self, mbit_per_s: int | None) -> None:
        """Rate-limit every host's link to ``mbit_per_s`` Mbit/s each way, or lift the
        limit (None). A token bucket (tc's tbf) on the host's end of the link limits what
        it sends, and one on the bridge's end what it receives. The bucket holds 160 µs
        of traffic (at least 16 KiB): less and tbf's timer cannot keep 5 Gbit/s (3.5
        measured with 32 KiB), more and messages of up to its size leave at the veth's
        own speed (about 11 Gbit/s here). This kernel has no netem: the latency stays
        the machine's."""
        for namespace in self._namespaces.values():
            for where, device in ((namespace, self.interface), (self._switch, f"{namespace}o")):
                if mbit_per_s is None:
                    subprocess.run(["ip", "netns", "exec", where, "tc", "qdisc", "del", "dev",
                                    device, "root"], capture_output=True, timeout=30)
                    continue
                burst = max(16384, mbit_per_s * 1_000_000 // 8 * 160 // 1_000_000)
                _run("ip", "netns", "exec", where, "tc", "qdisc", "replace", "dev", device,
                     "root", "tbf", "rate", f"{mbit_per_s}mbit", "burst", str(burst),
                     "latency", "50ms")

    def processes(self) -> list[int]:
        """The pids of every process on the hosts but their sshd listeners."""
        listeners = {process.pid for process in self._sshd.values()}
        pids = []
        for namespace in self._namespaces.values():
            listed = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True,
                                    text=True)
            pids += [int(pid) for pid in listed.stdout.split() if int(pid) not in listeners]
        return pids

    def remove(self) -> None:
        """Stop everything on the hosts and delete them (safe to call twice)."""
        for process in self._sshd.values():
            if process.poll() is None:
                process.terminate()
        for pid in self.processes():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for process in self._sshd.values():
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
        for namespace in [*self._namespaces.values(), self._switch]:
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True, timeout=30)
            shutil.rmtree(_NETNS_ETC / namespace, ignore_errors=True)

    def _create(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.key))
        (self.directory / "authorized_keys").write_text(
            self.key.with_suffix(".pub").read_text())
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation directory
        _run("ip", "netns", "add", self._switch)
        _run("ip", "-n", self._switch, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", self._switch, "link", "set", "br0", "up")
        hosts_file = "127.0.0.1 localhost\n" + "".join(
            f"{address} {name}\n" for name, address in self.addresses.items())
        for index, name in enumerate(self.names):
            self._add_host(index, name, hosts_file)
        for name in self.names:
            self._start_sshd(name)
        self._wait_until_reachable()

    def _add_host(self, index: int, name: str, hosts_file: str) -> None:
        namespace = self._namespaces[name]
        inner, outer = f"{namespace}i", f"{namespace}o"
        _run("ip", "netns", "add", namespace)
        _run("ip", "link", "add", inner, "type", "veth", "peer", "name", outer)
        _run("ip", "link", "set", inner, "netns", namespace)
        _run("ip", "link", "set", outer, "netns", self._switch)
        _run("ip", "-n", self._switch, "link", "set", outer, "master", "br0")
        _run("ip", "-n", self._switch, "link", "set", outer, "up")
        _run("ip", "-n", namespace, "link", "set", inner, "name", self.interface)
        _run("ip", "-n", namespace, "addr", "add", f"{self.addresses[name]}/24", "dev",
             self.interface)
        _run("ip", "-n", namespace, "link", "set", self.interface, "up")
        _run("ip", "-n", namespace, "link", "set", "lo", "up")
        etc = _NETNS_ETC / namespace
        (etc / "ssh").mkdir(parents=True, exist_ok=True)
        (etc / "hosts").write_text(hosts_file)
        # The client's settings on this host: known host keys in the run's folder (they
        # are new each run), no password prompts.
        (etc / "ssh" / "ssh_config").write_text(
            "Host *\n"
            f"    UserKnownHostsFile {self.directory / 'known_hosts'}\n"
            "    StrictHostKeyChecking no\n"
            "    BatchMode yes\n"
            "    LogLevel ERROR\n")

    def _start_sshd(self, name: str) -> None:
        host_key = self.directory / f"host_key_{name}"
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key))
        config = self.directory / f"sshd_config_{name}"
        config.write_text(
            f"ListenAddress {self.addresses[name]}\n"
            "Port 22\n"
            f"HostKey {host_key}\n"
            f"PidFile {self.directory / f'sshd_{name}.pid'}\n"
            f"AuthorizedKeysFile {self.directory / 'authorized_keys'}\n"
            "PermitRootLogin prohibit-password\n"
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            "UsePAM no\n"
            "StrictModes no\n"
            "MaxStartups 100\n"
            "MaxSessions 100\n")
        log = open(self.directory / f"sshd_{name}.log", "w")  # noqa: SIM115 (lives with sshd)
        self._sshd[name] = subprocess.Popen(
            self.on(name, [SSHD, "-D", "-e", "-f", str(config)]),
            stdout=log, stderr=subprocess.STDOUT)

    def _wait_until_reachable(self, timeout: float = 20.0) -> None:
        first = self.names[0]
        for name in self.names:
            deadline = time.monotonic() + timeout
            while True:
                done = subprocess.run(
                    self.on(first, ["ssh", "-i", str(self.key), name, "hostname"]),
                    capture_output=True, text=True, timeout=30)
                if done.returncode == 0 and done.stdout.strip() == name:
                    break
                if time.monotonic() > deadline:
                    log = (self.directory / f"sshd_{name}.log").read_text()
                    raise RuntimeError(f"ssh to {name} failed: {done.stderr.strip()}\n"
                                       f"its sshd said:\n{log}")
                time.sleep(0.2)
