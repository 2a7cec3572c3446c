"""The c10d store told from a foreign service on the wire of every torch release since 2.1.

torch 2.13's store (libuv and legacy) answers the ping, as in the suite everywhere. The stores
of torch 2.1 (no VALIDATE: SET is 0, CHECK 4) and of 2.2-2.4 (VALIDATE, CHECK 5, no PING) are
emulated here from their wire behaviour as measured against real stores of torch 2.1.2 and 2.4.1
(compat/matrix.py runs the real ones: `distdoctor check` fails with net.E014 if this breaks).
"""

from __future__ import annotations

import socket
import struct
import threading
from datetime import timedelta

import pytest

from distdoctor.machine.service_identity import C10D_STORE, FOREIGN, identify

dist = pytest.importorskip("torch.distributed")
MAGIC = 0x3C85F7CE


def _read(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ConnectionError
        data += chunk
    return data


def _answer_checks(conn: socket.socket, check_type: int) -> None:
    """Answer CHECK queries of missing keys with NOT_READY; any other query ends the connection."""
    while True:
        kind = _read(conn, 1)[0]
        if kind != check_type:
            return
        (count,) = struct.unpack("<Q", _read(conn, 8))
        for _ in range(count):
            (length,) = struct.unpack("<Q", _read(conn, 8))
            if length > 1 << 20:  # the real store fails to allocate: the connection ends
                return
            _read(conn, length)
        conn.sendall(b"\x01")


def old_store(validating: bool) -> tuple[socket.socket, threading.Event]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            with conn:
                try:
                    if validating:
                        if _read(conn, 5) != struct.pack("<BI", 0, MAGIC):
                            continue
                        _answer_checks(conn, 5)
                    else:
                        _answer_checks(conn, 4)
                except (ConnectionError, OSError):
                    pass

    threading.Thread(target=serve, daemon=True).start()
    return listener, stop


@pytest.mark.parametrize("validating, protocol", [(False, "pre-validation"), (True, "validating")],
                         ids=["torch-2.1", "torch-2.2-2.4"])
def test_a_store_without_the_ping_query_is_a_store(validating, protocol):
    listener, stop = old_store(validating)
    try:
        identity = identify("127.0.0.1", listener.getsockname()[1], timeout=3.0)
    finally:
        stop.set()
        listener.close()
    assert identity.kind == C10D_STORE, identity
    assert protocol in identity.detail


def test_the_real_store_of_this_torch_answers_the_ping():
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5))
    store.set("x", "1")
    identity = identify("127.0.0.1", store.port, timeout=3.0)
    assert identity.kind == C10D_STORE
    assert store.num_keys() in (1, 2)  # the probe wrote nothing (some releases count an internal key)


def test_a_service_that_closes_on_anything_is_still_foreign():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            with conn:
                try:
                    conn.recv(64)  # reads the first message, then hangs up
                except OSError:
                    pass

    threading.Thread(target=serve, daemon=True).start()
    try:
        identity = identify("127.0.0.1", listener.getsockname()[1], timeout=3.0)
    finally:
        stop.set()
        listener.close()
    assert identity.kind == FOREIGN
