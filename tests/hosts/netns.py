"""Hosts made of Linux network namespaces, for real multi-host faults on one machine.

A :class:`Lab` is a small private network: one namespace holds a bridge, and each "host" is a
namespace joined to it by a veth pair, with its own address in a private test subnet, its own
host name and its own /etc/hosts view (the process is started under ``unshare --uts --mount``).
Nothing is created in, or changed on, the root namespace's interfaces: the veth pairs are
created inside the bridge namespace and their host ends moved straight into the host
namespaces, so deleting the namespaces deletes every link.

Everything the lab creates carries the prefix ``ddtest-<pid>-`` (the pid of the process that
made it) and is listed in a registry; :meth:`Lab.close` removes exactly that, and
:func:`cleanup_stale` removes what a crashed earlier run of this prefix left, judged by its pid
no longer being alive. Anything else is never touched.
"""

from __future__ import annotations

import atexit
import ipaddress
import itertools
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

PREFIX = "ddtest-"
OWN_PREFIX = f"{PREFIX}{os.getpid()}-"
STALE_NAME = re.compile(rf"^{re.escape(PREFIX)}(\d+)-")
# Interfaces inside the namespaces: the host end of each veth, and the bridge ports.
HOST_IFNAME = "eth0"
BRIDGE_NAME = "ddbr0"
PORT_PREFIX = "ddp"
DEFAULT_SUBNET = "10.231.0.0/24"
IP_TIMEOUT = 10.0

_serial = itertools.count(1)
_live_labs: list["Lab"] = []
# Every process any lab of this test process started, for the end-of-session check.
ALL_STARTED: list["Started"] = []
_lock = threading.Lock()


class LabUnavailable(RuntimeError):
    """Namespaces cannot be made here; the message says why (tests skip with it)."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["ip", *args], capture_output=True, text=True, timeout=IP_TIMEOUT, check=check
    )


def _tc(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["tc", *args], capture_output=True, text=True, timeout=IP_TIMEOUT, check=check
    )


def why_unavailable() -> str | None:
    """None when namespaces can be made here, else the reason."""
    if os.name != "posix" or not Path("/proc/self/ns/net").exists():
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root (run the hosts tests as root, as CI does)"
    for tool in ("ip", "tc", "unshare", "hostname", "mount"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (iproute2 / util-linux)"
    probe = f"{OWN_PREFIX}probe{next(_serial)}"
    try:
        made = _ip("netns", "add", probe, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"`ip netns add` failed: {exc}"
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def list_namespaces() -> list[str]:
    out = _ip("netns", "list", check=False).stdout
    # Lines look like "name" or "name (id: 3)".
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def namespace_pids(ns: str) -> list[int]:
    out = _ip("netns", "pids", ns, check=False).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_namespace_processes(ns: str, grace: float = 2.0) -> None:
    """SIGTERM, then SIGKILL, every process whose network namespace is ``ns`` (ours only)."""
    pids = namespace_pids(ns)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    while pids and time.monotonic() < deadline:
        pids = [p for p in namespace_pids(ns)]
        if pids:
            time.sleep(0.05)
    for pid in namespace_pids(ns):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    while namespace_pids(ns) and time.monotonic() < deadline:
        time.sleep(0.05)


def delete_namespace(ns: str) -> None:
    if not ns.startswith(PREFIX):
        raise ValueError(f"refusing to delete namespace {ns!r}: not made by these tests")
    _kill_namespace_processes(ns)
    _ip("netns", "del", ns, check=False)


def cleanup_stale() -> list[str]:
    """Delete ``ddtest-<pid>-*`` namespaces and temp dirs whose creating process is gone."""
    removed: list[str] = []
    for ns in list_namespaces():
        match = STALE_NAME.match(ns)
        if match and int(match.group(1)) != os.getpid() and not _pid_alive(int(match.group(1))):
            delete_namespace(ns)
            removed.append(ns)
    for path in Path(tempfile.gettempdir()).glob(f"{PREFIX}*"):
        match = STALE_NAME.match(path.name)
        if match and int(match.group(1)) != os.getpid() and not _pid_alive(int(match.group(1))):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(str(path))
    return removed


@dataclass
class Host:
    name: str  # the host name its processes see (hostname, /etc/hosts)
    ns: str
    address: str
    port: str  # the bridge port (in the bridge namespace) that leads to this host
    ifname: str = HOST_IFNAME
    mac: str = ""
    hosts_file: Path | None = None


@dataclass
class Started:
    """A process started in a host; its output goes to files so pipes never fill up."""

    host: Host
    popen: subprocess.Popen
    stdout_path: Path
    stderr_path: Path
    started_at: float
    label: str
    ended_at: float | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def wait(self, timeout: float) -> int | None:
        """The exit code, or None when it is still running after ``timeout`` s."""
        try:
            code = self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        if self.ended_at is None:
            self.ended_at = time.monotonic()
        return code

    @property
    def elapsed(self) -> float | None:
        return None if self.ended_at is None else self.ended_at - self.started_at

    @property
    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace") if self.stdout_path.exists() else ""

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""

    def kill(self) -> None:
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                self.popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass


# Run in the host's own UTS and mount namespaces: set the host name, show the host its own
# /etc/hosts, then exec the command (no extra process stays in between).
_ENTER_HOST = 'hostname "$1" && mount --bind "$2" /etc/hosts && shift 2 && exec "$@"'


@dataclass
class Lab:
    """2-3 hosts on one bridge. Use as a context manager, or call :meth:`close`."""

    host_names: Sequence[str] = ("hosta", "hostb")
    # A host's network interface name when it is not eth0 (clusters mix eth0, ens5, ib0...).
    ifnames: Mapping[str, str] = field(default_factory=dict)
    subnet: str = DEFAULT_SUBNET
    serial: int = field(default_factory=lambda: next(_serial))
    hosts: dict[str, Host] = field(default_factory=dict)
    namespaces: list[str] = field(default_factory=list)  # the registry: what close() removes
    processes: list[Started] = field(default_factory=list)
    workdir: Path | None = None
    closed: bool = False

    @property
    def prefix(self) -> str:
        return f"{OWN_PREFIX}{self.serial}-"

    @property
    def bridge_ns(self) -> str:
        return f"{self.prefix}br"

    # -- building ------------------------------------------------------------------------
    def __post_init__(self) -> None:
        reason = why_unavailable()
        if reason:
            raise LabUnavailable(reason)
        with _lock:
            _live_labs.append(self)
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _add_namespace(self, ns: str) -> None:
        _ip("netns", "add", ns)
        self.namespaces.append(ns)
        _ip("-n", ns, "link", "set", "lo", "up")

    def _build(self) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix=self.prefix))
        network = ipaddress.ip_network(self.subnet)
        addresses = list(network.hosts())
        self._add_namespace(self.bridge_ns)
        _ip("-n", self.bridge_ns, "link", "add", BRIDGE_NAME, "type", "bridge", "forward_delay", "0", "stp_state", "0")
        _ip("-n", self.bridge_ns, "link", "set", BRIDGE_NAME, "up")
        for index, name in enumerate(self.host_names):
            ns = f"{self.prefix}{name}"
            self._add_namespace(ns)
            port = f"{PORT_PREFIX}{index}"
            ifname = self.ifnames.get(name, HOST_IFNAME)
            host = Host(name=name, ns=ns, address=str(addresses[index]), port=port, ifname=ifname)
            # Both ends are made inside the bridge namespace; the host end moves straight into
            # the host namespace, so the root namespace never sees either.
            _ip("-n", self.bridge_ns, "link", "add", port, "type", "veth", "peer", "name", ifname, "netns", ns)
            _ip("-n", self.bridge_ns, "link", "set", port, "master", BRIDGE_NAME)
            _ip("-n", self.bridge_ns, "link", "set", port, "up")
            _ip("-n", ns, "addr", "add", f"{host.address}/{network.prefixlen}", "dev", ifname)
            _ip("-n", ns, "link", "set", ifname, "up")
            host.mac = self._mac(ns, ifname)
            self.hosts[name] = host
        # Permanent neighbour entries: packets between hosts need no ARP, so a partition drops
        # the TCP packets themselves (connect times out, as behind a firewall) instead of
        # failing the address resolution (which the kernel reports as "no route to host").
        for host in self.hosts.values():
            for peer in self.hosts.values():
                if peer is not host:
                    _ip("-n", host.ns, "neigh", "replace", peer.address, "lladdr", peer.mac,
                        "dev", host.ifname, "nud", "permanent")
        for host in self.hosts.values():
            host.hosts_file = self.write_hosts_file(host.name, {})

    @staticmethod
    def _mac(ns: str, ifname: str) -> str:
        out = _ip("-n", ns, "-o", "link", "show", ifname).stdout
        match = re.search(r"link/ether ([0-9a-f:]{17})", out)
        if not match:
            raise RuntimeError(f"no MAC address for {ifname} in {ns}: {out!r}")
        return match.group(1)

    def write_hosts_file(self, for_host: str, overrides: Mapping[str, str]) -> Path:
        """An /etc/hosts for ``for_host``: every lab host by its address, then ``overrides``
        (name -> address, e.g. ``{"hostb": "127.0.1.1"}`` as Debian's installer writes)."""
        assert self.workdir is not None
        names = {name: host.address for name, host in self.hosts.items()}
        names.update(overrides)
        lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
        lines += [f"{address}\t{name}" for name, address in names.items()]
        path = self.workdir / f"hosts.{for_host}.{len(list(self.workdir.glob('hosts.*')))}"
        path.write_text("\n".join(lines) + "\n")
        return path

    def set_hosts_view(self, host: str, overrides: Mapping[str, str]) -> None:
        """Give ``host`` a different /etc/hosts for the processes started after this."""
        self.hosts[host].hosts_file = self.write_hosts_file(host, overrides)

    # -- faults --------------------------------------------------------------------------
    def partition(self, host: str) -> str:
        """Drop every packet to and from ``host`` at both ends of its link.

        ``tc qdisc add dev <veth> root netem loss 100%`` where the kernel has sch_netem; kernels
        built without it (this CI's) get a pfifo queue of length 0, which drops every packet
        just the same. Returns the qdisc used, for the test's record.
        """
        h = self.hosts[host]
        ends = ((h.ns, h.ifname), (self.bridge_ns, h.port))
        used = None
        for ns, dev in ends:
            netem = _tc("-n", ns, "qdisc", "replace", "dev", dev, "root", "netem", "loss", "100%", check=False)
            if netem.returncode == 0:
                used = "netem loss 100%"
                continue
            _tc("-n", ns, "qdisc", "replace", "dev", dev, "root", "pfifo", "limit", "0")
            used = used or "pfifo limit 0 (this kernel has no sch_netem)"
        return used or ""

    def heal(self, host: str) -> None:
        h = self.hosts[host]
        for ns, dev in ((h.ns, h.ifname), (self.bridge_ns, h.port)):
            _tc("-n", ns, "qdisc", "del", "dev", dev, "root", check=False)

    def dropped_packets(self, host: str) -> int:
        """Packets dropped by the partition qdiscs of ``host`` (to show the partition was hit)."""
        h = self.hosts[host]
        total = 0
        for ns, dev in ((h.ns, h.ifname), (self.bridge_ns, h.port)):
            out = _tc("-n", ns, "-s", "qdisc", "show", "dev", dev, check=False).stdout
            total += sum(int(n) for n in re.findall(r"dropped (\d+)", out))
        return total

    # -- running -------------------------------------------------------------------------
    def command_in(self, host: str, argv: Sequence[str]) -> list[str]:
        h = self.hosts[host]
        return ["ip", "netns", "exec", h.ns, "unshare", "--uts", "--mount", "--propagation", "private",
                "sh", "-c", _ENTER_HOST, "enter-host", h.name, str(h.hosts_file), *argv]

    def spawn(self, host: str, argv: Sequence[str], env: Mapping[str, str] | None = None,
              label: str | None = None, cwd: str | None = None) -> Started:
        """Start ``argv`` on ``host`` (its own namespace, host name and /etc/hosts)."""
        if self.closed:
            raise RuntimeError("the lab is closed")
        assert self.workdir is not None
        label = label or f"{host}-{len(self.processes)}"
        out = self.workdir / f"{label}.out"
        err = self.workdir / f"{label}.err"
        with open(out, "wb") as stdout, open(err, "wb") as stderr:
            popen = subprocess.Popen(
                self.command_in(host, argv), stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                env=dict(env) if env is not None else None, cwd=cwd, start_new_session=True,
            )
        started = Started(self.hosts[host], popen, out, err, time.monotonic(), label)
        self.processes.append(started)
        ALL_STARTED.append(started)
        return started

    def run(self, host: str, argv: Sequence[str], timeout: float = 20.0) -> subprocess.CompletedProcess:
        """Run a short command on ``host`` and wait for it (bounded)."""
        return subprocess.run(self.command_in(host, argv), capture_output=True, text=True, timeout=timeout)

    # -- removing ------------------------------------------------------------------------
    def close(self) -> None:
        """Remove everything this lab made: processes, namespaces (with their links), files."""
        if self.closed:
            return
        self.closed = True
        for started in self.processes:
            started.kill()
        for ns in reversed(self.namespaces):
            delete_namespace(ns)
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
        with _lock:
            if self in _live_labs:
                _live_labs.remove(self)

    def __enter__(self) -> "Lab":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __eq__(self, other: object) -> bool:  # identity: two labs are never the same lab
        return self is other

    __hash__ = object.__hash__


def close_all() -> None:
    """Close every lab still open in this process (atexit and signal handlers call this)."""
    with _lock:
        labs = list(_live_labs)
    for lab in labs:
        try:
            lab.close()
        except Exception:  # keep closing the others
            pass


def leftovers() -> dict[str, list]:
    """What this process made that still exists (empty lists when everything was removed)."""
    namespaces = [ns for ns in list_namespaces() if ns.startswith(OWN_PREFIX)]
    root_links = [
        line.split(":")[1].strip().split("@")[0]
        for line in _ip("-o", "link", "show", check=False).stdout.splitlines()
        if line.count(":") >= 2
    ]
    links = [name for name in root_links if name.startswith((PORT_PREFIX, BRIDGE_NAME))]
    dirs = [str(p) for p in Path(tempfile.gettempdir()).glob(f"{OWN_PREFIX}*")]
    stale = [ns for ns in list_namespaces()
             if (m := STALE_NAME.match(ns)) and not _pid_alive(int(m.group(1)))]
    processes = [f"{s.label} (pid {s.pid})" for s in ALL_STARTED if s.popen.poll() is None]
    return {"namespaces": namespaces + stale, "root_links": links, "dirs": dirs, "processes": processes}


_installed = False


def install_exit_handlers() -> None:
    """Close the labs at interpreter exit and on SIGTERM/SIGHUP (pytest handles SIGINT itself
    by raising KeyboardInterrupt, which runs the fixtures' finalizers)."""
    global _installed
    if _installed:
        return
    _installed = True
    atexit.register(close_all)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        previous = signal.getsignal(signum)

        def handler(sig, frame, previous=previous):
            close_all()
            if callable(previous):
                previous(sig, frame)
            else:
                signal.signal(sig, signal.SIG_DFL)
                os.kill(os.getpid(), sig)

        signal.signal(signum, handler)
