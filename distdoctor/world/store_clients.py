"""A rank's extra TCPStore clients (its process group's, its final-word watcher's), opened early and staggered."""

# A burst of about thirty TCPStore connections within a few milliseconds stalls torch's store
# server for about 5 s: every request of every client waits (measured on torch 2.13's libuv
# backend, a server in its own process: 32 clients connecting at once, every check() of an
# existing client took 4.99 s and the slowest connect 5.01 s; 24 at once, or 32 spread 15 ms
# apart, none; the legacy backend makes the connects themselves wait 5 s). torchrun's agent store
# is such a server. Each rank of `distdoctor check` opens two clients beside its first — its process
# group's (the group's blocking waits must not hold the rank's own reads) and the final-word
# watcher's — and every rank used to open them at the same moment, the start of the collective
# stage: at 32 ranks under torchrun, the first collective check then waited 5 s, twice.
# So each rank opens them right after its check-in (while rank 0 still waits for the others),
# in a background thread, at a moment of its own: slot (rank mod SLOTS) of SLOT_S seconds; and in
# a world of more than BURST_FREE ranks its first client waits for the same slot (World.open).

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any, Callable

SLOT_S, SLOTS = 0.02, 64   # rank r connects (r mod 64) x 20 ms after its check-in: 1.3 s at most
# A world this small cannot make a burst that stalls the store (24 connects at once were measured
# harmless): its ranks' first connects are not delayed.
BURST_FREE = 16
NAMES = ("group", "final")


def connect_delay(rank: int) -> float:
    return (rank % SLOTS) * SLOT_S


class SpareClients:
    """Clients opened in the background at this rank's slot; take() hands one out (or opens one
    at once when it is not ready within the wait)."""

    def __init__(self, connect: Callable[[timedelta], Any], rank: int) -> None:
        self._connect = connect
        self._rank = rank
        self._spares: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._started = False

    def open_soon(self, timeout: timedelta) -> None:
        """Open one client per name in a daemon thread, after this rank's delay (once)."""
        if self._started:
            return
        self._started = True

        def open_them() -> None:
            try:
                time.sleep(connect_delay(self._rank))
                for name in NAMES:
                    try:
                        client = self._connect(timeout)
                    except Exception:
                        return  # the store is gone or slow: take() opens its own, bounded by its caller
                    with self._lock:
                        self._spares[name] = client
            finally:
                self._ready.set()

        threading.Thread(target=open_them, name="distdoctor-store-clients", daemon=True).start()

    def take(self, name: str, timeout: timedelta, wait_s: float = 0.0) -> Any:
        """The client opened for ``name`` (its timeout set to ``timeout``), else a new one; waits up
        to ``wait_s`` for the background thread first (a client opened now would join a burst)."""
        if self._started and wait_s > 0:
            self._ready.wait(wait_s)
        with self._lock:
            client = self._spares.pop(name, None)
        if client is not None:
            setter = getattr(client, "set_timeout", None)
            if callable(setter):  # every supported torch has it; a client without one keeps its own
                setter(timeout)
            return client
        return self._connect(timeout)

    def discard(self) -> None:
        """The clients not taken are dropped (their connections close with them)."""
        with self._lock:
            self._spares.clear()
