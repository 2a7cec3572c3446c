"""This process's backend connections as the kernel counts them (TCP_INFO): does a stuck-looking collective still move data?"""

# A collective that every rank is in and that has not completed for hang_timeout is either stuck
# (a dead link, a transport fault: it never completes) or slow (a very large tensor, a slow or
# shared link: it completes in its own time). The flight recorder cannot tell them apart: its
# counters move only when the collective completes. The kernel can: every TCP connection of the
# process keeps the milliseconds since it last *received* data (tcp_info's tcpi_last_data_recv) and
# the bytes it received (tcpi_bytes_received, Linux 4.2+). Received, not sent: a connection whose
# peer is gone still retransmits (its "last sent" keeps moving), while only data that arrives moves
# a collective, and every byte a collective moves is received by some rank. Gloo moves every byte
# over such connections; the job's c10d store (the guard's side channel included) is left out by
# its port. NCCL moves data over NVLink, PCIe or InfiniBand, where no socket shows it: for a group
# that is not gloo's alone this says "cannot tell", and the policy then never ends the job before
# torch would. Read once when the rank answers a look: one listing of /proc/self/fd and one
# getsockopt per socket.

from __future__ import annotations

import os
import socket
import struct
from typing import Any, Iterable

from distdoctor.diagnosis.snapshot import Transport
from distdoctor.embedded.guard.channel import _tcp_store_address

_ESTABLISHED = 1
_INFO_BYTES = 136          # up to tcpi_bytes_received
_LAST_RECV = struct.Struct("=I")  # tcpi_last_data_recv, offset 52 (ms)
_RECEIVED = struct.Struct("=Q")   # tcpi_bytes_received, offset 128
_MAX_SOCKETS = 4096


def backend_note(backend: str) -> str:
    """Why this backend's connections say nothing of its collectives ("" when they do: gloo alone)."""
    parts = {p.split(":")[-1].strip().lower() for p in str(backend).split(",") if p.strip()}
    if parts == {"gloo"}:
        return ""
    return (f"backend {backend}: its collectives move data over links no socket shows (NVLink, PCIe, InfiniBand), "
            "so whether a collective still moves cannot be read here")


def _info(fd: int, excluded: set[int]) -> tuple[float, int | None] | None:
    """(seconds since the connection last received data, the bytes it received or None) of one
    established TCP socket that is not the store's; None for anything else."""
    try:
        dup = os.dup(fd)
    except OSError:
        return None
    try:
        sock = socket.socket(fileno=dup)
    except OSError:
        os.close(dup)
        return None
    try:
        if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
            return None
        try:
            ports = {sock.getsockname()[1], sock.getpeername()[1]}
            raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _INFO_BYTES)
        except OSError:  # not connected (a listener), or no TCP_INFO
            return None
        if ports & excluded or len(raw) < 60 or raw[0] != _ESTABLISHED:
            return None
        received = _RECEIVED.unpack_from(raw, 128)[0] if len(raw) >= _INFO_BYTES else None
        return _LAST_RECV.unpack_from(raw, 52)[0] / 1000.0, received
    finally:
        sock.close()


def read(backend: str, excluded_ports: Iterable[int]) -> Transport:
    """This process's backend connections now; a Transport with idle_s None and a note when they
    cannot say (another backend, /proc unreadable, no connection found)."""
    note = backend_note(backend)
    if note:
        return Transport(note=note)
    excluded = {int(p) for p in excluded_ports if p}
    try:
        names = os.listdir("/proc/self/fd")
    except OSError as exc:
        return Transport(note=f"/proc/self/fd could not be read ({exc.strerror or exc})")
    idle, carried, count = None, 0, 0
    for name in names[:_MAX_SOCKETS]:
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                continue
        except OSError:  # closed meanwhile
            continue
        found = _info(int(name), excluded)
        if found is None:
            continue
        count += 1
        idle = found[0] if idle is None else min(idle, found[0])
        carried = None if carried is None or found[1] is None else carried + found[1]
    if not count:
        return Transport(note="no TCP connection of the backend was found in /proc/self/fd")
    return Transport(idle_s=round(idle, 3), bytes=carried, connections=count)


def store_ports(default_store: Any, env: dict[str, str] | None = None) -> set[int]:
    """The c10d store's port (the job's store, the guard's side channel): its traffic is not the backend's."""
    ports = set()
    address = _tcp_store_address(default_store)
    if address is not None:
        ports.add(address[1])
    raw = (os.environ if env is None else env).get("MASTER_PORT", "")
    if raw.strip().isdigit():
        ports.add(int(raw))
    return ports


def read_for(dist: Any) -> Transport:
    """The default group's backend connections (``dist``: torch.distributed); never raises."""
    try:
        backend = str(dist.get_backend())
        ports = store_ports(dist.distributed_c10d._get_default_store())
    except Exception as exc:  # private API, or the group is gone: cannot tell
        return Transport(note=f"the backend could not be read ({type(exc).__name__})")
    try:
        return read(backend, ports)
    except Exception as exc:  # a probe never takes the answer down
        return Transport(note=f"the connections could not be read ({type(exc).__name__}: {str(exc)[:100]})")
