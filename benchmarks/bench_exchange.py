"""Exchange and aggregation at rank 0 for 1, 64, 256 and 1024 simulated ranks against one store.

One real TCPStore (in this process, on loopback); the simulated ranks are threads, each with its
own client connection (32 at most, each serving a share of the ranks), doing exactly what a rank
does: claim its rank, post its check-in (a realistic ~4 KB payload with local findings and 30
check results), later post its collective results. Rank 0 is a distdoctor.world.store_exchange.World with its
own connection, running the real wait_for_checkins / wait_done / results and the real
consolidation (merge_findings, merge_check_entries). Its store requests are counted.

Printed per world size: the time at rank 0 (from its first request until its report is built),
its requests and the bytes it read, and the cost per rank. Target: a few seconds at 1024 ranks,
requests at rank 0 independent of the world size (bytes grow linearly).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SIZES = (1, 64, 256, 1024)
QUICK_SIZES = (1, 8)
MAX_CLIENTS = 32
TARGET = "a few s at 1024 ranks; rank-0 requests O(1) per phase"


class Counting:
    """Forwards to a store and counts the requests and the bytes read back."""

    def __init__(self, store: Any) -> None:
        self._store, self.requests, self.bytes_read = store, 0, 0
        self.by_method: dict[str, int] = {}

    @property
    def inner(self) -> Any:
        """The wrapped store, as distdoctor's own store wrappers name it (world.store_api.innermost):
        its methods, ``check`` among them, are the ones this store answers."""
        return self._store

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self.requests += 1
            self.by_method[name] = self.by_method.get(name, 0) + 1
            out = attr(*args, **kwargs)
            if isinstance(out, bytes):
                self.bytes_read += len(out)
            elif isinstance(out, list):
                self.bytes_read += sum(len(x) for x in out if isinstance(x, bytes))
            return out

        return call


def sample_payload(rank: int) -> dict[str, Any]:
    finding = {"id": "system.W009", "severity": "warning", "cause": "cpu_oversubscription",
               "title": "8 local ranks x 16 threads = 128 threads on 64 cores", "detail": "x" * 300,
               "remediation": "export OMP_NUM_THREADS=8", "ranks": [rank], "hosts": [f"node-{rank // 8}"],
               "check": "system.cpu_and_memory"}
    checks = [{"name": f"area.check_{i}", "stage": "local", "status": "pass", "duration_s": 0.001} for i in range(30)]
    env = {f"NCCL_SETTING_{i}": "value" for i in range(12)}
    return {
        "host": f"node-{rank // 8}", "pid": 10000 + rank, "node_rank": rank // 8, "local_rank": rank % 8,
        "local_world_size": 8, "device": None, "findings": [finding], "checks": checks,
        "snapshot": {"host": f"node-{rank // 8}", "torch": {"torch": "2.13.0", "cuda": None, "nccl": None},
                     "launcher": {"world_size": None, "master_addr": "node-0", "master_port": 29500},
                     "env": env, "interfaces": {"eth0": {"up": True, "ipv4": ["10.0.0.1"], "ipv6": []}}},
    }


def simulate(size: int) -> dict[str, Any]:
    from torch.distributed import TCPStore

    from distdoctor.world.rank_payload import merge_check_entries
    from distdoctor.core.findings import Finding
    from distdoctor.core.report import merge_findings
    from distdoctor.world.store_exchange import World
    from distdoctor.world.store_open import WorldSpec

    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60))

    def spec(rank: int) -> WorldSpec:
        return WorldSpec(rank, size, "127.0.0.1", server.port, "agent", "distdoctor/bench", "bench")

    def client() -> Any:
        return TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=60))

    nclients = min(MAX_CLIENTS, max(size - 1, 1))
    shares = [list(range(1 + i, size, nclients)) for i in range(nclients)]
    payloads = {r: sample_payload(r) for r in range(size)}
    for r in range(size):
        payloads[r]["snapshot"]["launcher"]["world_size"] = size
    results_message = {"checks": [{"name": f"collective.c{i}", "stage": "collective", "status": "pass",
                                   "duration_s": 0.01} for i in range(8)], "findings": [], "incomplete": False}
    go = threading.Event()
    posted: list[float] = []

    def ranks_of(share: list[int]) -> None:
        store = client()
        worlds = [World(spec(r), store) for r in share]
        go.wait()
        for w in worlds:
            w.check_in(payloads[w.rank])
        posted.append(time.monotonic())
        for w in worlds:
            w.mark_done("collective", results_message)

    threads = [threading.Thread(target=ranks_of, args=(s,), daemon=True) for s in shares if s]
    for t in threads:
        t.start()
    root = World(spec(0), client())
    counter = Counting(root.store)
    root.store = counter  # type: ignore[assignment]
    start = time.monotonic()
    go.set()
    root.check_in(payloads[0])
    checkins = root.wait_for_checkins(time.monotonic() + 60)
    gathered_checkins = time.monotonic()
    done = root.wait_done("collective", range(1, size), time.monotonic() + 60)
    results = root.results("collective", done)
    gathered = time.monotonic()
    findings = [Finding.from_dict(f) for p in checkins.accepted.values() for f in p["findings"]]
    merged = merge_findings(findings)
    entries = [([r], c) for r, p in checkins.accepted.items() for c in p["checks"]]
    entries += [([r], c) for r, res in results.items() for c in res["checks"]]
    checks = merge_check_entries(entries)
    end = time.monotonic()
    for t in threads:
        t.join(10)
    assert checkins.missing == [] and len(done) == size - 1, "the simulated world did not complete"
    assert len(merged) == 1 and merged[0].ranks == tuple(range(size))
    return {
        "ranks": size,
        "rank0_s": end - start,
        "checkins_s": gathered_checkins - start,
        "results_s": gathered - gathered_checkins,
        "aggregate_s": end - gathered,
        "rank0_requests": counter.requests,
        "rank0_requests_by_method": dict(counter.by_method),
        "rank0_bytes": counter.bytes_read,
        "merged_checks": len(checks),
        "per_rank_ms": 1000 * (end - start) / size,
    }


def measure(repeats: int = 1, quick: bool = False) -> list[Any]:
    from timing import Figure

    figures = []
    for size in QUICK_SIZES if quick else SIZES:
        runs = [simulate(size) for _ in range(max(repeats, 1))]
        runs.sort(key=lambda r: r["rank0_s"])
        mid = runs[len(runs) // 2]
        figures.append(Figure(
            name=f"exchange, {size} ranks",
            subject="rank 0: check-ins + results + merged report",
            median_s=mid["rank0_s"],
            runs_s=[round(r["rank0_s"], 4) for r in runs],
            target=TARGET,
            note=f"{mid['rank0_requests']} store requests, {mid['rank0_bytes'] / 1024:.0f} KiB read at rank 0; "
                 f"{mid['per_rank_ms']:.2f} ms per rank",
        ))
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--quick", action="store_true", help="small sizes, one run")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--sizes", type=str, default="", help="comma-separated world sizes (overrides the default)")
    args = parser.parse_args(argv)
    if args.sizes:
        rows = [simulate(int(s)) for s in args.sizes.split(",")]
        for row in rows:
            print(json.dumps(row) if args.json else _line(row))
        return 0
    figures = measure(args.repeats, args.quick)
    if args.json:
        print(json.dumps([f.to_dict() for f in figures]))
    else:
        for f in figures:
            print(f"{f.name:<22} {f.median_s:8.3f}s  {f.note}")
    return 0


def _line(row: dict[str, Any]) -> str:
    return (f"{row['ranks']:>5} ranks: rank 0 {row['rank0_s']:.3f}s (check-ins {row['checkins_s']:.3f}s, results "
            f"{row['results_s']:.3f}s, aggregation {row['aggregate_s']:.3f}s), {row['rank0_requests']} requests, "
            f"{row['rank0_bytes'] / 1024:.0f} KiB read, {row['per_rank_ms']:.2f} ms/rank")


if __name__ == "__main__":
    sys.exit(main())
