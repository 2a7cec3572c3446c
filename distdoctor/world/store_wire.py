"""A c10d TCPStore client in plain Python sockets: every request bounded, safe in any thread when the interpreter exits."""

# Why not torch's own client (torch.distributed.TCPStore) for a thread of distdoctor's own: a thread
# that is inside torch's C++ code (a connect, a request) when the interpreter finalizes is unwound
# through C++ frames that do not allow it when it comes back, and the process aborts ("terminate
# called without an active exception", exit -6) after a job that succeeded. A thread inside Python's
# socket module comes back into plain C and simply ends. Every request here also has its own
# deadline (a store that accepts connections and never answers costs one timeout, not a hang), and
# a request that failed closes the connection, so a late answer is never read as the next one.
#
# The wire protocol (torch/csrc/distributed/c10d/TCPStore.cpp and TCPStoreBackend.hpp; measured on
# torch 2.1.2, 2.13.0 and 2.14.1, with the libuv and the legacy server alike): a query is one byte,
# its type, then its arguments; integers are native (little-endian on every platform torch ships);
# a key or a value is its length as a u64 and then its bytes; torch's client puts "/" before every
# key, so this client does too (the same keys as torch's clients of the same store). Three
# generations, told apart on connect by what the server answers (machine.service_identity reads
# the same three): a validation message (VALIDATE + magic) then PING with a nonce answered (2.5 on);
# validation without PING (2.2-2.4: the server closes the connection on PING); no validation at
# all, every query type one lower (2.1). The replies used here: COMPARE_SET and GET a vector, ADD
# and DELETE_KEY an i64, CHECK one byte (0 ready), MULTI_GET one vector per key; SET and APPEND none.

from __future__ import annotations

import os
import socket
import struct
import threading
import time
from typing import Iterable, Sequence

from distdoctor.machine.service_identity import MAGIC, NOT_READY, PING, VALIDATE

KEY_PREFIX = b"/"
# Query types of the generations with validation (2.2 on); 2.1 numbers each one lower.
SET, COMPARE_SET, GET, ADD, CHECK, DELETE_KEY, APPEND, MULTI_GET = 1, 2, 3, 4, 5, 8, 9, 10
PINGING, VALIDATING, PRE_VALIDATION = "ping", "validating", "pre-validation"
MAX_VALUE = 64 << 20  # a reply longer than this is not a store's answer to our keys: the stream is off
# A refused connect is tried again within the connect's budget (a store restarting, a listen queue that
# refuses when full), as torch's own client does; a failed reconnect makes the next requests fail at
# once for a while (RETRY_FIRST_S, twice as long each time, at most RETRY_MOST_S), so a rank that
# lost its store never spends a connect's budget on every request (its end makes several).
REFUSED_PAUSE_S = 0.2
RETRY_FIRST_S, RETRY_MOST_S = 1.0, 30.0


class StoreWireError(ConnectionError):
    """A request did not complete: no connection, no answer in time, or an answer that is not the store's."""

    def __init__(self, message: str, timed_out: bool = False, gone: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out
        self.gone = gone  # the store closed the connection or refused it: its host process ended


def store_gone(exc: BaseException | None) -> bool:
    """The store a request went to is gone (closed the connection, refused a new one), not slow."""
    return isinstance(exc, StoreWireError) and exc.gone


def _u64(value: int) -> bytes:
    return struct.pack("<Q", value)


def _blob(data: bytes) -> bytes:
    return _u64(len(data)) + data


def _bytes(value: str | bytes | bytearray) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


def _key(key: str | bytes) -> bytes:
    return _blob(KEY_PREFIX + _bytes(key))


class StoreClient:
    """One connection to a c10d TCPStore; opened by the first request (or connect()), opened again
    after a failed one. Thread-safe (one request at a time)."""

    def __init__(self, host: str, port: int, timeout_s: float = 5.0, connect_timeout_s: float | None = None) -> None:
        self.host, self.port = host, int(port)
        self.timeout_s = float(timeout_s)
        self.connect_timeout_s = float(connect_timeout_s if connect_timeout_s is not None else timeout_s)
        self.generation = ""            # decided by the first connection, kept for the next ones
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._failures = 0              # failed connections in a row
        self._retry_at = 0.0            # time.monotonic(): no connection is tried before this
        self._last_gone = False         # the last failed connection was refused: the store is gone

    # -- the connection ---------------------------------------------------------------------------
    def connect(self) -> "StoreClient":
        with self._lock:
            self._connection()
        return self

    def close(self) -> None:
        with self._lock:
            self._drop()

    def _drop(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass

    def _dial(self, budget_s: float) -> socket.socket:
        """A TCP connection within ``budget_s``; a refused one is tried again until the budget is spent."""
        until = time.monotonic() + budget_s
        while True:
            left = until - time.monotonic()
            try:
                sock = socket.create_connection((self.host, self.port), timeout=max(0.05, left))
                break
            except ConnectionRefusedError as exc:
                if left <= REFUSED_PAUSE_S:
                    raise StoreWireError(f"cannot connect to the store at {self.host}:{self.port}: "
                                         f"{exc.strerror or exc} (for {budget_s:g} s)", gone=True) from exc
                time.sleep(REFUSED_PAUSE_S)
            except OSError as exc:
                raise StoreWireError(f"cannot connect to the store at {self.host}:{self.port}: "
                                     f"{exc.strerror or exc}", timed_out=isinstance(exc, socket.timeout)) from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def _connection(self) -> socket.socket:
        """The open connection, or a new one: the first gets the connect's budget, a reconnect the
        request's; after a failed one, none is tried until its pause is over (the request fails at once)."""
        if self._sock is not None:
            return self._sock
        if time.monotonic() < self._retry_at:
            raise StoreWireError(f"no connection to the store at {self.host}:{self.port} (the last attempt failed "
                                 f"{self._failures} time{'s' if self._failures > 1 else ''} in a row)",
                                 gone=self._last_gone)
        try:
            self._sock = self._open()
        except StoreWireError as exc:
            self._last_gone = exc.gone
            self._failures += 1
            self._retry_at = time.monotonic() + min(RETRY_MOST_S, RETRY_FIRST_S * 2 ** (self._failures - 1))
            raise
        self._failures, self._retry_at = 0, 0.0
        return self._sock

    def _open(self) -> socket.socket:
        """A connection, validated as this store's generation wants (learnt on the first one)."""
        if self.generation:
            sock = self._dial(self.timeout_s)
            sock.settimeout(self.timeout_s)
            if self.generation != PRE_VALIDATION:
                self._send(sock, struct.pack("<BI", VALIDATE, MAGIC))
            return sock
        for generation in (PINGING, VALIDATING, PRE_VALIDATION):
            sock = self._dial(self.connect_timeout_s)
            try:
                if self._answers(sock, generation):
                    self.generation = generation
                    sock.settimeout(self.timeout_s)
                    return sock
            except StoreWireError as exc:
                if exc.timed_out:  # silent, not closed: a store of any generation answers or closes at once
                    sock.close()
                    raise StoreWireError(f"what listens at {self.host}:{self.port} accepted the connection but did "
                                         f"not answer a store's handshake within {self.connect_timeout_s:g} s",
                                         timed_out=True) from exc
            sock.close()
        raise StoreWireError(f"what listens at {self.host}:{self.port} does not answer as a c10d store")

    def _answers(self, sock: socket.socket, generation: str) -> bool:
        """Whether the server speaks ``generation``: a ping answered, or a read-only CHECK of a key
        nobody writes answered NOT_READY (the server closes the connection on a query it does not know)."""
        sock.settimeout(self.connect_timeout_s)  # a store busy with thousands of connects answers late
        if generation == PINGING:
            nonce = int.from_bytes(os.urandom(4), "little") | 1
            self._send(sock, struct.pack("<BI", VALIDATE, MAGIC) + struct.pack("<BI", PING, nonce))
            return struct.unpack("<I", self._recv(sock, 4))[0] == nonce
        hello = struct.pack("<BI", VALIDATE, MAGIC) if generation == VALIDATING else b""
        check = CHECK - (generation == PRE_VALIDATION)
        key = b"distdoctor/wire/" + os.urandom(8).hex().encode()
        self._send(sock, hello + bytes([check]) + _u64(1) + _blob(key))
        return self._recv(sock, 1) == bytes([NOT_READY])

    # -- one request --------------------------------------------------------------------------------
    def _send(self, sock: socket.socket, data: bytes) -> None:
        try:
            sock.sendall(data)
        except OSError as exc:
            raise StoreWireError(f"the store at {self.host}:{self.port} closed the connection ({exc})",
                                 gone=True) from exc

    def _recv(self, sock: socket.socket, size: int) -> bytes:
        chunks, left = [], size
        while left:
            try:
                chunk = sock.recv(min(left, 1 << 20))
            except socket.timeout as exc:
                raise StoreWireError(f"the store at {self.host}:{self.port} did not answer within "
                                     f"{sock.gettimeout():g} s", timed_out=True) from exc
            except OSError as exc:
                raise StoreWireError(f"the store at {self.host}:{self.port} closed the connection ({exc})",
                                     gone=True) from exc
            if not chunk:
                raise StoreWireError(f"the store at {self.host}:{self.port} closed the connection", gone=True)
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def _vector(self, sock: socket.socket) -> bytes:
        size = struct.unpack("<Q", self._recv(sock, 8))[0]
        if size > MAX_VALUE:
            raise StoreWireError(f"the store at {self.host}:{self.port} answered a value of {size} bytes: not an answer")
        return self._recv(sock, size)

    def _request(self, query: int, body: bytes, reply: str = "", count: int = 1) -> object:
        """Send one query; read its reply ("vector", "i64", "byte", "vectors" (``count`` of them) or
        none). Any failure closes the connection, so no later request reads this one's answer."""
        with self._lock:
            sock = self._connection()
            if self.generation == PRE_VALIDATION:
                query -= 1
            try:
                self._send(sock, bytes([query]) + body)
                if reply == "vector":
                    return self._vector(sock)
                if reply == "i64":
                    return struct.unpack("<q", self._recv(sock, 8))[0]
                if reply == "byte":
                    return self._recv(sock, 1)[0]
                if reply == "vectors":
                    return [self._vector(sock) for _ in range(count)]
                return None
            except BaseException:
                self._drop()
                raise

    # -- the store's methods, as torch's TCPStore has them ---------------------------------------------
    def set(self, key: str, value: str | bytes) -> None:
        self._request(SET, _key(key) + _blob(_bytes(value)))

    def compare_set(self, key: str, expected: str | bytes, desired: str | bytes) -> bytes:
        return self._request(COMPARE_SET, _key(key) + _blob(_bytes(expected)) + _blob(_bytes(desired)), "vector")

    def get(self, key: str) -> bytes:
        """The value of a key that exists (the server's GET does not wait: ask check() first)."""
        return self._request(GET, _key(key), "vector")

    def add(self, key: str, amount: int) -> int:
        return self._request(ADD, _key(key) + struct.pack("<q", int(amount)), "i64")

    def check(self, keys: Sequence[str]) -> bool:
        keys = list(keys)
        return self._request(CHECK, _u64(len(keys)) + b"".join(_key(k) for k in keys), "byte") == 0

    def delete_key(self, key: str) -> bool:
        return self._request(DELETE_KEY, _key(key), "i64") == 1

    def append(self, key: str, value: str | bytes) -> None:
        self._request(APPEND, _key(key) + _blob(_bytes(value)))

    def multi_get(self, keys: Iterable[str]) -> list[bytes]:
        keys = list(keys)
        if not keys:
            return []
        return self._request(MULTI_GET, _u64(len(keys)) + b"".join(_key(k) for k in keys), "vectors", len(keys))
