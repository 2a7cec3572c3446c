"""Probes: everything a check may ask of the machine, behind one replaceable object.

Each probe is bounded in time and never raises: on failure it returns :class:`Unknown` with the
reason ("could not collect", as torch.utils.collect_env does). Tests replace a probe by passing
a subclass (or an instance with attributes swapped) to the context.
"""

from __future__ import annotations

import errno
import functools
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar
import resource
from distdoctor.machine.service_identity import identify
from distdoctor.machine.cpus import cpu_budget
from distdoctor.machine import torch_facts

T = TypeVar("T")


@dataclass(frozen=True)
class Unknown:
    """A probe could not tell; ``reason`` says why. Falsy, so ``if not result`` catches it."""

    reason: str

    def __bool__(self) -> bool:
        return False

    def __str__(self) -> str:
        return f"could not tell ({self.reason})"


def never_raises(fn: Callable[..., T]) -> Callable[..., T | Unknown]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> T | Unknown:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # a probe reports, it does not crash the run
            return Unknown(f"{type(exc).__name__}: {exc}")

    return wrapper


def call_with_deadline(fn: Callable[[], T], timeout: float, what: str) -> T | Unknown:
    """Run a blocking call that has no timeout of its own (getaddrinfo) in a daemon thread."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # carried back to the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, name=f"distdoctor-probe-{what}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        return Unknown(f"{what} did not answer within {timeout:g}s")
    if "error" in box:
        raise box["error"]
    return box["value"]


@dataclass(frozen=True)
class Resolution:
    host: str
    addresses: tuple[str, ...]  # empty: the name does not resolve
    error: str | None = None


@dataclass(frozen=True)
class ConnectResult:
    """Outcome of a bounded TCP connect: open, refused, timeout, no_route, unreachable, error."""

    host: str
    port: int
    status: str
    address: str | None = None
    errno: int | None = None
    detail: str = ""
    elapsed_s: float = 0.0


@dataclass(frozen=True)
class Interface:
    name: str
    up: bool
    ipv4: tuple[str, ...] = ()
    ipv6: tuple[str, ...] = ()
    is_loopback: bool = False

    @property
    def addresses(self) -> tuple[str, ...]:
        return self.ipv4 + self.ipv6


@dataclass(frozen=True)
class Route:
    """The source address (and its interface) the kernel picks to reach a destination."""

    destination: str
    source: str | None
    interface: str | None = None


@dataclass(frozen=True)
class GPU:
    index: int
    name: str
    uuid: str | None = None
    total_memory: int | None = None
    used_memory: int | None = None
    processes: tuple[int, ...] = field(default_factory=tuple)


class Probes:
    """Real probes. Subclass (or replace attributes) to fake the machine in tests."""

    # -- clock ----------------------------------------------------------------------------
    def monotonic(self) -> float:
        return time.monotonic()

    def now(self) -> float:
        return time.time()

    # -- names and sockets ----------------------------------------------------------------
    @never_raises
    def hostname(self) -> str:
        return socket.gethostname()

    @never_raises
    def fqdn(self) -> str:
        return socket.getfqdn()

    @never_raises
    def resolve(self, host: str, timeout: float = 3.0) -> Resolution | Unknown:
        def lookup() -> Resolution:
            try:
                infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
            except socket.gaierror as exc:
                return Resolution(host, (), error=str(exc))
            return Resolution(host, tuple(dict.fromkeys(i[4][0] for i in infos)))

        return call_with_deadline(lookup, timeout, f"DNS lookup of {host}")

    @never_raises
    def connect(self, host: str, port: int, timeout: float = 3.0) -> ConnectResult:
        resolved = self.resolve(host, timeout)
        if isinstance(resolved, Unknown) or not resolved.addresses:
            detail = str(resolved) if isinstance(resolved, Unknown) else (resolved.error or "no address")
            return ConnectResult(host, port, "unresolvable", detail=detail)
        address = resolved.addresses[0]
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        start = time.monotonic()
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect((address, port))
            status, err, detail = "open", None, ""
        except socket.timeout:
            status, err, detail = "timeout", None, f"no answer within {timeout:g}s"
        except OSError as exc:
            err = exc.errno
            detail = exc.strerror or str(exc)
            status = {
                errno.ECONNREFUSED: "refused",
                errno.EHOSTUNREACH: "no_route",
                errno.ENETUNREACH: "no_route",
                errno.ETIMEDOUT: "timeout",
            }.get(err, "error")
        finally:
            sock.close()
        return ConnectResult(host, port, status, address, err, detail, time.monotonic() - start)

    @never_raises
    def can_bind(self, port: int, host: str = "") -> tuple[bool, str]:
        """Whether a TCP listener could bind the port here (as the c10d store would)."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # The c10d store sets SO_REUSEADDR; without it a port in TIME_WAIT would look taken.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
            return True, ""
        except OSError as exc:
            return False, exc.strerror or str(exc)
        finally:
            sock.close()

    @never_raises
    def interfaces(self) -> dict[str, Interface]:
        import netifaces  # loaded when a probe first asks
        import psutil  # loaded when a probe first asks

        stats = psutil.net_if_stats()
        out: dict[str, Interface] = {}
        for name in netifaces.interfaces():
            addrs = netifaces.ifaddresses(name)
            v4 = tuple(a["addr"] for a in addrs.get(netifaces.AF_INET, []) if a.get("addr"))
            v6 = tuple(a["addr"].split("%")[0] for a in addrs.get(netifaces.AF_INET6, []) if a.get("addr"))
            stat = stats.get(name)
            out[name] = Interface(
                name=name,
                up=bool(stat.isup) if stat else False,
                ipv4=v4,
                ipv6=v6,
                is_loopback=name == "lo" or any(a.startswith("127.") for a in v4),
            )
        return out


    @never_raises
    def route(self, address: str) -> Route:
        """The local address and interface used to reach ``address`` (a literal IP).

        A UDP socket's connect() only asks the kernel's routing table: no packet is sent.
        """
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_DGRAM)
        try:
            sock.connect((address, 9))
            source = sock.getsockname()[0]
        finally:
            sock.close()
        interface = None
        nics = self.interfaces()
        if isinstance(nics, dict):
            for nic in nics.values():
                if source in nic.addresses:
                    interface = nic.name
                    break
        return Route(address, source, interface)

    @never_raises
    def arp_unanswered(self, address: str) -> bool | Unknown:
        """Whether this host asked who has ``address`` on its link and got no answer.

        The kernel's neighbour table (/proc/net/arp) holds an on-link IPv4 address with flags
        0x0 while it is INCOMPLETE or FAILED: no host answers ARP for it. A firewall drops TCP,
        not ARP, so this tells "nobody is there" from "packets are dropped". False when the
        entry is resolved or absent (an off-link address goes through a gateway).
        """
        if ":" in address:
            return Unknown("the IPv6 neighbour table is not read")
        with open("/proc/net/arp", encoding="ascii", errors="replace") as table:
            for line in table.read().splitlines()[1:]:
                fields = line.split()
                if len(fields) >= 3 and fields[0] == address:
                    return int(fields[2], 16) == 0
        return False

    @never_raises
    def is_local_address(self, address: str) -> bool:
        """Whether ``address`` belongs to this host (it can be bound here)."""
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.bind((address, 0))
            return True
        except OSError:
            return False
        finally:
            sock.close()

    @never_raises
    def identify_port(self, host: str, port: int, timeout: float = 1.5) -> Any:
        """Whether a c10d store or a foreign service answers on host:port (foreign.identify)."""

        return identify(host, port, timeout)

    # -- files ----------------------------------------------------------------------------
    @never_raises
    def read_text(self, path: str, limit: int = 65536) -> str:
        """At most ``limit`` bytes of a file, decoded leniently (error files may be garbage)."""
        with open(path, "rb") as handle:
            return handle.read(limit).decode("utf-8", errors="replace")

    @never_raises
    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    @never_raises
    def filesystem_type(self, path: str) -> str:
        """The type of the filesystem holding ``path`` (ext4, nfs4, tmpfs...), from /proc/mounts."""
        target = os.path.realpath(path)
        best, best_type = "", ""
        with open("/proc/mounts", encoding="utf-8", errors="replace") as mounts:
            for line in mounts:
                parts = line.split()
                if len(parts) < 3:
                    continue
                mount_point = parts[1].replace("\\040", " ")
                inside = target == mount_point or target.startswith(mount_point.rstrip("/") + "/")
                if inside and len(mount_point) >= len(best):
                    best, best_type = mount_point, parts[2]
        if not best_type:
            raise OSError(f"no mount holds {target}")
        return best_type

    @never_raises
    def rdma_devices(self) -> list[str]:
        """InfiniBand/RoCE devices (/sys/class/infiniband); memlock matters only with them."""
        path = "/sys/class/infiniband"
        return sorted(os.listdir(path)) if os.path.isdir(path) else []

    # -- processes and resources ----------------------------------------------------------
    @never_raises
    def cpu_count(self) -> int:
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)

    @never_raises
    def cpu_budget(self) -> Any:
        """This process's affinity, its cgroup's cpuset and CPU quota (distdoctor.machine.cpus)."""

        return cpu_budget()

    @never_raises
    def memory_total(self) -> int:
        import psutil  # loaded when a probe first asks

        return psutil.virtual_memory().total

    @never_raises
    def rlimit(self, name: str) -> tuple[int, int]:

        return resource.getrlimit(getattr(resource, name))

    @never_raises
    def disk_usage(self, path: str) -> tuple[int, int, int]:
        usage = os.statvfs(path)
        return (usage.f_blocks * usage.f_frsize, usage.f_bavail * usage.f_frsize, usage.f_frsize)

    @never_raises
    def writable(self, path: str) -> bool:
        return os.access(path, os.W_OK)

    @never_raises
    def listeners(self, port: int) -> list[dict[str, Any]]:
        """Processes listening on a TCP port here: pid, command line, address."""
        import psutil  # loaded when a probe first asks

        out = []
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port:
                entry: dict[str, Any] = {"pid": conn.pid, "address": conn.laddr.ip, "cmdline": None}
                if conn.pid:
                    try:
                        entry["cmdline"] = " ".join(psutil.Process(conn.pid).cmdline())
                    except (psutil.Error, OSError):
                        pass
                out.append(entry)
        return out

    # -- torch ----------------------------------------------------------------------------
    @never_raises
    def torch_info(self) -> dict[str, Any]:
        """torch's version, CUDA, NCCL and built backends: from the child the command started
        (distdoctor.machine.torch_facts), else read here (importing torch)."""
        return _fact("torch_info", torch_facts.read_torch_info)

    @never_raises
    def gpus(self) -> list[GPU]:
        """The GPUs this process sees (after CUDA_VISIBLE_DEVICES), without creating a CUDA context.

        Device properties come from torch (torch_facts.read_gpus); memory in use and the
        processes holding it come from NVML when pynvml is installed, matched by UUID (NVML
        numbers GPUs in PCI order, CUDA may not).
        """
        devices = _fact("gpus", torch_facts.read_gpus)
        if isinstance(devices, Unknown) or not devices:
            return devices
        usage = _nvml_usage()
        out = []
        for device in devices:
            used, processes = usage.get(device["uuid"] or "", (None, ()))
            out.append(GPU(index=device["index"], name=device["name"], uuid=device["uuid"],
                           total_memory=device["total_memory"], used_memory=used, processes=processes))
        return out


def _fact(name: str, read_here: Callable[[], T]) -> T | Unknown:
    """One of torch's facts: the prefetched child's answer when the command started one."""
    child = torch_facts.prefetched()
    if child is None:
        return read_here()
    value = child.facts().get(name)
    if isinstance(value, dict) and torch_facts.UNKNOWN_KEY in value:
        return Unknown(str(value[torch_facts.UNKNOWN_KEY]))
    if value is None:
        return Unknown(f"the child process that reads torch gave no {name}")
    return value


def _nvml_usage() -> dict[str, tuple[int | None, tuple[int, ...]]]:
    """UUID -> (bytes in use, PIDs of compute processes), from NVML; {} when NVML is not at hand."""
    try:
        import pynvml  # nvidia-ml-py; optional
    except Exception:
        return {}
    out: dict[str, tuple[int | None, tuple[int, ...]]] = {}
    try:
        pynvml.nvmlInit()
    except Exception:
        return {}
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                uuid = pynvml.nvmlDeviceGetUUID(handle)
                uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
                used = int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
                try:
                    procs = tuple(int(p.pid) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle))
                except Exception:
                    procs = ()
                out[uuid] = (used, procs)
            except Exception:
                continue
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    return out
