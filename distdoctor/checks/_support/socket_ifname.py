"""GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME, understood the way Gloo and NCCL read them.

NCCL (src/misc/socket.cc, parseStringList/matchIfList):
  - a comma-separated list of entries; each entry is an interface-name *prefix* ("eth" matches
    eth0 and eth1), optionally followed by ":<port>" (ignored for sockets);
  - a leading "^" turns the whole list into an exclusion list ("^docker,lo": anything else);
  - a leading "=" (after an optional "^") makes every entry an exact name ("=eth0": not eth01).
  - unset: NCCL prefers "ib*" interfaces, else any interface but "docker*" and "lo".
Gloo (torch's ProcessGroupGloo): a comma-separated list of *exact* interface names; torch makes
one Gloo device per name and every name must exist and carry an address. A value of one
character or less is ignored by torch (it checks ``size() > 1``), as NCCL ignores its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

NCCL = "nccl"
GLOO = "gloo"

# NCCL's own default exclusion when NCCL_SOCKET_IFNAME is unset.
NCCL_DEFAULT_EXCLUDED_PREFIXES = ("docker", "lo")
# Interfaces that exist on a host but rarely reach the other hosts of a job: container
# bridges, veth ends, VPN/tunnel devices, libvirt and CNI bridges.
VIRTUAL_PREFIXES = (
    "docker", "veth", "br-", "virbr", "cni", "flannel", "cali", "weave", "vxlan", "tun", "tap",
    "kube-", "lxc", "lxd", "podman", "vmnet", "vboxnet", "zt", "tailscale", "wg", "ifb", "dummy",
)


@dataclass(frozen=True)
class IfnameSpec:
    variable: str
    raw: str
    style: str  # NCCL or GLOO
    names: tuple[str, ...]  # entries without port suffixes, empty ones dropped
    exclude: bool = False
    exact: bool = True
    problems: tuple[str, ...] = ()
    ignored: bool = False  # the value is one Gloo/torch does not act on at all

    def matches(self, interface: str) -> bool:
        """Whether this setting lets the library use ``interface``."""
        if self.ignored:
            return True
        hit = any(interface == n if self.exact else interface.startswith(n) for n in self.names)
        return not hit if self.exclude else hit

    def select(self, interfaces: Iterable[str]) -> list[str]:
        return [name for name in interfaces if self.matches(name)]

    def describe(self) -> str:
        if self.style == GLOO:
            return f"{self.variable}={self.raw!r}: exactly the interface(s) {', '.join(self.names) or '(none)'}"
        how = "named exactly" if self.exact else "whose name starts with"
        verb = "any interface except those" if self.exclude else "interfaces"
        return f"{self.variable}={self.raw!r}: {verb} {how} {', '.join(self.names) or '(nothing)'}"


def _split(body: str) -> tuple[list[str], list[str]]:
    names: list[str] = []
    problems: list[str] = []
    for entry in body.split(","):
        # NCCL allows "name:port" (used by NCCL_IB_HCA); the port means nothing for sockets.
        name = entry.split(":", 1)[0]
        if not name.strip():
            problems.append("an empty entry (two commas in a row, or a trailing comma)")
            continue
        if name != name.strip():
            # Neither library strips blanks: " eth0" names no interface.
            problems.append(f"entry {name!r} has blanks around it, which become part of the name")
        if name in names:
            problems.append(f"{name!r} is listed twice")
            continue
        names.append(name)
    return names, problems


def parse_nccl(raw: str, variable: str = "NCCL_SOCKET_IFNAME") -> IfnameSpec:
    if len(raw) <= 1:
        # NCCL, like torch for Gloo, only acts on a value longer than one character.
        return IfnameSpec(variable, raw, NCCL, (), problems=(f"{variable}={raw!r} is ignored by NCCL (too short)",), ignored=True)
    body = raw
    exclude = exact = False
    if body.startswith("^"):
        exclude, body = True, body[1:]
    if body.startswith("="):
        exact, body = True, body[1:]
    names, problems = _split(body)
    if not names and not exclude:
        problems.append("no interface name is left; NCCL will find no socket interface")
    return IfnameSpec(variable, raw, NCCL, tuple(names), exclude, exact, tuple(problems))


def parse_gloo(raw: str, variable: str = "GLOO_SOCKET_IFNAME") -> IfnameSpec:
    if len(raw) <= 1:
        # torch only reads the variable when it is longer than one character.
        return IfnameSpec(variable, raw, GLOO, (), problems=(f"{variable}={raw!r} is ignored by torch (too short)",), ignored=True)
    names, problems = _split(raw)
    if raw.startswith(("^", "=")):
        problems.append(f"Gloo takes exact interface names; the leading {raw[0]!r} is NCCL syntax and makes the name unknown")
    return IfnameSpec(variable, raw, GLOO, tuple(names), exclude=False, exact=True, problems=tuple(problems))


def nccl_default_candidates(interfaces: Iterable[str]) -> list[str]:
    """The interfaces NCCL considers when NCCL_SOCKET_IFNAME is unset, in its preference order."""
    names = list(interfaces)
    ib = [n for n in names if n.startswith("ib")]
    if ib:
        return ib
    return [n for n in names if not n.startswith(NCCL_DEFAULT_EXCLUDED_PREFIXES)]


def is_virtual(name: str) -> bool:
    return name.startswith(VIRTUAL_PREFIXES)
