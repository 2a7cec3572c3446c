"""Fakes for testing checks: a machine described by plain values instead of probed.

    from distdoctor.fakes import FakeProbes, fake_context
    ctx = fake_context(env={"RANK": "0"}, probes=FakeProbes(gpus=[]))
    findings = list(my_check(ctx))

Used by distdoctor's own tests and by site checks' tests alike. Anything not given falls back to
a harmless default (no GPUs, one loopback interface, every port closed) rather than to the real
machine, so a unit test never depends on where it runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from distdoctor.core.config import Config, load_config
from distdoctor.core.context import CheckContext
from distdoctor.machine.host import build_context
from distdoctor.machine.service_identity import SILENT, PortIdentity
from distdoctor.machine.probes import GPU, ConnectResult, Interface, Probes, Resolution, Route, Unknown
from distdoctor.machine.cpus import CpuBudget


@dataclass
class FakeProbes(Probes):
    host: str = "node-a"
    # name -> addresses; a name absent here does not resolve.
    dns: Mapping[str, Sequence[str]] = field(default_factory=lambda: {"localhost": ["127.0.0.1"], "node-a": ["10.0.0.1"]})
    # (host, port) -> status ("open", "refused", "timeout", "no_route"); default "refused".
    ports: Mapping[tuple[str, int], str] = field(default_factory=dict)
    # ports that cannot be bound here -> error text
    bound_ports: Mapping[int, str] = field(default_factory=dict)
    port_listeners: Mapping[int, list[dict[str, Any]]] = field(default_factory=dict)
    nics: Mapping[str, Interface] | Unknown = field(
        default_factory=lambda: {
            "lo": Interface("lo", True, ("127.0.0.1",), ("::1",), True),
            "eth0": Interface("eth0", True, ("10.0.0.1",)),
        }
    )
    gpu_list: list[GPU] | Unknown = field(default_factory=list)
    torch: dict[str, Any] | Unknown = field(
        default_factory=lambda: {
            "torch": "2.13.0",
            "cuda": None,
            "distributed": True,
            "backends": {"gloo": True, "nccl": False, "mpi": False, "ucc": False, "xccl": False},
            "nccl": None,
        }
    )
    cpus: int | Unknown = 8
    # distdoctor.machine.cpus.CpuBudget; None: an unbound process with `cpus` CPUs and no quota.
    cpu_set: Any = None
    memory: int | Unknown = 64 * 2**30
    limits: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    disks: Mapping[str, tuple[int, int, int]] = field(default_factory=dict)
    writable_paths: Mapping[str, bool] = field(default_factory=dict)
    clock: float = 1000.0
    # destination address -> (source address, interface); default: lo for 127.x, else eth0.
    routes: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    # on-link addresses whose ARP requests get no answer (nobody holds the address)
    arp_silent: frozenset[str] = frozenset()
    # addresses that belong to this host besides the interfaces' own (127.0.0.0/8 always does).
    local_addrs: Sequence[str] = field(default_factory=tuple)
    # (host, port) -> what answers there (distdoctor.machine.service_identity.PortIdentity); default: silent.
    port_identities: Mapping[tuple[str, int], PortIdentity] = field(default_factory=dict)
    # path -> text (read_text / exists); path -> filesystem type
    files: Mapping[str, str] = field(default_factory=dict)
    fs_types: Mapping[str, str] = field(default_factory=dict)
    rdma: list[str] | Unknown = field(default_factory=list)

    def monotonic(self) -> float:
        return self.clock

    def now(self) -> float:
        return 1_700_000_000.0 + self.clock

    def hostname(self) -> str:
        return self.host

    def fqdn(self) -> str:
        return self.host

    def resolve(self, host: str, timeout: float = 3.0) -> Resolution:
        if host in self.dns:
            return Resolution(host, tuple(self.dns[host]))
        # Literal addresses resolve to themselves, as getaddrinfo does.
        if host.replace(".", "").isdigit() or ":" in host:
            return Resolution(host, (host,))
        return Resolution(host, (), error="[Errno -2] Name or service not known")

    def connect(self, host: str, port: int, timeout: float = 3.0) -> ConnectResult:
        resolved = self.resolve(host, timeout)
        if not resolved.addresses:
            return ConnectResult(host, port, "unresolvable", detail=resolved.error or "")
        status = self.ports.get((host, port), "refused")
        return ConnectResult(host, port, status, resolved.addresses[0])

    def can_bind(self, port: int, host: str = "") -> tuple[bool, str]:
        if port in self.bound_ports:
            return False, self.bound_ports[port]
        return True, ""

    def interfaces(self) -> Mapping[str, Interface] | Unknown:
        return self.nics

    def route(self, address: str) -> Route | Unknown:
        if address in self.routes:
            source, interface = self.routes[address]
            return Route(address, source, interface)
        nics = self.nics if isinstance(self.nics, Mapping) else {}
        name = "lo" if address.startswith("127.") or address == "::1" else next((n for n in nics if n != "lo"), "lo")
        nic = nics.get(name)
        source = (nic.ipv4 or nic.ipv6 or (None,))[0] if nic else None
        return Route(address, source, name if nic else None)

    def arp_unanswered(self, address: str) -> bool:
        return address in self.arp_silent

    def is_local_address(self, address: str) -> bool:
        if address.startswith("127.") or address == "::1" or address in self.local_addrs:
            return True
        nics = self.nics if isinstance(self.nics, Mapping) else {}
        return any(address in nic.addresses for nic in nics.values())

    def identify_port(self, host: str, port: int, timeout: float = 1.5) -> PortIdentity:
        return self.port_identities.get((host, port), PortIdentity(SILENT, "fake: nothing answers"))

    def read_text(self, path: str, limit: int = 65536) -> str | Unknown:
        if path in self.files:
            return self.files[path][:limit]
        return Unknown(f"FileNotFoundError: {path}")

    def exists(self, path: str) -> bool:
        return path in self.files

    def filesystem_type(self, path: str) -> str | Unknown:
        best = max((p for p in self.fs_types if path == p or path.startswith(p.rstrip("/") + "/")), key=len, default=None)
        return self.fs_types[best] if best is not None else Unknown(f"no mount holds {path}")

    def rdma_devices(self) -> list[str] | Unknown:
        return self.rdma

    def cpu_count(self) -> int | Unknown:
        return self.cpus

    def cpu_budget(self) -> Any:

        if self.cpu_set is not None or isinstance(self.cpus, Unknown):
            return self.cpu_set if self.cpu_set is not None else self.cpus
        return CpuBudget(affinity=self.cpus, shared=self.cpus)

    def memory_total(self) -> int | Unknown:
        return self.memory

    def rlimit(self, name: str) -> tuple[int, int] | Unknown:
        return self.limits.get(name, (1_048_576, 1_048_576) if name != "RLIMIT_MEMLOCK" else (-1, -1))

    def disk_usage(self, path: str) -> tuple[int, int, int] | Unknown:
        return self.disks.get(path, (64 * 2**30, 60 * 2**30, 4096))

    def writable(self, path: str) -> bool | Unknown:
        return self.writable_paths.get(path, True)

    def listeners(self, port: int) -> list[dict[str, Any]]:
        return list(self.port_listeners.get(port, []))

    def torch_info(self) -> dict[str, Any] | Unknown:
        return self.torch

    def gpus(self) -> list[GPU] | Unknown:
        return self.gpu_list


def fake_gpus(count: int, name: str = "NVIDIA H100 80GB HBM3", memory: int = 80 * 2**30) -> list[GPU]:
    return [
        GPU(index=i, name=name, uuid=f"GPU-00000000-0000-0000-0000-{i:012d}", total_memory=memory, used_memory=0)
        for i in range(count)
    ]


def fake_context(
    env: Mapping[str, str] | None = None,
    *,
    probes: Probes | None = None,
    config: Config | None = None,
    argv: Sequence[str] = ("distdoctor",),
    world: Any = None,
    launch_line: Sequence[str] = (),
) -> CheckContext:
    env = dict(env or {})
    # DISTDOCTOR_* variables in the fake env configure the run, as they do for real.
    config = config or load_config({}, env=env, use_pyproject=False)
    launch = None
    if launch_line:  # `distdoctor check -- <launch line>`: the world the line will form
        from distdoctor.machine.launch_line import parse_launch_line
        from distdoctor.machine.launchers import planned_launch

        launch = planned_launch(parse_launch_line(list(launch_line)), env)
    return build_context(config, env=env, argv=list(argv), probes=probes or FakeProbes(), world=world, launch=launch)
