"""The network from this host's view: names, interfaces, *_SOCKET_IFNAME, the rendezvous port.

Every probe here is bounded: DNS lookups run under a 2 s deadline, connects under 2 s, and
telling a c10d store from a foreign service takes at most 1.5 s (distdoctor.machine.service_identity).
"""

from __future__ import annotations

import ipaddress
from typing import Any

from distdoctor.machine import service_identity as foreign

from distdoctor.checks._support import socket_ifname as ifname

from distdoctor.checks._support import remedies
from distdoctor.core.context import CheckContext
from distdoctor.checks._support.init_method import rendezvous_endpoint
from distdoctor.machine.launchers import KUBEFLOW, SLURM, TORCHRUN
from distdoctor.machine.probes import Interface, Resolution, Unknown
from distdoctor.core.registry import check, finding_kind

DNS_TIMEOUT = 2.0
CONNECT_TIMEOUT = 2.0
IDENTIFY_TIMEOUT = 1.5

MASTER_UNRESOLVABLE = finding_kind(
    "net.C001", cause="hostname_unresolvable",
    title="MASTER_ADDR does not resolve",
    hint="Set MASTER_ADDR to a name every node resolves (or to rank 0's IP address)",
)
MASTER_RESOLVE_UNKNOWN = finding_kind(
    "net.I002", cause="hostname_unresolvable",
    title="Could not tell whether MASTER_ADDR resolves",
    hint="Check the resolver (/etc/resolv.conf); use an IP address for MASTER_ADDR",
)
OWN_NAME_UNRESOLVABLE = finding_kind(
    "net.W003", cause="hostname_unresolvable",
    title="This host's own name does not resolve",
    hint="Add the host name to /etc/hosts or DNS, or set GLOO_SOCKET_IFNAME",
)
OWN_NAME_BREAKS_GLOO = finding_kind(
    "net.E004", cause="hostname_unresolvable",
    title="This host's name does not resolve and Gloo relies on it in a multi-host job",
    hint="Set GLOO_SOCKET_IFNAME to the interface that reaches the other hosts",
)
MASTER_IS_LOOPBACK = finding_kind(
    "net.E005", cause="wrong_interface",
    title="MASTER_ADDR is a loopback address in a multi-host job",
    hint="Set MASTER_ADDR to rank 0's routable address or host name",
)
HOSTNAME_IS_LOOPBACK = finding_kind(
    "net.E006", cause="wrong_interface",
    title="This host's name resolves to a loopback address in a multi-host Gloo job",
    hint="Set GLOO_SOCKET_IFNAME, or fix /etc/hosts so the host name maps to a routable address",
)
HOSTNAME_IS_LOOPBACK_RISK = finding_kind(
    "net.W007", cause="wrong_interface",
    title="This host's name resolves to a loopback address in a multi-host job",
    hint="Set GLOO_SOCKET_IFNAME (Gloo is used for CPU tensors and object collectives)",
)
IFNAME_UNUSABLE = finding_kind(
    "net.E008", cause="wrong_interface",
    title="*_SOCKET_IFNAME names no usable interface",
    hint="Set it to an interface that exists, is up and has an address (see `ip -br addr`)",
)
IFNAME_SUSPICIOUS = finding_kind(
    "net.W009", cause="wrong_interface",
    title="*_SOCKET_IFNAME is written in a way the library reads differently",
    hint="Write a plain comma-separated list without blanks or repeats",
)
VIRTUAL_INTERFACE = finding_kind(
    "net.W010", cause="wrong_interface",
    title="NCCL or Gloo would use a docker bridge or virtual interface",
    hint="Set NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME to the physical interface",
)
MASTER_UNREACHABLE = finding_kind(
    "net.E011", cause="master_unreachable",
    title="Nothing answers at MASTER_ADDR:MASTER_PORT",
    hint="Check that rank 0's store is running and MASTER_ADDR/MASTER_PORT point at it",
)
FIREWALLED = finding_kind(
    "net.E012", cause="firewall",
    title="Connections to MASTER_ADDR:MASTER_PORT time out (dropped by a firewall?)",
    hint="Open the port between the nodes (security group, iptables/nftables, firewalld)",
)
PORT_IN_USE = finding_kind(
    "net.E013", cause="port_in_use",
    title="MASTER_PORT is already taken on the master host",
    hint="Pick a free MASTER_PORT, or end the process that holds it",
)
FOREIGN_SERVICE = finding_kind(
    "net.E014", cause="foreign_service_on_port",
    title="A service that is not a c10d store listens on MASTER_PORT",
    hint="Pick another MASTER_PORT; this one belongs to another service",
)
PORT_SERVICE_UNKNOWN = finding_kind(
    "net.I015", cause="foreign_service_on_port",
    title="Could not tell whether the service on MASTER_PORT is a c10d store",
    hint="Check which process listens on the port (ss -ltnp)",
)
ADDRESS_FAMILY = finding_kind(
    "net.W016", cause="master_unreachable",
    title="MASTER_ADDR uses an address family or scope this host cannot reach",
    hint="Use an IPv4 address (or a routable IPv6 one) for MASTER_ADDR",
)
IFNAME_UNKNOWN = finding_kind(
    "net.I017", cause="wrong_interface",
    title="Could not tell whether *_SOCKET_IFNAME names usable interfaces",
    hint="Compare the variable with `ip -br addr`",
)


# -- shared facts -----------------------------------------------------------------------------

def resolve(ctx: CheckContext, host: str) -> Resolution | Unknown:
    return ctx.memo(f"resolve:{host}", lambda: ctx.probes.resolve(host, DNS_TIMEOUT))


def interfaces(ctx: CheckContext) -> dict[str, Interface] | Unknown:
    return ctx.memo("interfaces", ctx.probes.interfaces)


def endpoint(ctx: CheckContext) -> tuple[str | None, int | None, str]:
    launch = ctx.launch
    host = launch.master_addr.strip() if launch.master_addr else None
    if launch.planned is not None:
        return host or None, launch.master_port.value, "the launch line's endpoint"
    return rendezvous_endpoint(ctx.config, host or None, launch.master_port.value)


def multi_host(ctx: CheckContext) -> bool | None:
    """True when the world spans more than one host; None when the environment does not say."""
    launch = ctx.launch
    if launch.scheduler_nodes and launch.scheduler_nodes.value:
        return launch.scheduler_nodes.value > 1
    size, local = launch.world_size.value, launch.local_world_size.value
    if size is not None and local is not None:
        return size > local
    if ctx.env.get("PET_NNODES", "").strip().isdigit():
        return int(ctx.env["PET_NNODES"]) > 1
    return None


def is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%", 1)[0]).is_loopback
    except ValueError:
        return address.lower() in ("localhost", "localhost.localdomain", "ip6-localhost")


def routable_interface(ctx: CheckContext) -> Interface | None:
    """The interface to name instead of loopback: up, not loopback, not virtual, with IPv4."""
    nics = interfaces(ctx)
    if not isinstance(nics, dict):
        return None
    candidates = [n for n in nics.values() if n.up and not n.is_loopback and n.ipv4]
    physical = [n for n in candidates if not ifname.is_virtual(n.name)]
    pool = physical or candidates
    return pool[0] if pool else None


def _own_address_text(ctx: CheckContext) -> str:
    """This host's routable address, to suggest as MASTER_ADDR when this host is rank 0's."""
    nic = routable_interface(ctx)
    return f"{nic.ipv4[0]} on {nic.name}" if nic else "see `ip -br addr`"


def on_master_host(ctx: CheckContext, host: str) -> bool | None:
    """Whether MASTER_ADDR is an address of this host (so this host runs the store)."""
    resolved = resolve(ctx, host)
    if not isinstance(resolved, Resolution) or not resolved.addresses:
        return None
    return any(ctx.probes.is_local_address(a) is True for a in resolved.addresses)


def agent_store_expected(ctx: CheckContext) -> bool:
    """torchrun's agent hosts the store on MASTER_PORT and hands it to the workers."""
    return ctx.env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"


def _set_master_addr(ctx: CheckContext, value: str) -> str:
    launcher = ctx.launch.launcher
    if launcher == TORCHRUN or TORCHRUN in ctx.launch.also_present:
        return f"torchrun --rdzv-endpoint={value}:<port> (or --master-addr={value}) on every node"
    if launcher == SLURM:
        return 'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1) in the sbatch script'
    if launcher == KUBEFLOW:
        return "let the PyTorchJob operator set MASTER_ADDR (the master pod's service name); do not override it"
    return remedies.set_env(ctx, "MASTER_ADDR", value)


def _ranks_text(ctx: CheckContext) -> str:
    size, local = ctx.launch.world_size.value, ctx.launch.local_world_size.value
    return f"WORLD_SIZE={size}, LOCAL_WORLD_SIZE={local}" if size is not None else "the job spans several hosts"


# -- names ------------------------------------------------------------------------------------

@check(stage="local", tags=("network", "dns"), emits=(MASTER_UNRESOLVABLE, MASTER_RESOLVE_UNKNOWN))
def master_resolves(ctx: CheckContext):
    """MASTER_ADDR (or the tcp:// init_method host) resolves, within a bounded time."""
    host, _port, source = endpoint(ctx)
    if not host:
        return
    result = resolve(ctx, host)
    if isinstance(result, Unknown):
        yield MASTER_RESOLVE_UNKNOWN(
            f"Could not tell whether {host} resolves: {result.reason}",
            detail=f"{source} names {host}; the lookup did not finish within {DNS_TIMEOUT:g}s. "
            "A slow resolver delays every rank's rendezvous and may make it time out.",
            remediation=f"Check the resolver (getent hosts {host}; /etc/resolv.conf), or use rank 0's IP address: "
            + _set_master_addr(ctx, "<rank 0 IP>"),
            data={"host": host, "source": source, "reason": result.reason},
        )
    elif not result.addresses:
        yield MASTER_UNRESOLVABLE(
            f"{host} does not resolve ({source})",
            detail=f"getaddrinfo({host!r}) failed: {result.error or 'no address'}. Every rank fails to "
            "connect to the store (\"Name or service not known\" / DistNetworkError).",
            remediation="Use a name every node resolves, or rank 0's IP address: " + _set_master_addr(ctx, "<rank 0 host or IP>"),
            data={"host": host, "source": source, "error": result.error},
        )


@check(stage="local", tags=("network", "dns"), emits=(OWN_NAME_UNRESOLVABLE, OWN_NAME_BREAKS_GLOO))
def own_hostname_resolves(ctx: CheckContext):
    """This host's own name resolves (Gloo uses it to pick its address when GLOO_SOCKET_IFNAME is unset)."""
    if not ctx.launch.is_distributed:
        return
    name = ctx.memo("hostname", ctx.probes.hostname)
    if not isinstance(name, str) or not name:
        return
    result = resolve(ctx, name)
    if isinstance(result, Unknown) or result.addresses:
        return
    nic = routable_interface(ctx)
    fix_iface = nic.name if nic else "<interface>"
    gloo_pinned = len(ctx.env.get("GLOO_SOCKET_IFNAME", "")) > 1
    detail = (
        f"getaddrinfo({name!r}) failed: {result.error or 'no address'}. Without GLOO_SOCKET_IFNAME, "
        "Gloo looks up the host name to choose its address; failing that it logs \"Unable to resolve "
        "hostname to a (local) address. Using the loopback address as fallback.\""
    )
    data = {"hostname": name, "error": result.error, "suggested_interface": fix_iface}
    if multi_host(ctx) and not gloo_pinned:
        yield OWN_NAME_BREAKS_GLOO(
            f"Host name {name!r} does not resolve; Gloo will advertise loopback to the other hosts",
            detail=detail + " Peers on other hosts then cannot connect: the job fails or hangs.",
            remediation=remedies.set_env(ctx, "GLOO_SOCKET_IFNAME", fix_iface) + f"; or add '{nic.ipv4[0] if nic else '<ip>'} {name}' to /etc/hosts",
            data=data,
        )
    else:
        yield OWN_NAME_UNRESOLVABLE(
            f"Host name {name!r} does not resolve",
            detail=detail,
            remediation="Add the name to /etc/hosts or DNS, or " + remedies.set_env(ctx, "GLOO_SOCKET_IFNAME", fix_iface),
            data=data,
        )


# -- loopback in a multi-host world -----------------------------------------------------------

@check(stage="local", tags=("network",), emits=(MASTER_IS_LOOPBACK, HOSTNAME_IS_LOOPBACK, HOSTNAME_IS_LOOPBACK_RISK))
def loopback_in_multi_host(ctx: CheckContext):
    """A multi-host world whose MASTER_ADDR, or whose host name, is a loopback address."""
    if not multi_host(ctx):
        return
    nic = routable_interface(ctx)
    instead = f"{nic.name} ({nic.ipv4[0]})" if nic else "a routable interface"
    data: dict[str, Any] = {"suggested_interface": nic.name if nic else None, "suggested_address": nic.ipv4[0] if nic else None}
    host, _port, source = endpoint(ctx)
    if host:
        resolved = resolve(ctx, host)
        addresses = resolved.addresses if isinstance(resolved, Resolution) else ()
        if is_loopback(host) or (addresses and all(is_loopback(a) for a in addresses)):
            yield MASTER_IS_LOOPBACK(
                f"MASTER_ADDR={host} is loopback, but {_ranks_text(ctx)}",
                detail=f"{source} resolves to {', '.join(addresses) or host}: ranks on other hosts connect to "
                "their own loopback, where no store listens, and the rendezvous never completes.",
                remediation=f"Use rank 0's routable address, e.g. this host's {instead} if rank 0 runs here: "
                + _set_master_addr(ctx, nic.ipv4[0] if nic else "<rank 0 address>"),
                data={**data, "master_addr": host, "addresses": list(addresses)},
            )
    name = ctx.memo("hostname", ctx.probes.hostname)
    if not isinstance(name, str):
        return
    resolved = resolve(ctx, name)
    if not isinstance(resolved, Resolution) or not resolved.addresses:
        return
    if not all(is_loopback(a) for a in resolved.addresses):
        return
    if len(ctx.env.get("GLOO_SOCKET_IFNAME", "")) > 1:
        return  # Gloo is pinned to an interface and does not use the host name
    kind = HOSTNAME_IS_LOOPBACK if ctx.backend == "gloo" else HOSTNAME_IS_LOOPBACK_RISK
    yield kind(
        f"Host name {name!r} resolves to {', '.join(resolved.addresses)} in a multi-host job",
        detail="Without GLOO_SOCKET_IFNAME, Gloo binds the address the host name resolves to and "
        "advertises it to its peers: they receive 127.x and cannot connect (the job fails or hangs). "
        "Typical cause: an /etc/hosts line '127.0.1.1 <hostname>' or a container's generated hosts file."
        + ("" if kind is HOSTNAME_IS_LOOPBACK else " This job's backend is not gloo, but Gloo still serves CPU tensors and object collectives (broadcast_object_list, barrier on CPU groups)."),
        remediation=remedies.set_env(ctx, "GLOO_SOCKET_IFNAME", nic.name if nic else "<interface>")
        + f" (this host's routable interface: {instead}); or map {name} to that address in /etc/hosts",
        data={**data, "hostname": name, "addresses": list(resolved.addresses)},
    )


# -- *_SOCKET_IFNAME --------------------------------------------------------------------------

def _usable(nic: Interface) -> bool:
    return nic.up and bool(nic.addresses)


def _why_unusable(nic: Interface | None, name: str) -> str:
    if nic is None:
        return f"{name} does not exist"
    if not nic.up:
        return f"{name} is down"
    return f"{name} has no address"


def _ifname_specs(ctx: CheckContext) -> list[Any]:
    specs = []
    if "GLOO_SOCKET_IFNAME" in ctx.env:
        specs.append(ifname.parse_gloo(ctx.env["GLOO_SOCKET_IFNAME"]))
    if "NCCL_SOCKET_IFNAME" in ctx.env:
        specs.append(ifname.parse_nccl(ctx.env["NCCL_SOCKET_IFNAME"]))
    return specs


def _chosen_interfaces(ctx: CheckContext, spec: Any, nics: dict[str, Interface], existing: str, suggestion: str):
    """The interfaces a variable selects (list), or the finding that says none is usable."""
    var = spec.variable
    if spec.style == ifname.GLOO:
        bad = [(n, _why_unusable(nics.get(n), n)) for n in spec.names if n not in nics or not _usable(nics[n])]
        if bad:
            return IFNAME_UNUSABLE(
                f"{var}={spec.raw!r}: {'; '.join(why for _, why in bad)}",
                detail=f"torch creates one Gloo device per listed interface; init_process_group fails with "
                f"\"Unable to find address for: {bad[0][0]}\". Interfaces here: {existing}.",
                remediation=remedies.set_env(ctx, var, suggestion),
                data={"variable": var, "value": spec.raw, "unusable": [n for n, _ in bad], "interfaces": list(nics)},
            )
        return list(spec.names)
    matched = spec.select(nics)
    chosen = [n for n in matched if _usable(nics[n])]
    if chosen:
        return chosen
    why = (f"it matches {', '.join(matched)}, none of them up with an address" if matched
           else "it matches no interface here")
    return IFNAME_UNUSABLE(
        f"{var}={spec.raw!r}: {why}",
        detail=f"{spec.describe()}. NCCL finds no socket interface and ncclCommInitRank fails "
        f"(\"Bootstrap : no socket interface found\"). Interfaces here: {existing}.",
        remediation=remedies.set_env(ctx, var, suggestion),
        data={"variable": var, "value": spec.raw, "matched": matched, "interfaces": list(nics)},
    )


def _selection_findings(ctx: CheckContext, spec: Any, nics: dict[str, Interface], chosen: list[str], suggestion: str):
    """A multi-host job whose variable selects only loopback, or a virtual interface first."""
    var = spec.variable
    if all(nics[n].is_loopback for n in chosen if n in nics):
        yield IFNAME_UNUSABLE(
            f"{var}={spec.raw!r} selects only loopback in a multi-host job",
            detail="Peers on other hosts cannot reach a loopback address.",
            remediation=remedies.set_env(ctx, var, suggestion),
            data={"variable": var, "value": spec.raw, "selected": chosen},
        )
    elif ifname.is_virtual(chosen[0]):
        yield VIRTUAL_INTERFACE(
            f"{var}={spec.raw!r} selects {chosen[0]}, a virtual/bridge interface",
            detail=f"{chosen[0]} is usually a container bridge or tunnel that other hosts cannot reach.",
            remediation=remedies.set_env(ctx, var, suggestion),
            data={"variable": var, "value": spec.raw, "selected": chosen},
        )


def _nccl_default_choice(ctx: CheckContext, nics: dict[str, Interface], good: Interface | None):
    """NCCL_SOCKET_IFNAME unset: what would NCCL pick on its own?"""
    order = [n for n in ifname.nccl_default_candidates(nics) if _usable(nics[n]) and not nics[n].is_loopback]
    if order and ifname.is_virtual(order[0]):
        yield VIRTUAL_INTERFACE(
            f"NCCL_SOCKET_IFNAME is unset and NCCL would pick {order[0]}, a virtual/bridge interface",
            detail=f"Without NCCL_SOCKET_IFNAME, NCCL takes ib* interfaces first, else the first interface "
            f"that is not docker* or lo: here {', '.join(order)}. {order[0]} rarely reaches other hosts.",
            remediation=remedies.set_env(ctx, "NCCL_SOCKET_IFNAME", good.name if good else "<interface>"),
            data={"candidates": order},
        )


@check(stage="local", tags=("network", "interface"), emits=(IFNAME_UNUSABLE, IFNAME_SUSPICIOUS, VIRTUAL_INTERFACE, IFNAME_UNKNOWN))
def socket_ifname(ctx: CheckContext):
    """GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME against the interfaces that exist, are up and have an address."""
    nics = interfaces(ctx)
    specs = _ifname_specs(ctx)
    if not isinstance(nics, dict):
        if specs:
            yield IFNAME_UNKNOWN(
                f"Could not tell whether {', '.join(s.variable for s in specs)} names usable interfaces: {nics}",
                remediation="Compare the variable with `ip -br addr` on this host",
                data={"variables": [s.variable for s in specs], "reason": str(nics)},
            )
        return
    existing = ", ".join(f"{n.name}({'up' if n.up else 'down'}{', ' + n.addresses[0] if n.addresses else ''})" for n in nics.values())
    good = routable_interface(ctx)
    suggestion = good.name if good else "<interface>"
    multi = multi_host(ctx)
    for spec in specs:
        if spec.problems and not spec.ignored:
            yield IFNAME_SUSPICIOUS(
                f"{spec.variable}={spec.raw!r}: {spec.problems[0]}",
                detail="; ".join(spec.problems) + f". Read as: {spec.describe()}.",
                remediation=remedies.set_env(ctx, spec.variable, suggestion),
                data={"variable": spec.variable, "value": spec.raw, "problems": list(spec.problems)},
            )
        if spec.ignored:
            continue
        chosen = _chosen_interfaces(ctx, spec, nics, existing, suggestion)
        if not isinstance(chosen, list):
            yield chosen
        elif multi:
            yield from _selection_findings(ctx, spec, nics, chosen, suggestion)
    if "NCCL_SOCKET_IFNAME" not in ctx.env and ctx.backend == "nccl" and multi:
        yield from _nccl_default_choice(ctx, nics, good)


# -- the rendezvous port ----------------------------------------------------------------------

def _listeners_text(listeners: Any) -> tuple[str, list[int]]:
    if not isinstance(listeners, list) or not listeners:
        reason = f" ({listeners.reason})" if isinstance(listeners, Unknown) else ""
        return f"the holding process could not be named{reason}; try `ss -ltnp 'sport = :PORT'` as root", []
    parts, pids = [], []
    for entry in listeners:
        pid = entry.get("pid")
        cmd = entry.get("cmdline") or "?"
        if pid:
            pids.append(int(pid))
        parts.append(f"PID {pid if pid else '?'} ({cmd[:160]}) on {entry.get('address')}")
    return "held by " + "; ".join(parts), pids


def _pick_port(ctx: CheckContext) -> str:
    launcher = ctx.launch.launcher
    if launcher == TORCHRUN or TORCHRUN in ctx.launch.also_present:
        return "torchrun --master-port=<free port> (or --rdzv-endpoint=HOST:<free port>)"
    return remedies.set_env(ctx, "MASTER_PORT", "<free port>")


def _foreign_finding(ctx: CheckContext, host: str, port: int, identity: foreign.PortIdentity, holder: str = "", pids: list[int] | None = None):
    what = f"an {identity.protocol.upper()} server" if identity.protocol and identity.protocol != "unknown" else "a service that is not a c10d store"
    answer = f" It answered: {identity.answer!r}." if identity.answer else ""
    return FOREIGN_SERVICE(
        f"{host}:{port} is served by {what}" + (f" ({holder})" if holder else ""),
        detail=f"{identity.detail}.{answer} The job's store cannot bind there, and ranks that connect talk "
        "to the wrong service (they hang or fail with a protocol error).",
        remediation=_pick_port(ctx) + (f"; or stop the service (PID {', '.join(map(str, pids))})" if pids else ""),
        data={"host": host, "port": port, "protocol": identity.protocol, "answer": identity.answer, "pids": pids or []},
    )


def _port_taken(ctx: CheckContext, port: int, holder: str, pids: list[int], error: str, is_store: bool):
    """The same net.E013 on every rank that sees the holder: rank 0 cannot bind, the others reach
    a listener that is not rank 0's store."""
    return PORT_IN_USE(
        f"MASTER_PORT={port} is already in use on the master host ({holder})",
        detail=f"Rank 0 will fail to start the store: \"The server socket has failed to listen on any local "
        f"network address ... address already in use\" ({error})."
        + (" The holder answers as a c10d store: probably an earlier run (or another job) still alive." if is_store else ""),
        remediation=_pick_port(ctx) + (f"; or end the holder: kill {' '.join(map(str, pids))}" if pids else ""),
        data={"port": port, "pids": pids, "holder": holder, "is_c10d_store": is_store, "error": error},
    )


def _port_free_for_store(ctx: CheckContext, host: str, port: int, store_ok: bool = False):
    """This process (as rank 0) will create the store: the port must be free (``store_ok``: or
    held by a c10d store, which torchrun's c10d rendezvous joins as a client)."""
    free = ctx.probes.can_bind(port)
    if isinstance(free, Unknown) or free[0]:
        return
    error = free[1]
    if "denied" in error.lower():
        yield PORT_IN_USE(
            f"MASTER_PORT={port} cannot be bound: {error}",
            detail="Ports below 1024 need privileges the job does not have.",
            remediation=_pick_port(ctx).replace("<free port>", "29500"),
            data={"port": port, "error": error},
        )
        return
    holder, pids = _listeners_text(ctx.probes.listeners(port))
    identity = ctx.probes.identify_port(host, port, IDENTIFY_TIMEOUT)
    if isinstance(identity, foreign.PortIdentity) and identity.kind == foreign.FOREIGN:
        yield _foreign_finding(ctx, host, port, identity, holder, pids)
        return
    is_store = isinstance(identity, foreign.PortIdentity) and identity.kind == foreign.C10D_STORE
    if is_store and store_ok:
        return
    yield _port_taken(ctx, port, holder, pids, error, is_store)


def port_held_finding(ctx: CheckContext, host: str, port: int):
    """For a rank other than 0 that could not reach the store on its own host: the process that
    holds the port and does not answer as a c10d store (net.E013, the finding rank 0 reports),
    or None when nothing here holds it (then the store's own finding stands)."""
    if on_master_host(ctx, host) is not True:
        return None
    listeners = ctx.probes.listeners(port)
    if not isinstance(listeners, list) or not listeners:
        return None
    identity = ctx.probes.identify_port(host, port, IDENTIFY_TIMEOUT)
    if isinstance(identity, foreign.PortIdentity) and identity.kind == foreign.C10D_STORE:
        return None
    holder, pids = _listeners_text(listeners)
    if isinstance(identity, foreign.PortIdentity) and identity.kind == foreign.FOREIGN:
        return _foreign_finding(ctx, host, port, identity, holder, pids)
    return _port_taken(ctx, port, holder, pids, "address already in use", False)


def _port_not_foreign(ctx: CheckContext, host: str, port: int):
    """Another local process is (or will be) rank 0; only a foreign answer is certain to be wrong."""
    result = ctx.probes.connect(host, port, CONNECT_TIMEOUT)
    if getattr(result, "status", None) == "open":
        identity = ctx.probes.identify_port(host, port, IDENTIFY_TIMEOUT)
        if isinstance(identity, foreign.PortIdentity) and identity.kind == foreign.FOREIGN:
            yield _foreign_finding(ctx, host, port, identity)


def _open_port(ctx: CheckContext, host: str, port: int, expect_store: bool, data: dict[str, Any]):
    identity = ctx.probes.identify_port(host, port, IDENTIFY_TIMEOUT)
    if not isinstance(identity, foreign.PortIdentity) or identity.kind == foreign.C10D_STORE:
        return
    if identity.kind == foreign.FOREIGN:
        yield _foreign_finding(ctx, host, port, identity)
    elif identity.kind == foreign.SILENT and expect_store:
        yield PORT_SERVICE_UNKNOWN(
            f"Could not tell whether the service on {host}:{port} is the c10d store: {identity.detail}",
            detail="torchrun's agent store should answer a store ping at once; a silent listener may be "
            "another program, or an overloaded store.",
            remediation=f"On {host}: ss -ltnp 'sport = :{port}' to see which process listens",
            data=data,
        )


def _refused(host: str, port: int, source: str, result: Any, data: dict[str, Any]):
    return MASTER_UNREACHABLE(
        f"Connection to {host}:{port} refused: torchrun's store is not listening there",
        detail=f"torchrun (TORCHELASTIC_USE_AGENT_STORE=True) says its agent's store listens on {source} "
        f"= {host}:{port}, but {result.address} refuses connections on that port: wrong address or port, "
        "or the agent is gone.",
        remediation="Check that MASTER_ADDR/MASTER_PORT are not overridden in the script or environment "
        "(torchrun sets them), and that --rdzv-endpoint names rank 0's host; "
        f"from this host: nc -vz {host} {port}",
        data=data,
    )


def _timed_out(ctx: CheckContext, host: str, port: int, source: str, result: Any, data: dict[str, Any]):
    if ctx.probes.arp_unanswered(result.address) is True:
        # Nobody answers ARP for the address: no host holds it (a wrong MASTER_ADDR, a host
        # that is down). A firewall would drop TCP but still let ARP through.
        here = ""
        if ctx.rank == 0:
            here = (" This is rank 0, and rank 0 must run on the host MASTER_ADDR names: "
                    f"{host} is not an address of this host.")
        return MASTER_UNREACHABLE(
            f"No host answers at {result.address} ({host}:{port}): its ARP requests get no reply",
            detail=f"The connect got no answer within {CONNECT_TIMEOUT:g}s and the kernel's neighbour table "
            f"holds {result.address} unresolved: nothing on this link has that address, so every rank "
            "would wait for the rendezvous timeout." + here,
            remediation=f"Set MASTER_ADDR ({source}) to the address of rank 0's host"
            + (f" (this host: {_own_address_text(ctx)})" if ctx.rank == 0 else "")
            + "; if that host should have it, check it is up",
            data={**data, "arp": "unanswered"},
        )
    return FIREWALLED(
        f"Connecting to {host}:{port} timed out after {CONNECT_TIMEOUT:g}s",
        detail=f"{result.address} neither accepts nor refuses: packets are dropped (a firewall, a security "
        "group, or an address that routes nowhere). Ranks block in the rendezvous until its timeout "
        "(torch's default: 30 minutes for the store, 10-30 minutes for the process group).",
        remediation=f"Allow TCP {port} (and the backend's ephemeral ports) between the nodes: "
        f"e.g. firewall-cmd --add-port={port}/tcp, an inbound rule in the security group, or "
        "iptables -I INPUT -s <cluster subnet> -j ACCEPT on the master",
        data=data,
    )


def _port_reachable(ctx: CheckContext, host: str, port: int, source: str, expect_store: bool):
    """A rank on another host (or under torchrun's agent store): can it connect, and to what?"""
    result = ctx.probes.connect(host, port, CONNECT_TIMEOUT)
    if isinstance(result, Unknown):
        yield PORT_SERVICE_UNKNOWN(
            f"Could not tell whether {host}:{port} is reachable: {result.reason}",
            remediation=f"Try `nc -vz {host} {port}` from this host",
            data={"host": host, "port": port},
        )
        return
    data = {"host": host, "port": port, "address": result.address, "status": result.status, "detail": result.detail, "source": source}
    if result.status == "open":
        yield from _open_port(ctx, host, port, expect_store, data)
    elif result.status == "refused":
        # Without torchrun's agent store, rank 0 starts its store only in init_process_group:
        # refused now means the host is up and reachable, which is all this stage can know.
        if expect_store:
            yield _refused(host, port, source, result, data)
    elif result.status == "timeout":
        yield _timed_out(ctx, host, port, source, result, data)
    elif result.status in ("no_route", "unreachable", "error"):
        yield MASTER_UNREACHABLE(
            f"No route to {host}:{port}: {result.detail or result.status}",
            detail=f"The kernel reports {result.detail or result.status} for {result.address}: this host has no path to the master.",
            remediation=f"Check MASTER_ADDR ({source}) and the routing (ip route get {result.address}); "
            "use an address on a network both hosts share",
            data=data,
        )


@check(stage="local", tags=("network", "port"), emits=(MASTER_UNREACHABLE, FIREWALLED, PORT_IN_USE, FOREIGN_SERVICE, PORT_SERVICE_UNKNOWN))
def rendezvous_port(ctx: CheckContext):
    """The master host: is MASTER_PORT free (or held by the expected store)? Other hosts: can they connect?"""
    host, port, source = endpoint(ctx)
    if not host or port is None:
        return
    resolved = resolve(ctx, host)
    if not isinstance(resolved, Resolution) or not resolved.addresses:
        return  # net.C001 / net.I002 already say so
    master_here = on_master_host(ctx, host)
    expect_store = agent_store_expected(ctx)
    plan = ctx.launch.planned
    if plan is not None:
        # Before the launcher runs: on the endpoint's host its agent (or rank 0) will bind the
        # port; elsewhere refused only means nobody started yet, while a timeout, no route or
        # a foreign service is what the launcher would hang on.
        torchrun = plan if plan.launcher == TORCHRUN else plan.inner
        c10d = torchrun is not None and torchrun.rdzv_backend == "c10d"
        if master_here:
            yield from _port_free_for_store(ctx, host, port, store_ok=c10d)
        else:
            yield from _port_reachable(ctx, host, port, source, expect_store=False)
        return
    if not expect_store and master_here and ctx.rank in (0, None):
        yield from _port_free_for_store(ctx, host, port)
    elif not expect_store and master_here:
        yield from _port_not_foreign(ctx, host, port)
    else:
        yield from _port_reachable(ctx, host, port, source, expect_store)


# -- address families ---------------------------------------------------------------------------

@check(stage="local", tags=("network", "ipv6"), emits=(ADDRESS_FAMILY,))
def address_family(ctx: CheckContext):
    """IPv4/IPv6 pitfalls: an IPv6-only MASTER_ADDR on a host without routable IPv6, link-local without scope."""
    host, _port, source = endpoint(ctx)
    if not host:
        return
    resolved = resolve(ctx, host)
    if not isinstance(resolved, Resolution) or not resolved.addresses:
        return
    addresses = [ipaddress.ip_address(a.split("%", 1)[0]) for a in resolved.addresses if _is_ip(a)]
    if any(a.version == 6 and a.is_link_local for a in addresses) and "%" not in host:
        yield ADDRESS_FAMILY(
            f"MASTER_ADDR {host} is an IPv6 link-local address without a scope",
            detail="fe80:: addresses are only meaningful with an interface (fe80::1%eth0); connects fail with "
            "'Invalid argument' or go nowhere.",
            remediation="Use a global IPv6 or an IPv4 address: " + _set_master_addr(ctx, "<routable address>"),
            data={"host": host, "addresses": resolved.addresses},
        )
        return
    if not addresses or any(a.version == 4 for a in addresses) or all(a.is_loopback for a in addresses):
        return
    nics = interfaces(ctx)
    if not isinstance(nics, dict):
        return
    routable_v6 = [
        n.name for n in nics.values()
        if n.up and not n.is_loopback and any(_is_ip(a) and not ipaddress.ip_address(a).is_link_local for a in n.ipv6)
    ]
    if not routable_v6:
        yield ADDRESS_FAMILY(
            f"MASTER_ADDR {host} resolves only to IPv6, and this host has no routable IPv6 address",
            detail=f"{source} -> {', '.join(resolved.addresses)}; this host's interfaces carry only IPv4 (or "
            "link-local IPv6), so it cannot reach the store.",
            remediation="Give MASTER_ADDR an IPv4 address (or a name with an A record): " + _set_master_addr(ctx, "<rank 0 IPv4>"),
            data={"host": host, "addresses": resolved.addresses},
        )


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text.split("%", 1)[0])
        return True
    except ValueError:
        return False
