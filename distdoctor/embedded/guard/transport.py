"""The stalled group's backend connections as the kernel counts them (TCP_INFO): does a stuck-looking collective still move data?"""

# A collective that every rank is in and that has not completed for hang_timeout is either stuck
# (a dead link, a transport fault: it never completes) or slow (a very large tensor, a slow or
# shared link: it completes in its own time). The flight recorder cannot tell them apart: its
# counters move only when the collective completes. The kernel can: every TCP connection of the
# process keeps the milliseconds since it last *received* data (tcp_info's tcpi_last_data_recv) and
# the bytes it received (tcpi_bytes_received, Linux 4.2+). Received, not sent: a connection whose
# peer is gone still retransmits (its "last sent" keeps moving), while only data that arrives moves
# a collective, and every byte a collective moves is received by some rank.
# Only the stalled group's own backend counts, for the device of the op it waits in (a
# "cpu:gloo,cuda:nccl" group: the op's device says which): gloo moves every byte over TCP
# connections; NCCL moves data over NVLink, PCIe or InfiniBand, where no socket shows it, and a
# backend this module does not know may do either: for those it says "cannot tell", and the policy
# then never ends the job before torch would. For gloo, every established TCP connection of the
# process is read but the c10d store's (the job's store and the guard's side channel, left out by
# port): gloo's connections are not labelled with their group, and reading more than the stalled
# group's can only find data received more recently, so it can make a collective look moving (watched),
# never stuck. Read once when the rank answers a look: one listing of /proc/self/fd and one
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


def backend_for(spec: str, devices: Iterable[str] = ()) -> str | None:
    """The backend that carries an op on ``devices`` in a group whose backend is ``spec`` ("gloo",
    "nccl", "cpu:gloo,cuda:nccl"); without devices, the group's only backend; None when it cannot be
    told (several backends and no device, a device the spec does not name)."""
    named: dict[str, str] = {}
    bare: set[str] = set()
    for part in (p.strip().lower() for p in str(spec).split(",")):
        if ":" in part:
            device, backend = (x.strip() for x in part.split(":", 1))
            named[device] = backend
        elif part:
            bare.add(part)
    wanted = {str(d).lower() for d in devices if d and d != "?"}
    if wanted:
        found = {named.get(d) or (next(iter(bare)) if len(bare) == 1 else None) for d in wanted}
    else:
        found = set(named.values()) | bare
    return found.pop() if len(found) == 1 and None not in found else None


def backend_note(backend: str | None, spec: str = "") -> str:
    """Why this backend's connections say nothing of its collectives ("" when they do: gloo)."""
    if backend == "gloo":
        return ""
    shown = spec or backend
    if backend is None:
        return (f"backend {shown}: which of its backends carries the stalled op is not known, so whether it "
                "still moves data cannot be read here")
    if backend == "nccl":
        return (f"backend {shown}: its collectives move data over links no socket shows (NVLink, PCIe, "
                "InfiniBand), so whether a collective still moves cannot be read here")
    return (f"backend {shown}: whether its collectives move data over connections this guard reads is not known, "
            "so whether one still moves cannot be read here")


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
    """This process's connections now, when ``backend`` (a group's backend spec) is gloo's; a
    Transport with idle_s None and a note when they cannot say (another backend, /proc unreadable,
    no connection found)."""
    note = backend_note(backend_for(backend), backend)
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


def process_group(dist: Any, name: str | None) -> Any:
    """The process group torch names ``name`` (the flight recorder's and the guard's name: "0" is the
    default group), None for the default group; LookupError when this process has none of that name."""
    c10d = dist.distributed_c10d
    if name is None:
        return c10d.GroupMember.WORLD
    try:
        names = list(c10d._world.pg_names.items())  # private; torch 2.1-2.14 keep pg -> name there
    except Exception:
        names = list(getattr(c10d, "_pg_names", {}).items())  # the same table, named so before torch 2.0
    for pg, pg_name in names:
        if str(pg_name) == str(name):
            return pg
    raise LookupError(f"no process group named {name!r} in this process")


def group_backend(dist: Any, group: str | None, devices: Iterable[str] = ()) -> str | None:
    """The backend that carries an op on ``devices`` in ``group`` ("gloo", "nccl", ...); None when it
    cannot be told. Never raises."""
    try:
        return backend_for(str(dist.get_backend(process_group(dist, group))), devices)
    except Exception:  # a group gone, a private table changed: cannot tell
        return None


def read_for(dist: Any, group: str | None = None, recorder: Any = None) -> Transport:
    """The connections that carry ``group``'s traffic (None: the default group), for the device of the
    guarded call that waits in it (``recorder``'s running calls); never raises."""
    devices = {d for r in (recorder.running_records() if recorder is not None else ()) if r.group == group
               for d in r.devices}
    try:
        spec = str(dist.get_backend(process_group(dist, group)))
        ports = store_ports(dist.distributed_c10d._get_default_store())
    except LookupError as exc:
        return Transport(note=f"the stalled group's backend could not be read ({exc})")
    except Exception as exc:  # private API, or the group is gone: cannot tell
        return Transport(note=f"the backend could not be read ({type(exc).__name__})")
    backend = backend_for(spec, devices)
    if backend != "gloo":
        return Transport(note=backend_note(backend, spec))
    try:
        return read("gloo", ports)
    except Exception as exc:  # a probe never takes the answer down
        return Transport(note=f"the connections could not be read ({type(exc).__name__}: {str(exc)[:100]})")
