"""A DDP loop (CPU, gloo) for the guard's slow-rank accounting: rank 1 slower by a known amount, or balanced.

    python pace_job.py MODE SECONDS [EXTRA_MS]

Each step reads its batch (a 15 ms wait for storage, the same on every rank; none in contend mode, where every
step is CPU work: a rank that sleeps part of each step keeps its share of a shared core), then a small DDP step. MODE:
data (rank 1's read takes EXTRA_MS longer), gc (rank 1 collects a large heap every 4th step), contend (every
rank makes its batch with 3 ms of CPU work, pinned to a core of its own by DISTDOCTOR_TEST_CORES="0,1";
rank 1 starts a busy process on its core, which runs while it makes its batch), balanced (every rank makes its batch with CPU work
and collects the same heap every 4th step). Every rank prints, measured by itself, the mean time per step of what differs between ranks (the
read and the collection: `varied_ms`) and of the extra it was given (`injected_ms`); a test expects the
cost of rank 1's extra to be rank 1's varied_ms minus rank 0's: the machine's other load lengthens a
rank's reads too. The DDP step itself is kept small.
"""

import gc
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset

MODE, SECONDS = sys.argv[1], float(sys.argv[2])
EXTRA_S = float(sys.argv[3]) / 1e3 if len(sys.argv) > 3 else 0.0
READ_S = 0.015
RANK = int(os.environ["RANK"])
if os.environ.get("DISTDOCTOR_TEST_CORES"):
    os.sched_setaffinity(0, {int(os.environ["DISTDOCTOR_TEST_CORES"].split(",")[RANK])})
hog = None
if MODE == "contend" and RANK == 1:
    # A busy process on rank 1's core, in rank 1's session: the kernel shares a core between sessions
    # (autogroups) and moves other processes off a busy core, so only a process of its own session takes
    # rank 1's share, whatever else the machine runs. Its PID is left for the test, which ends it too.
    # It runs while rank 1 makes its batch and is stopped otherwise, so that the extra time is all in the
    # batch's work, which each rank times (the cost a test expects).
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    Path("busy.pid").write_text(str(hog.pid))
    os.kill(hog.pid, signal.SIGSTOP)
torch.set_num_threads(1)
injected = [0.0]


def make_batch():
    """3 ms of CPU work on this machine when the core is free: a batch made from raw data."""
    started = time.perf_counter()
    if hog is not None:
        os.kill(hog.pid, signal.SIGCONT)
    a = torch.randn(96, 96)
    for _ in range(40):
        a = torch.tanh(a @ a / 96)  # LINE:work
    if hog is not None:
        os.kill(hog.pid, signal.SIGSTOP)
    injected[0] += time.perf_counter() - started


class Batches(Dataset):
    """Each item is a whole batch, read from (simulated) storage."""

    def __len__(self):
        return 1 << 30

    def __getitem__(self, index):
        if MODE != "contend":  # contend: every step on a CPU, more than a fair share of a shared core asks
            time.sleep(READ_S)
        if MODE == "data" and RANK == 1:
            started = time.perf_counter()
            # A slower read: its storage, its network.
            time.sleep(EXTRA_S)  # LINE:extra
            injected[0] += time.perf_counter() - started
        if MODE in ("contend", "balanced"):
            make_batch()
        return torch.randn(32, 64), torch.randn(32, 16)


def tidy():
    started = time.perf_counter()
    gc.collect()  # LINE:collect
    return time.perf_counter() - started


dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 16)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
gc.freeze()  # what the job built so far stays out of every collection: only the heap below is collected
heap = [[i] for i in range(250_000)] if MODE == "balanced" or (MODE == "gc" and RANK == 1) else []
loader = iter(DataLoader(Batches(), batch_size=None))
stop = torch.zeros(1)
started, steps, varied, rest = time.monotonic(), 0, 0.0, 0.0
while True:
    begun = time.perf_counter()
    x, y = next(loader)  # LINE:data
    if heap and steps % 4 == 0:  # a full collection every 4th step
        spent = tidy()  # LINE:tidy
        injected[0] += spent if MODE == "gc" else 0.0
    varied += time.perf_counter() - begun
    begun = time.perf_counter()
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)  # LINE:forward
    loss.backward()  # LINE:backward
    optimizer.step()
    rest += time.perf_counter() - begun
    steps += 1
    if steps % 25 == 0:  # every rank stops at the same step: rank 0's clock decides
        stop.fill_(1.0 if RANK == 0 and time.monotonic() - started >= SECONDS else 0.0)
        dist.all_reduce(stop)
        if stop.item():
            break
print(f"rank {RANK} injected_ms {injected[0] / steps * 1e3:.3f} varied_ms {varied / steps * 1e3:.3f} "
      f"rest_ms {rest / steps * 1e3:.3f} steps {steps} "
      f"step_ms {(time.monotonic() - started) / steps * 1e3:.3f}", flush=True)
if hog is not None:
    hog.kill()
    hog.wait()
dist.destroy_process_group()
print(f"rank {RANK} done", flush=True)
