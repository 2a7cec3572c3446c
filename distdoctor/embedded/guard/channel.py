"""The guard's side channel: a TCPStore client of its own on the job's store, under a per-job prefix."""

# Never the process group (it may be the stuck thing) and never the group's own store client (a
# thread blocked in it would hold it): a client of its own, every operation bounded by the store's
# timeout. A thread blocked in a store wait would abort the process at exit when rank 0 hosts the
# store, so readers poll with `check` instead of waiting (world.store_api: on torch 2.1-2.2, which
# bind no `Store.check` in Python, the same answer from `compare_set`).

from __future__ import annotations

import json
import os
import uuid
from datetime import timedelta
from typing import Any

from distdoctor.world.store_api import keys_exist

STORE_OP_TIMEOUT_S = 5.0


def _tcp_store_address(store: Any) -> tuple[str, int] | None:
    """(host, port) of the TCPStore under a (Prefix)Store; None for a FileStore, HashStore..."""
    seen = 0
    while store is not None and seen < 8:
        if hasattr(store, "host") and hasattr(store, "port"):
            try:
                return str(store.host), int(store.port)
            except Exception:
                return None
        store = getattr(store, "underlying_store", None)
        seen += 1
    return None


class SideChannel:
    """A client of the job's TCPStore of its own (not the process group's) under a per-job prefix."""

    def __init__(self, talk: Any, prefix: str) -> None:
        self.talk, self.prefix = talk, prefix
        self.can_delete = callable(getattr(talk, "delete_key", None))

    @classmethod
    def open(cls, default_store: Any, generation: int, timeout_s: float = STORE_OP_TIMEOUT_S) -> "SideChannel | None":
        import torch.distributed as dist  # torch is imported on first use: it costs seconds, and `import distdoctor` must stay cheap

        address = _tcp_store_address(default_store)
        if address is None:
            return None
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        # Every rank proposes a nonce; compare_set keeps the first, so all agree without waiting.
        nonce = default_store.compare_set(f"distdoctor/guard/nonce/{restart}/{generation}", "", uuid.uuid4().hex)
        prefix = f"distdoctor/guard/{nonce.decode() if isinstance(nonce, bytes) else nonce}"
        talk = dist.TCPStore(address[0], address[1], is_master=False, timeout=timedelta(seconds=timeout_s),
                             wait_for_workers=False)
        return cls(talk, prefix)

    def key(self, *parts: Any) -> str:
        return "/".join([self.prefix, *map(str, parts)])

    def put(self, key: str, value: Any) -> None:
        self.talk.set(key, json.dumps(value, default=str))

    def get(self, key: str) -> Any:
        return json.loads(self.talk.get(key))

    def claim(self, key: str, value: str) -> str:
        """compare_set: the value now at key (``value`` when this call set it first)."""
        got = self.talk.compare_set(key, "", value)
        return got.decode() if isinstance(got, bytes) else str(got)

    def count(self, key: str, by: int = 1) -> int:
        return int(self.talk.add(key, by))

    def there(self, key: str) -> bool:
        return keys_exist(self.talk, [key])

    def present(self, keys: list[str]) -> list[bool]:
        return [self.there(k) for k in keys]

    def forget(self, keys: list[str]) -> None:
        """Delete keys no one reads any more (the store stays bounded over a week-long job)."""
        if not self.can_delete:
            return
        for key in keys:
            self.talk.delete_key(key)

    def wait_for(self, key: str, timeout_s: float) -> bool:
        """Poll (not wait: see above) until key exists; False when timeout_s passed first."""
        import time

        until = time.monotonic() + timeout_s
        while not self.there(key):
            if time.monotonic() >= until:
                return False
            time.sleep(0.05)
        return True

    def read_many(self, kind: str, ranks: list[int]) -> dict[int, Any]:
        """The values of ``kind/<rank>`` that are there (malformed ones are left out)."""
        out = {}
        for rank, there in zip(ranks, self.present([self.key(kind, r) for r in ranks])):
            if there:
                try:
                    out[rank] = self.get(self.key(kind, rank))
                except (ValueError, TypeError):  # a malformed value: as if absent
                    continue
        return out
