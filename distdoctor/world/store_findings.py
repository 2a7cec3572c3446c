"""What a failure to reach (or host) the store says, as the finding that names it."""

from __future__ import annotations

import dataclasses

from distdoctor.core.findings import Finding
from distdoctor.machine.probes import call_with_deadline
from distdoctor.world.rank_state import ROOT_MARGIN_S
from distdoctor.world.kinds import (
    MASTER_NOT_HERE,
    STORE_DROPPED,
    STORE_HOST_FAILED,
    STORE_PORT_TAKEN,
    STORE_UNREACHABLE,
)
from distdoctor.world.store_exchange import WorldError
from distdoctor.world.store_open import WorldSpec


class StoreFindings:
    """RankRun's part: the store failure as a finding, this host's name and addresses."""

    def _store_finding(self, spec: WorldSpec, exc: WorldError, name_holder: bool = True) -> Finding:
        """What the failure to reach (or host) the store says, as the finding that names it.

        ``name_holder``: look for a process on this host holding the port (probes that take up
        to seconds; a run already cut off by its deadline skips them)."""
        where = f"{spec.master_addr}:{spec.master_port}"
        data = {"master_addr": spec.master_addr, "master_port": spec.master_port, "store_host": spec.store_host,
                **exc.data}
        common = {"detail": str(exc), "ranks": (spec.rank,), "hosts": self._host(), "data": data}
        probe = exc.data.get("probe")
        if name_holder and spec.rank != 0 and exc.reason not in ("port_taken", "host_failed", "master_not_here"):
            # A process on this host holds the port and is not rank 0's store: say what rank 0
            # says (net.E013 naming the holder), not "unreachable" or "firewall".
            from distdoctor.checks.network import port_held_finding

            # Bounded by what is left before the deadline (its probes take up to seconds): the
            # store's own finding below stands when the holder cannot be named in time.
            left = max(self.deadline - ROOT_MARGIN_S - self.clock(), 0.05)
            held = call_with_deadline(lambda: port_held_finding(self.ctx, spec.master_addr, spec.master_port),
                                      left, "port holder")
            if isinstance(held, Finding):
                return dataclasses.replace(held, ranks=(spec.rank,), hosts=self._host())
        if exc.reason == "port_taken":
            return STORE_PORT_TAKEN(f"Rank 0 could not host the store: port {spec.master_port} is taken", **common)
        if exc.reason == "host_failed":
            return STORE_HOST_FAILED(f"Rank 0 could not host the store on port {spec.master_port}: "
                                     f"{exc.data.get('error', exc)}", **common)
        if exc.reason == "master_not_here":
            mine = self._own_addresses()
            answer = {"no_host": "no host answers there", "refused": "another host answers there",
                      "no_route": "there is no route to it", "timeout": "connects to it time out",
                      "not_local": "it cannot be bound here"}.get(
                          str(probe), "it does not lead here")
            return MASTER_NOT_HERE(
                f"MASTER_ADDR={spec.master_addr} is not an address of rank 0's host ({self._host_text()}), "
                f"and {answer}",
                remediation=f"Rank 0 hosts the store, so MASTER_ADDR must be an address of rank 0's host: set "
                f"MASTER_ADDR to {mine} on every rank, or start rank 0 on the host that has {spec.master_addr}",
                **{**common, "data": {**data, "own_addresses": mine}},
            )
        if exc.reason == "dropped":
            return STORE_DROPPED(
                f"Rank {spec.rank}: connections to the store at {where} time out (packets dropped)",
                remediation=f"Allow TCP {spec.master_port} from this host ({self._host_text()}) to "
                f"{spec.master_addr}, and the backend's ports between the nodes: the firewall on the master "
                f"(firewall-cmd --add-port={spec.master_port}/tcp), the security group, or a network policy; "
                f"check with `nc -vz {spec.master_addr} {spec.master_port}` from here",
                **common,
            )
        title = {
            "refused": f"Rank {spec.rank}: nothing listens at {where} (connection refused)",
            "no_host": f"Rank {spec.rank}: no host answers at {spec.master_addr} (store at {where})",
            "no_route": f"Rank {spec.rank}: no route to the store at {where}",
            "unresolvable": f"Rank {spec.rank}: the store's host {spec.master_addr} does not resolve",
        }.get(str(probe), f"Rank {spec.rank} could not reach the store at {where}")
        return STORE_UNREACHABLE(title, **common)

    def _host_text(self) -> str:
        host = self._host()
        return host[0] if host else "this host"

    def _own_addresses(self) -> str:
        nics = self.ctx.probes.interfaces()
        if not isinstance(nics, dict):
            return "this host's address (see `ip -br addr`)"
        found = [f"{a} ({n.name})" for n in nics.values() if n.up and not n.is_loopback for a in n.ipv4]
        return " or ".join(found[:4]) if found else "this host's address (see `ip -br addr`)"

    def _host(self) -> tuple[str, ...]:
        host = self.ctx.memo("hostname", self.ctx.probes.hostname)
        return (host,) if isinstance(host, str) else ()
