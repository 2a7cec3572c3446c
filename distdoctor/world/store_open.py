"""Where the world's c10d store is and how it is reached: hosted by rank 0, or connected to, bounded.

Who hosts the store:
- under torchrun the elastic agent already hosts one on MASTER_ADDR:MASTER_PORT and tells its
  workers so with TORCHELASTIC_USE_AGENT_STORE=True; every rank connects to it as a client, exactly
  as torch.distributed.rendezvous._create_c10d_store does, so distdoctor never takes the agent's
  port. The self-test supervisor (distdoctor.world.selftest) plays the agent's part and says so the same way.
- otherwise (srun, mpirun, variables set by hand) rank 0 hosts a TCPStore on MASTER_PORT and the
  other ranks connect to it; the store is released when rank 0 is done.

Before torch's TCPStore client is handed an address, a plain socket probe tells what answers there
(refused, dropped, no host), which torch's client cannot tell apart.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Mapping

from distdoctor.core.context import WorldError
from distdoctor.machine.launchers import TORCHRUN, LaunchInfo
from distdoctor.machine.probes import Probes, Unknown, call_with_deadline
from distdoctor.world.checkin import first_line

AGENT_STORE_ENV = "TORCHELASTIC_USE_AGENT_STORE"
RUN_ID_ENV = "DISTDOCTOR_RUN_ID"


@dataclass(frozen=True)
class WorldSpec:
    rank: int
    world_size: int
    master_addr: str
    master_port: int
    # "agent": a launcher process hosts the store (torchrun agent, self-test supervisor);
    # "rank0": rank 0 hosts it on MASTER_PORT (srun, mpirun, by hand).
    store_host: str
    namespace: str
    launcher: str

    @classmethod
    def from_launch(cls, launch: LaunchInfo, env: Mapping[str, str]) -> "WorldSpec | None":
        """The world the environment describes, or None when it describes none usable."""
        if not launch.world_configured:
            return None
        # The same test as torch.distributed.rendezvous._torchelastic_use_agent_store().
        agent = env.get(AGENT_STORE_ENV) == str(True)
        if launch.launcher == TORCHRUN and env.get("TORCHELASTIC_RUN_ID"):
            # The agent's store outlives a restart of the workers; a fresh namespace per attempt.
            run = f"{env['TORCHELASTIC_RUN_ID']}/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        else:
            run = env.get(RUN_ID_ENV, "default")
        return cls(
            rank=int(launch.rank.value),  # type: ignore[arg-type]
            world_size=int(launch.world_size.value),  # type: ignore[arg-type]
            master_addr=str(launch.master_addr).strip(),
            master_port=int(launch.master_port.value),  # type: ignore[arg-type]
            store_host="agent" if agent else "rank0",
            namespace=f"distdoctor/{run}",
            launcher=launch.launcher,
        )


@dataclass(frozen=True)
class Unanswered:
    """Why nothing listening was reached at host:port before the deadline.

    ``kind``: ``refused`` (a host answered, nothing listens), ``no_host`` (nobody answers ARP
    for the address), ``no_route`` (the kernel has no path), ``timeout`` (connects got no
    answer at all: packets dropped), ``unresolvable``, ``error``.
    """

    kind: str
    detail: str
    address: str | None = None
    attempts: int = 0

    @property
    def cause(self) -> str:
        return "firewall" if self.kind == "timeout" else "master_unreachable"

    def __str__(self) -> str:
        return self.detail


# One connect attempt waits at most this long; refused and no-route answers come back at once.
CONNECT_ATTEMPT_S = 2.0


def wait_for_listener(host: str, port: int, deadline: float, clock: Callable[[], float] = time.monotonic,
                      probes: Any = None, seen: list | None = None) -> Unanswered | None:
    """Poll a TCP connect until something listens (None) or the deadline passes (why not).

    torch's TCPStore client cannot tell these apart: it retries refused connects until its own
    timeout and then says "timed out" whatever happened, and logs a C++ stack for every failed
    try. A plain socket probe keeps the terminal clean and the answer precise. ``seen`` (a list)
    gets every failed attempt as it happens, so a run cut off meanwhile can still say what the
    connects met. How the attempts
    are judged: one refusal shows a host is there (master_unreachable: nothing listens); an
    unanswered ARP or a kernel "no route" from the start shows nobody is there
    (master_unreachable); connects that time out while the address resolved on the link (or
    through a gateway) are packets dropped on the way (firewall) -- also when, later, a partition
    makes the kernel's neighbour entry fail too.
    """
    probes = _probes(probes)
    delay = 0.02
    attempts: list[tuple[str, str, str | None]] = seen if seen is not None else []  # (kind, detail, address)
    while True:
        left = deadline - clock()
        if left <= 0:
            return _verdict(attempts)
        attempt = _attempt(host, port, min(max(left, 0.05), CONNECT_ATTEMPT_S), probes)
        if attempt is None:
            return None
        attempts.append(attempt)
        time.sleep(max(min(delay, deadline - clock()), 0))
        delay = min(delay * 2, 0.1)


def probe_once(host: str, port: int, timeout: float, probes: Any = None) -> Unanswered | None:
    """One connect attempt: None when something listens, else why not."""
    attempt = _attempt(host, port, timeout, _probes(probes))
    return None if attempt is None else _verdict([attempt])


def _probes(probes: Any) -> Any:
    return Probes() if probes is None else probes


def _attempt(host: str, port: int, timeout: float, probes: Any) -> tuple[str, str, str | None] | None:
    result = probes.connect(host, port, timeout)
    status = getattr(result, "status", None)
    if status == "open":
        return None
    address = getattr(result, "address", None)
    detail = getattr(result, "detail", "") or str(result)
    if status == "timeout":
        if address and probes.arp_unanswered(address) is True:
            return "no_host", f"no host answers ARP for {address}", address
        return "timeout", f"connects to {address or host} got no answer ({detail})", address
    if status in ("refused", "no_route", "unresolvable"):
        return status, detail, address
    return "error", detail or f"could not connect: {result}", address


def _verdict(attempts: list[tuple[str, str, str | None]]) -> Unanswered:
    if not attempts:
        return Unanswered("error", "no attempt made before the deadline", None, 0)
    kinds = [kind for kind, _, _ in attempts]
    # A refusal is the strongest evidence: a host answered. Otherwise the first attempt tells
    # what the path was like when the rank started (a partition later also fails the ARP entry).
    chosen = next(a for a in attempts if a[0] == "refused") if "refused" in kinds else attempts[0]
    kind, detail, address = chosen
    later = sorted({k for k in kinds if k != kind})
    text = f"{detail}; {len(attempts)} attempt{'s' if len(attempts) != 1 else ''}"
    if later:
        text += f" (also seen: {', '.join(later)})"
    return Unanswered(kind, text, address, len(attempts))


def _tcp_store(host: str, port: int, *, is_master: bool, timeout_s: float) -> Any:
    # torch stays off the import of this module (the watchdog and the tests of the protocol
    # need none); every rank of a world has imported it by the time it opens the store.
    from torch.distributed import TCPStore

    kwargs: dict[str, Any] = {"timeout": timedelta(seconds=max(timeout_s, 0.1))}
    if is_master:
        # wait_for_workers=False: rank 0 counts arrivals itself, with its own deadline.
        kwargs.update(world_size=None, wait_for_workers=False, multi_tenant=True)
    return TCPStore(host, port, is_master=is_master, **kwargs)


def _port_taken(message: str) -> bool:
    # torch: "The server socket has failed to listen on any local network address. port: 29500,
    # useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use"
    return "EADDRINUSE" in message or "address already in use" in message.lower()


def _local_addresses_of(host: str, probes: Any) -> tuple[list[str], bool | None]:
    """MASTER_ADDR's addresses, and whether one of them belongs to this host (None: cannot tell)."""
    resolved = probes.resolve(host, 3.0)
    addresses = list(getattr(resolved, "addresses", ()) or ())
    if not addresses:
        return [], None
    return addresses, any(probes.is_local_address(a) is True for a in addresses)


# How long rank 0's one connect to a MASTER_ADDR that is not its own may take. Its store already
# listens, so an address that leads here (NAT, a virtual IP) answers within milliseconds; no
# answer within this time is an answer. An address nobody holds is told by its unanswered ARP.
FOREIGN_MASTER_PROBE_S = 1.0


def _host_store(spec: "WorldSpec", deadline: float, clock: Callable[[], float], probes: Any) -> tuple[Any, str]:
    """Rank 0 hosts the store; returns (store, the host its own client used). Raises WorldError."""
    addresses, local = _local_addresses_of(spec.master_addr, probes)
    data = {"master_addr": spec.master_addr, "master_port": spec.master_port, "addresses": addresses}
    # The store listens on every address of this host; its own client connects to MASTER_ADDR.
    # When MASTER_ADDR is not an address here, that client could only come back through NAT or a
    # virtual IP: connect it over loopback, and probe MASTER_ADDR separately to learn the truth.
    client_host = spec.master_addr if local is not False else ("::1" if ":" in addresses[0] else "127.0.0.1")
    try:
        store = _tcp_store(client_host, spec.master_port, is_master=True, timeout_s=deadline - clock())
    except Exception as exc:
        message = first_line(exc)
        if "EADDRNOTAVAIL" in message or "cannot assign requested address" in message.lower():
            # torch's server binds every address, so this comes from an address it was told to
            # use: MASTER_ADDR is not one of this host's.
            raise WorldError(f"rank 0 could not host the store at {spec.master_addr}:{spec.master_port}: {message}; "
                             f"{spec.master_addr} is not an address of this host",
                             cause="master_unreachable", reason="master_not_here",
                             data={**data, "error": message, "probe": "not_local"}) from None
        if not _port_taken(message):
            raise WorldError(f"rank 0 could not host the store on port {spec.master_port}: {message}",
                             cause="unknown", reason="host_failed", data={**data, "error": message}) from None
        # Port taken: maybe by a second process claiming rank 0 (then join its store as a client).
        problem = wait_for_listener(spec.master_addr, spec.master_port, min(deadline, clock() + 1.0), clock, probes)
        if problem is not None:
            raise WorldError(
                f"rank 0 could not host the store on port {spec.master_port} ({message}) "
                f"and nothing answers there ({problem})",
                cause="port_in_use", reason="port_taken", data={**data, "error": message},
            ) from None
        return None, spec.master_addr
    if local is False:
        problem = probe_once(spec.master_addr, spec.master_port,
                             max(min(deadline - clock(), FOREIGN_MASTER_PROBE_S), 0.05), probes)
        if problem is not None:
            del store  # release the port at once: nobody can reach it through MASTER_ADDR
            raise WorldError(
                f"MASTER_ADDR={spec.master_addr} ({', '.join(addresses)}) is not an address of this host, "
                f"where rank 0 runs, and it does not lead here: {problem}",
                cause="master_unreachable", reason="master_not_here",
                data={**data, "probe": problem.kind, "probe_detail": problem.detail},
            )
    return store, client_host


# A host name or an IP literal (IPv6 with its zone and brackets): anything else (a URL, `user@`,
# spaces) cannot name a host, whatever a resolver might make of it.
_PLAIN_HOST = re.compile(r"[A-Za-z0-9._:%\[\]-]{1,253}")


def open_store(spec: WorldSpec, deadline: float, clock: Callable[[], float] = time.monotonic,
               probes: Any = None, seen: list | None = None) -> tuple[Any, bool, str]:
    """Connect to (or host) the c10d store; returns (store, hosted_here, the host connected to).

    Raises WorldError, whose ``reason`` and ``cause`` say what went wrong.
    """
    probes = _probes(probes)
    left = deadline - clock()
    if left <= 0:
        raise WorldError("no time was left to reach the store", reason="no_time")
    if not _PLAIN_HOST.fullmatch(spec.master_addr or ""):
        # Never handed to torch: its C++ client prints the address it tried (a `user:password@`
        # included) on stderr, where no redaction of ours reaches.
        raise WorldError(f"MASTER_ADDR={spec.master_addr!r} is not a host name or an IP address, so no store "
                         "was contacted", data={"master_addr": spec.master_addr, "probe": "not_a_host"})
    host = spec.master_addr
    if spec.store_host == "rank0" and spec.rank == 0:
        store, host = _host_store(spec, deadline, clock, probes)
        if store is not None:
            return store, True, host
    else:
        problem = wait_for_listener(spec.master_addr, spec.master_port, deadline, clock, probes, seen)
        if problem is not None:
            raise unanswered_error(spec, problem)
    return _connect_client(spec, host, deadline, clock), False, host


def unanswered_error(spec: WorldSpec, problem: Unanswered) -> WorldError:
    """The store's address did not answer: what the connects met, as the world's error."""
    who = "the launcher's store" if spec.store_host == "agent" else "rank 0's store"
    verb = "timed out" if problem.kind == "timeout" else "did not answer"
    return WorldError(
        f"connecting to {who} at {spec.master_addr}:{spec.master_port} {verb} until the deadline: {problem}",
        cause=problem.cause,
        reason="dropped" if problem.kind == "timeout" else "unreachable",
        data={"master_addr": spec.master_addr, "master_port": spec.master_port, "probe": problem.kind,
              "address": problem.address, "attempts": problem.attempts},
    )


def verdict_so_far(spec: WorldSpec, seen: list) -> WorldError | None:
    """What the connects met until now (a run cut off while it still waited for the store)."""
    return unanswered_error(spec, _verdict(list(seen))) if seen else None


# One attempt of TCPStore's client handshake may take this long before a fresh one is made.
# On a machine with far more ranks than cores a handshake can stall (the store's one thread and
# this rank both starved); a stalled attempt must not hold the rank until its deadline.
CLIENT_ATTEMPT_S = 10.0


def _connect_client(spec: WorldSpec, host: str, deadline: float, clock: Callable[[], float]) -> Any:
    """A TCPStore client within the deadline, in attempts bounded from outside (a thread)."""
    problem = "no time was left"
    while True:
        left = deadline - clock()
        if left <= 0.05:
            raise WorldError(f"connecting to the store at {spec.master_addr}:{spec.master_port} did not complete "
                             f"before the deadline: {problem}")
        attempt = max(min(left, CLIENT_ATTEMPT_S), 0.5)
        try:
            store = call_with_deadline(lambda: _tcp_store(host, spec.master_port, is_master=False, timeout_s=attempt),
                                       attempt + 0.5, "store handshake")
        except Exception as exc:
            raise WorldError(f"connecting to the store at {spec.master_addr}:{spec.master_port} failed: "
                             f"{first_line(exc)}") from None
        if not isinstance(store, Unknown):
            return store
        problem = store.reason
