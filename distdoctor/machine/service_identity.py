"""Tell a c10d TCPStore from a foreign service listening on MASTER_PORT, in bounded time.

How a TCPStore behaves on the wire (torch/csrc/distributed/c10d/TCPStoreBackend.hpp, measured
with torch 2.13 on both the libuv and the legacy backend):
  - it never speaks first: no banner on connect;
  - to a client that sends QueryType::VALIDATE (0) with the magic 0x3C85F7CE and then
    QueryType::PING (13) with a 32-bit nonce, it answers the nonce (4 bytes) at once. Both
    messages are read-only: the store's keys are untouched;
  - a store of a torch release without PING (2.1-2.4) closes the connection on it; it answers
    QueryType::CHECK (a 64-bit key count, then per key a 64-bit length and the bytes) with one
    byte, NOT_READY (1) for a key that does not exist -- read-only too, and in every release
    (numbered 5, or 4 on torch 2.1, whose protocol has no VALIDATE);
  - to an HTTP request or a short garbage write it answers nothing and keeps the connection
    open (it waits for the rest of a "message"), so silence alone proves nothing.
So the probe: (1) wait briefly for a banner (SSH, SMTP, FTP, MySQL... speak first) -> foreign;
(2) send VALIDATE+PING -> the nonce back means a c10d store, other bytes or a close mean a
foreign service; (3) still silent: on a fresh connection send an HTTP request -> an "HTTP/"
answer means a web server (python -m http.server, a metrics endpoint...). Silent throughout:
"could not tell" -- unless the port is held by this process's parent on this host: a launcher
(torchrun's agent, the self-test supervisor) that hosts the c10d store for its workers, answering
slowly because it is busy (many ranks starting at once on few cores). A slow store is a slow
store, not a foreign service. Every step has its own socket timeout, so the whole probe is bounded.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
import time
from dataclasses import dataclass
from typing import Any

import psutil

VALIDATE, CHECK, PING = 0, 5, 13
CHECK_BEFORE_VALIDATE = 4  # torch 2.1: no VALIDATE, so every query type is one lower
NOT_READY = 1  # CheckResponseType: the key does not exist
MAGIC = 0x3C85F7CE

C10D_STORE = "c10d_store"
FOREIGN = "foreign"
SILENT = "silent"
UNREACHABLE = "unreachable"


@dataclass(frozen=True)
class PortIdentity:
    kind: str  # C10D_STORE, FOREIGN, SILENT or UNREACHABLE
    detail: str
    answer: str = ""  # the first bytes the service sent, printable
    protocol: str = ""  # "http", "ssh", "smtp"... when recognisable
    elapsed_s: float = 0.0
    slow: bool = False  # a c10d store known by its holder, not by a timely answer


def _printable(data: bytes, limit: int = 80) -> str:
    text = data[:limit].decode("latin-1")
    return "".join(ch if 32 <= ord(ch) < 127 else "." for ch in text)


def _protocol(data: bytes) -> str:
    head = data[:16].upper()
    for marker, name in ((b"HTTP/", "http"), (b"SSH-", "ssh"), (b"220", "smtp/ftp"), (b"+OK", "pop3"), (b"* OK", "imap"), (b"RFB ", "vnc")):
        if head.startswith(marker):
            return name
    if b"HTTP/" in data[:64].upper():
        return "http"
    return ""


def _recv(sock: socket.socket, timeout: float, want: int = 256) -> bytes | None:
    """Bytes received within timeout; b"" when the peer closed; None when it stayed silent."""
    sock.settimeout(max(timeout, 0.01))
    try:
        return sock.recv(want)
    except socket.timeout:
        return None
    except ConnectionResetError:
        return b""


def _connect(address: tuple, family: int, timeout: float) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(address)
    except BaseException:
        sock.close()
        raise
    return sock


def _http_answer(host: str, address: tuple, family: int, left: Any, start: float) -> PortIdentity | None:
    """A FOREIGN or SILENT identity from an HTTP request on a fresh connection; None when it stays silent."""
    try:
        http = _connect(address, family, min(left(), 1.0))
    except OSError as exc:
        return PortIdentity(SILENT, f"silent to a c10d ping, then refused a second connection ({exc.strerror or exc})",
                            elapsed_s=time.monotonic() - start)
    try:
        http.sendall(f"HEAD / HTTP/1.0\r\nHost: {host}\r\nUser-Agent: distdoctor\r\n\r\n".encode())
        answer = _recv(http, left())
    except OSError:
        answer = None
    finally:
        http.close()
    if answer:
        return PortIdentity(FOREIGN, "it does not answer a c10d store ping but answers an HTTP request",
                            _printable(answer), _protocol(answer) or "unknown", time.monotonic() - start)
    return None


def _parent_holds(sock: socket.socket, port: int) -> str:
    """'pid N (name)' when the peer of ``sock`` is this host and this process's parent listens on
    ``port`` there; '' otherwise (or when it cannot be told)."""
    try:
        peer, mine = sock.getpeername()[0], sock.getsockname()[0]
        if not (peer == mine or ipaddress.ip_address(peer.split("%", 1)[0]).is_loopback):
            return ""
        parent = psutil.Process(os.getppid())
        for conn in parent.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port:
                return f"pid {parent.pid}, {parent.name()}"
    except (OSError, ValueError, psutil.Error):
        return ""
    return ""


def _answers_check(address: tuple, family: int, left: Any) -> str:
    """Which store generation answers a read-only CHECK of a key nobody writes ('' if none).

    Stores without the ping query close the connection on it. CHECK is in every release and its
    answer is one byte, NOT_READY for a missing key; it is asked twice, so that a stray byte from
    a foreign service does not pass. Two wire generations (measured with real stores):
    torch 2.2-2.4 validate first and number CHECK 5; torch 2.1 has no validation and numbers it 4
    (its SET is 0, so the validation message is a SET whose 64-bit key length is about 10^12:
    the store drops the connection and writes nothing).
    """
    for name, hello, check in (("validating", struct.pack("<BI", VALIDATE, MAGIC), CHECK),
                               ("pre-validation", b"", CHECK_BEFORE_VALIDATE)):
        if left() <= 0.1:
            return ""
        key = b"distdoctor/identity/" + os.urandom(8).hex().encode()
        query = struct.pack("<BQQ", check, 1, len(key)) + key
        if _two_answers(address, family, left, hello + query + query) == bytes([NOT_READY, NOT_READY]):
            return name
    return ""


def _two_answers(address: tuple, family: int, left: Any, message: bytes) -> bytes:
    """The first two bytes answered to ``message`` on a fresh connection when no third follows."""
    try:
        sock = _connect(address, family, min(max(left(), 0.05), 1.0))
    except OSError:
        return b""
    try:
        sock.sendall(message)
        reply = b""
        while len(reply) < 2 and left() > 0.05:
            chunk = _recv(sock, min(0.25, left() - 0.05), 2 - len(reply))
            if chunk == b"":
                return b""
            reply += chunk or b""
        return reply if len(reply) == 2 and not _recv(sock, 0.02, 1) else b""
    except OSError:
        return b""
    finally:
        sock.close()


# How long a greeting (SSH, SMTP...) is waited for before the store handshake is sent. A server
# on this host greets within a millisecond; one that greets later answers the handshake with its
# greeting instead, which still reads as foreign (only the detail differs).
BANNER_WAIT_S, LOOPBACK_BANNER_WAIT_S = 0.15, 0.02


def _banner_wait(address: Any) -> float:
    try:
        loopback = ipaddress.ip_address(str(address[0]).split("%", 1)[0]).is_loopback
    except (ValueError, IndexError, TypeError):
        loopback = False
    return LOOPBACK_BANNER_WAIT_S if loopback else BANNER_WAIT_S


def identify(host: str, port: int, timeout: float = 1.5) -> PortIdentity:
    """What listens on host:port. Never raises; takes at most about ``timeout`` seconds."""
    start = time.monotonic()
    budget = max(timeout, 0.3)

    def left() -> float:
        return budget - (time.monotonic() - start)

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        family, _, _, _, address = infos[0]
    except (OSError, IndexError) as exc:
        return PortIdentity(UNREACHABLE, f"{host} does not resolve: {exc}")

    # Steps 1 and 2 on one connection.
    try:
        sock = _connect(address, family, min(left(), 1.0))
    except OSError as exc:
        return PortIdentity(UNREACHABLE, f"cannot connect: {exc.strerror or exc}", elapsed_s=time.monotonic() - start)
    try:
        banner = _recv(sock, min(_banner_wait(address), left() / 4))
        if banner:
            return PortIdentity(
                FOREIGN, "it sends a greeting as soon as a client connects; a c10d store never speaks first",
                _printable(banner), _protocol(banner), time.monotonic() - start,
            )
        if banner == b"":
            return PortIdentity(FOREIGN, "it closes a new connection at once, without a word; a c10d store keeps it open",
                                elapsed_s=time.monotonic() - start)
        nonce = int.from_bytes(os.urandom(4), "little") | 1
        try:
            sock.sendall(struct.pack("<BI", VALIDATE, MAGIC) + struct.pack("<BI", PING, nonce))
        except OSError as exc:
            return PortIdentity(FOREIGN, f"it refused a c10d handshake ({exc.strerror or exc})", elapsed_s=time.monotonic() - start)
        reply = b""
        # A busy store answers late: wait for the ping most of the budget, keeping a little for
        # the HTTP probe (a web server answers that at once).
        reserve = max(0.3, budget * 0.4)
        while len(reply) < 4 and left() > reserve:
            chunk = _recv(sock, min(0.25, left() - reserve), 4 - len(reply))
            if chunk is None:
                continue
            if chunk == b"":
                generation = _answers_check(address, family, left) if not reply else ""
                if generation:
                    return PortIdentity(C10D_STORE, f"it answered a c10d store key check ({generation} protocol, "
                                        "read-only): a store of a torch release without the ping query",
                                        elapsed_s=time.monotonic() - start)
                return PortIdentity(FOREIGN, "it closed the connection on a c10d store handshake (validate + ping)",
                                    _printable(reply), _protocol(reply), time.monotonic() - start)
            reply += chunk
        if len(reply) == 4 and struct.unpack("<I", reply)[0] == nonce:
            return PortIdentity(C10D_STORE, "it answered a c10d store ping (validate + ping, read-only)",
                                elapsed_s=time.monotonic() - start)
        if reply:
            return PortIdentity(FOREIGN, "it answered a c10d store ping with something else",
                                _printable(reply), _protocol(reply), time.monotonic() - start)
        holder = _parent_holds(sock, port)
    finally:
        sock.close()


    # Step 3: silent to the store protocol. Is it a web server waiting for a request line?
    if left() > 0.1:
        answer = _http_answer(host, address, family, left, start)
        if isinstance(answer, PortIdentity):
            return answer
    if holder:
        return PortIdentity(C10D_STORE, f"it did not answer a store ping within {budget:g}s, but it is held by "
                            f"this process's launcher ({holder}), which hosts the c10d store: a busy store",
                            elapsed_s=time.monotonic() - start, slow=True)
    return PortIdentity(
        SILENT,
        f"it accepts connections but answered neither a c10d store ping nor an HTTP request within {budget:g}s",
        elapsed_s=time.monotonic() - start,
    )
