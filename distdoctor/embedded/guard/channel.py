"""The guard's side channel: a TCPStore client of its own on the job's store, opened when first needed, batched reads."""

# Never the process group (it may be the stuck thing) and never the group's own store client (a
# thread blocked in it would hold it): a client of its own, in plain Python sockets
# (world.store_wire), every operation bounded by its timeout. Not torch's TCPStore client: a thread
# inside torch's C++ code when the interpreter finalizes aborts the process as it comes back
# ("terminate called without an active exception"), so a client opened or asked in the guard's own
# threads must be one whose calls end in Python.
# At thousands of ranks the store is the job's one shared resource, so the channel costs it little:
#   - no connection storm: the client is opened at the first need (the watchdog's first poll,
#     jittered over its first interval, or a stall), retried with backoff within a budget, and
#     kept; a rank that cannot connect reports from its own view (guard.I011) and is "not heard
#     from" to the others, never counted against them;
#   - reads are batched: what many ranks publish (their hello, their answer to a look, their final
#     state) is a key per rank plus one roster key they append their rank to, so a reader gets the
#     roster (one request) and the values it lists (one multi_get per 256 keys): O(1) round trips
#     per read, not 2 per rank;
#   - no read waits: a key that may be missing is read with compare_set
#     (world.store_api.get_if_present), one request that never waits.
# Every request is counted with its bytes and its round trip: the answer deadline adapts to it
# (embedded.guard.cadence) and benchmarks/bench_scale.py reports it.

from __future__ import annotations

import json
import os
import random
import threading
import time
import uuid
from typing import Any, Callable, Iterable

from distdoctor.world import store_api

STORE_OP_TIMEOUT_S = 5.0
# The first connection (and its handshake) may wait longer than a request: a store that thousands of
# ranks connect to at once accepts and answers late. It is opened in a thread of its own, so the
# watchdog never waits for it.
CONNECT_TIMEOUT_S = 30.0
CONNECT_BUDGET_S = 120.0   # how long a rank keeps trying to open its client before it reports alone
MULTI_GET_CHUNK = 256      # keys per multi_get: one request stays bounded on a slow store


def open_client(host: str, port: int, timeout_s: float = STORE_OP_TIMEOUT_S) -> Any:
    """A client of the store at host:port (world.store_wire): CONNECT_TIMEOUT_S to connect, ``timeout_s``
    per request; connected (and its protocol learnt) before it is returned."""
    from distdoctor.world.store_wire import StoreClient

    return StoreClient(host, port, timeout_s=timeout_s, connect_timeout_s=max(CONNECT_TIMEOUT_S, timeout_s)).connect()


class ChannelDown(ConnectionError):
    """The side channel has no client (not yet, or never: its connection budget is spent)."""


def _tcp_store_address(store: Any) -> tuple[str, int] | None:
    """(host, port) of the TCPStore under a (Prefix)Store; None for a FileStore, HashStore..."""
    found = _tcp_store(store)
    if found is None:
        return None
    try:
        return str(found.host), int(found.port)
    except Exception:
        return None


def _tcp_store(store: Any) -> Any:
    """The TCPStore object under a (Prefix)Store (torch's own client), or None."""
    seen = 0
    while store is not None and seen < 8:
        if hasattr(store, "host") and hasattr(store, "port"):
            return store
        store = getattr(store, "underlying_store", None)
        seen += 1
    return None


class Traffic:
    """What the channel asked of the store: requests per method, bytes read, the latest round trips."""

    def __init__(self) -> None:
        self.requests: dict[str, int] = {}
        self.bytes_read = 0
        self.rtt_s: float | None = None   # a moving average of one request's round trip

    def count(self, method: str, seconds: float, read: int = 0) -> None:
        self.requests[method] = self.requests.get(method, 0) + 1
        self.bytes_read += read
        if method not in ("connect", "hello"):  # a connection or torch's client: not this client's round trip
            self.rtt_s = seconds if self.rtt_s is None else 0.8 * self.rtt_s + 0.2 * seconds

    @property
    def total(self) -> int:
        return sum(self.requests.values())


def _size(value: Any) -> int:
    if isinstance(value, (bytes, bytearray, str)):
        return len(value)
    if isinstance(value, (list, tuple)):
        return sum(_size(v) for v in value)
    return 8


class SideChannel:
    """A client of the job's TCPStore of its own (not the process group's) under a per-job prefix."""

    def __init__(self, talk: Any, prefix: str, connect: Callable[[], Any] | None = None) -> None:
        self._talk, self.prefix, self._connect = talk, prefix, connect
        self.traffic = Traffic()
        self.lock = threading.RLock()  # the watchdog and the main thread (a final state) share one client
        self.problem = ""              # why the last connection attempt failed
        self.gave_up = False
        self._first_try: float | None = None
        self._next_try = 0.0
        self._attempts = 0
        self._connecting: threading.Thread | None = None
        self._connecting_lock = threading.Lock()

    @classmethod
    def open(cls, default_store: Any, generation: int, timeout_s: float = STORE_OP_TIMEOUT_S) -> "SideChannel | None":
        """The channel of this job (not connected yet); None when the job's store is not a TCPStore."""
        address = _tcp_store_address(default_store)
        if address is None:
            return None
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        # Every rank proposes a nonce; compare_set keeps the first, so all agree without waiting.
        nonce = default_store.compare_set(f"distdoctor/guard/nonce/{restart}/{generation}", "", uuid.uuid4().hex)
        prefix = f"distdoctor/guard/{nonce.decode() if isinstance(nonce, bytes) else nonce}"

        channel = cls(None, prefix, lambda: open_client(address[0], address[1], timeout_s))
        channel.torch_client = _tcp_store(default_store)
        return channel

    torch_client: Any = None  # the job's own TCPStore client: used once, from the main thread, for the hello

    def hello(self, rank: int, value: Any) -> None:
        """Publish ``hello/<rank>`` when the guard starts, from the main thread through torch's own
        client (already connected, idle at that moment): every rank's hello is there before any
        rank opens a client of its own."""
        client = self.torch_client if self.torch_client is not None else self.talk
        started = time.monotonic()
        client.set(self.key("hello", rank), json.dumps(value, default=str))
        store_api.append(client, self.key("hello", "roster"), f"{rank},")
        self.traffic.count("hello", time.monotonic() - started)

    # -- the client ---------------------------------------------------------------------------
    @property
    def connected(self) -> bool:
        return self._talk is not None

    @property
    def talk(self) -> Any:
        """The store client; raises ChannelDown while it is being opened (in a thread of its own: the
        watchdog never waits for a connection) or cannot be."""
        return self.client()

    def client(self, wait_s: float = 0.0) -> Any:
        """The store client, waiting up to ``wait_s`` for a connection in progress (a final state at exit)."""
        if self._talk is not None:
            return self._talk
        with self._connecting_lock:
            if self._talk is None and self._connecting is None:
                self._start_connecting()
            connecting = self._connecting
        if connecting is not None and wait_s > 0:
            connecting.join(wait_s)
        if self._talk is None:
            raise ChannelDown(f"not connected to the job's store yet{f' ({self.problem})' if self.problem else ''}")
        return self._talk

    @property
    def connecting(self) -> bool:
        """A connection is being opened now (in its own thread)."""
        connecting = self._connecting
        return connecting is not None and connecting.is_alive()

    def _start_connecting(self) -> None:
        now = time.monotonic()
        if self._connect is None or self.gave_up:
            raise ChannelDown(self.problem or "no store to connect to")
        if now < self._next_try:
            return
        self._first_try = now if self._first_try is None else self._first_try
        self._connecting = threading.Thread(target=self._open, name="distdoctor-guard-connect", daemon=True)
        self._connecting.start()

    def _open(self) -> None:
        started = time.monotonic()
        try:
            talk = self._connect()
        except Exception as exc:
            self._attempts += 1
            text = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
            self.problem = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
            if time.monotonic() - (self._first_try or started) >= CONNECT_BUDGET_S:
                self.gave_up = True
            # Backoff with jitter: ranks that failed together do not come back together.
            self._next_try = time.monotonic() + min(2.0 ** self._attempts, 30.0) * random.uniform(0.5, 1.5)
            self._connecting = None
            return
        self.traffic.count("connect", time.monotonic() - started)
        self.problem = ""
        self._talk, self._connecting = talk, None

    def _do(self, method: str, *args: Any, wait_s: float = 0.0) -> Any:
        talk = self.client(wait_s)
        with self.lock:
            started = time.monotonic()
            out = getattr(talk, method)(*args)
            self.traffic.count(method, time.monotonic() - started, _size(out) if method in _READS else 0)
            return out

    # -- single keys ---------------------------------------------------------------------------
    def key(self, *parts: Any) -> str:
        return "/".join([self.prefix, *map(str, parts)])

    def put(self, key: str, value: Any) -> None:
        self._do("set", key, json.dumps(value, default=str))

    def get(self, key: str) -> Any:
        return json.loads(self._do("get", key))

    def get_if_present(self, key: str) -> Any:
        """The JSON value at key, or None when it is not there (one request, never waits)."""
        raw = self._do("compare_set", key, store_api.ABSENT, store_api.ABSENT)
        return None if store_api.is_absent(raw) else json.loads(raw)

    def claim(self, key: str, value: str) -> str:
        """compare_set: the value now at key (``value`` when this call set it first)."""
        got = self._do("compare_set", key, "", value)
        return got.decode() if isinstance(got, bytes) else str(got)

    def swap(self, key: str, old: str, new: str) -> str:
        """compare_set(key, old, new): the value now at key (``new`` when it held ``old``)."""
        got = self._do("compare_set", key, old, new)
        return got.decode() if isinstance(got, bytes) else str(got)

    def count(self, key: str, by: int = 1) -> int:
        return int(self._do("add", key, by))

    def there(self, key: str) -> bool:
        return store_api.keys_exist(_Counted(self), [key])

    def forget(self, keys: Iterable[str]) -> None:
        """Delete keys no one reads any more (the store stays bounded over a week-long job)."""
        for key in keys:
            if callable(getattr(self.talk, "delete_key", None)):
                self._do("delete_key", key)

    # -- what many ranks publish: a key each and a roster ---------------------------------------
    def publish(self, kind: str, rank: int, value: Any, wait_s: float = 0.0) -> None:
        """``kind/<rank>`` = value, and the rank appended to ``kind``'s roster (set first: a rank listed is
        there). ``wait_s``: how long to wait for a connection still being opened."""
        self._do("set", self.key(kind, rank), json.dumps(value, default=str), wait_s=wait_s)
        store_api.append(_Counted(self), self.key(kind, "roster"), f"{rank},")

    def roster(self, kind: str) -> list[int]:
        """The ranks that published ``kind`` so far, in the order they did (one request)."""
        raw = self._do("compare_set", self.key(kind, "roster"), store_api.ABSENT, store_api.ABSENT)
        if store_api.is_absent(raw):
            return []
        text = raw.decode(errors="replace") if isinstance(raw, (bytes, bytearray)) else str(raw)
        out, seen = [], set()
        for part in text.split(","):
            if part.strip().isdigit() and int(part) not in seen:
                seen.add(int(part))
                out.append(int(part))
        return out

    def read_many(self, kind: str, ranks: Iterable[int], listed: Iterable[int] | None = None) -> dict[int, Any]:
        """The values of ``kind/<rank>`` for the ranks among ``ranks`` that published one (malformed ones are
        left out): the roster, then the values in batches. ``listed``: the roster already read."""
        wanted = list(dict.fromkeys(ranks))
        if listed is None and not kind.startswith(ROSTERED):  # a kind published key by key (the episodes)
            listed = [r for r in wanted if self.there(self.key(kind, r))]
        keep = set(wanted)
        there = [r for r in (self.roster(kind) if listed is None else listed) if r in keep]
        out: dict[int, Any] = {}
        for start in range(0, len(there), MULTI_GET_CHUNK):
            chunk = there[start:start + MULTI_GET_CHUNK]
            keys = [self.key(kind, r) for r in chunk]
            if store_api.keys_exist(_Counted(self), keys):
                raws = store_api.multi_get(_Counted(self), keys)
            else:  # one was deleted since it was listed (an answer to a look long done): read one by one
                raws = [self._do("compare_set", k, store_api.ABSENT, store_api.ABSENT) for k in keys]
                raws = [None if store_api.is_absent(r) else r for r in raws]
            for rank, raw in zip(chunk, raws):
                try:
                    out[rank] = json.loads(raw)
                except (ValueError, TypeError):  # a malformed value: as if absent
                    continue
        return out


ROSTERED = ("hello", "final", "look/")  # kinds published with a roster (SideChannel.publish)
_READS = frozenset({"get", "multi_get", "compare_set", "add"})


class _Counted:
    """The channel's client as world.store_api sees it: every call counted by the channel."""

    def __init__(self, channel: SideChannel) -> None:
        self._channel = channel
        self.inner = channel.talk  # store_api.innermost: the method probes look at the real client's class

    def __getattr__(self, name: str) -> Any:
        if not callable(getattr(self.inner, name, None)):
            raise AttributeError(name)
        return lambda *args: self._channel._do(name, *args)
