"""Which local interface carries a rank's traffic to each other host: *_SOCKET_IFNAME and the routing table.

A rank's endpoint is the address its peers connect to: the address of the interface that
GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME selects, or else (gloo) the address this host's name
resolves to, or (NCCL) the first interface of NCCL's own default choice. The interface that
carries the traffic to a peer is the one the kernel's routing table picks for the peer's
endpoint (a UDP connect asks the table; no packet is sent), with its link speed from sysfs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from distdoctor.checks._support.socket_ifname import is_virtual, nccl_default_candidates, parse_gloo, parse_nccl

# A port at or below this speed (Mb/s) next to a faster one is a management port, not the fabric.
SLOW_PORT_MBPS = 1000


def link_speed_mbps(name: str, sysfs: Path = Path("/sys/class/net")) -> int | None:
    """The negotiated speed of an interface, None where the driver reports none (virtual, down)."""
    try:
        speed = int((sysfs / name / "speed").read_text().strip())
    except (OSError, ValueError):
        return None
    return speed if speed > 0 else None


def ifname_setting(backend: str, env: Mapping[str, str]) -> tuple[str, Any] | None:
    """(variable, parsed spec) of the *_SOCKET_IFNAME that governs this backend, if set."""
    variable = "NCCL_SOCKET_IFNAME" if backend == "nccl" else "GLOO_SOCKET_IFNAME"
    raw = env.get(variable, "")
    if len(raw.strip()) <= 1:
        return None
    return variable, (parse_nccl(raw, variable) if backend == "nccl" else parse_gloo(raw, variable))


def endpoint(backend: str, env: Mapping[str, str], probes: Any) -> dict[str, Any]:
    """This rank's endpoint address and how it was chosen, for its check-in."""
    nics = probes.interfaces()
    nics = nics if isinstance(nics, dict) else {}
    setting = ifname_setting(backend, env)
    if setting is not None:
        variable, spec = setting
        for name in spec.select(sorted(nics)):
            if nics[name].ipv4:
                return {"address": nics[name].ipv4[0], "interface": name, "how": f"{variable}={env[variable]}"}
        return {"address": None, "interface": None, "how": f"{variable}={env[variable]} selects no interface with an address"}
    if backend == "nccl":
        for name in nccl_default_candidates(sorted(nics)):
            if nics[name].ipv4 and nics[name].up:
                return {"address": nics[name].ipv4[0], "interface": name, "how": "NCCL's default interface choice"}
    hostname = probes.hostname()
    resolved = probes.resolve(str(hostname), 2.0)
    addresses = list(getattr(resolved, "addresses", ()) or ())
    v4 = [a for a in addresses if ":" not in a]
    if v4 or addresses:
        return {"address": (v4 or addresses)[0], "interface": None, "how": f"this host's name ({hostname}) resolves to it"}
    return {"address": None, "interface": None, "how": f"this host's name ({hostname}) does not resolve"}


def routes_to(peers: Mapping[str, str], probes: Any) -> dict[str, dict[str, Any]]:
    """peer host -> the local interface (and its speed and kind) the routing table picks to reach it."""
    nics = probes.interfaces()
    nics = nics if isinstance(nics, dict) else {}
    out: dict[str, dict[str, Any]] = {}
    for host, address in sorted(peers.items()):
        route = probes.route(address) if address else None
        name = getattr(route, "interface", None)
        out[host] = {"address": address, "source": getattr(route, "source", None), "interface": name,
                     "speed_mbps": link_speed_mbps(name) if name else None,
                     "virtual": bool(name and is_virtual(name)), "loopback": bool(name and nics.get(name) and nics[name].is_loopback)}
    return out


def faster_ports(probes: Any, than: int) -> list[dict[str, Any]]:
    """Up, physical interfaces with an address and a speed above ``than`` Mb/s."""
    nics = probes.interfaces()
    out = []
    for name, nic in sorted((nics if isinstance(nics, dict) else {}).items()):
        speed = link_speed_mbps(name)
        if nic.up and nic.ipv4 and not nic.is_loopback and not is_virtual(name) and speed and speed > than:
            out.append({"interface": name, "speed_mbps": speed})
    return out


def suspicious(route: Mapping[str, Any], faster: list[dict[str, Any]]) -> str | None:
    """Why a route to another host is the wrong way out, or None."""
    name = route.get("interface")
    if not name:
        return None
    if route.get("loopback"):
        return f"it leaves through the loopback interface {name}: the peer's address is one of this host's"
    if route.get("virtual"):
        return f"it leaves through {name}, a virtual interface (container bridge, tunnel or veth)"
    speed = route.get("speed_mbps")
    if speed and speed <= SLOW_PORT_MBPS and faster:
        best = max(faster, key=lambda f: f["speed_mbps"])
        return (f"it leaves through {name} at {speed} Mb/s while {best['interface']} runs at "
                f"{best['speed_mbps']} Mb/s")
    return None
