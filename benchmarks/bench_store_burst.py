"""A burst of TCPStore connections against torch's store server: how long an existing client's request waits.

    python benchmarks/bench_store_burst.py                  # 32 clients, 5 runs, libuv and legacy
    python benchmarks/bench_store_burst.py --clients 24 --quick --json

A TCPStore server (torch's, in a process of its own, as torchrun's agent hosts one) and one client
that calls check() every 20 ms; meanwhile N threads each open one more client — all at once (the
subject), or 15 ms apart (the baseline; distdoctor's ranks open their extra clients at slots 20 ms
apart, world/store_clients.py). The figure is the worst check() of the existing client during the
burst; the note gives the slowest connect. Measured on torch 2.13: 32 at once stall the libuv
server about 5 s for every client. Figures are printed, not asserted.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from statistics import median

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from timing import PYTHON, Figure, print_figures, standard_arguments  # noqa: E402

SERVER = """
import sys, time
from datetime import timedelta
import torch.distributed as dist
store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, use_libuv={libuv},
                      timeout=timedelta(seconds=60))
print(store.port, flush=True)
sys.stdin.read()
"""


def burst(port: int, clients: int, gap_s: float) -> tuple[float, float]:
    """(the worst check() of an existing client, the slowest connect) while ``clients`` connect."""
    import torch.distributed as dist  # torch only in the measuring process

    poller = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
    worst, stop, connects = [0.0], threading.Event(), []

    def poll() -> None:
        while not stop.is_set():
            started = time.monotonic()
            poller.check(["distdoctor/bench"])
            worst[0] = max(worst[0], time.monotonic() - started)
            time.sleep(0.02)

    def connect(i: int) -> None:
        time.sleep(i * gap_s)
        started = time.monotonic()
        dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
        connects.append(time.monotonic() - started)

    watcher = threading.Thread(target=poll, daemon=True)
    watcher.start()
    threads = [threading.Thread(target=connect, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    time.sleep(0.3)
    stop.set()
    watcher.join()
    return worst[0], max(connects)


def measure(libuv: bool, clients: int, repeats: int) -> Figure:
    at_once, spread, slowest = [], [], []
    for _ in range(repeats):
        for gap, into in ((0.0, at_once), (0.015, spread)):
            server = subprocess.Popen([PYTHON, "-c", SERVER.format(libuv=libuv)], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True)
            try:
                port = int(server.stdout.readline())
                worst, connect = burst(port, clients, gap)
                into.append(worst)
                if gap == 0.0:
                    slowest.append(connect)
            finally:
                server.kill()
                server.wait(30)
    backend = "libuv" if libuv else "legacy"
    s, b = median(at_once), median(spread)
    return Figure(f"{clients} connects, {backend}", f"{clients} TCPStore clients connecting at once: the worst "
                  "check() of an existing client", s, [round(x, 3) for x in at_once],
                  "the same clients 15 ms apart", b, [round(x, 3) for x in spread], s / b if b else None,
                  "" if b else "-", "no stall (distdoctor opens its extra clients at 20 ms slots)",
                  f"{backend} backend; slowest connect in the burst: median {median(slowest):.2f} s")


def main() -> None:
    parser = standard_arguments(__doc__)
    parser.add_argument("--clients", type=int, default=32)
    args = parser.parse_args()
    repeats = 1 if args.quick else args.repeats
    print_figures([measure(libuv, args.clients, repeats) for libuv in (True, False)], args.json)


if __name__ == "__main__":
    main()
