"""The soak's training job (benchmarks/soak.py starts it under `distdoctor guard -- torchrun`): a 4-rank
DDP loop on gloo with a 50 ms data loader, pausing or failing as its schedule says.

    soak_job.py MODE DURATION_S SCHEDULE_JSON OUT_DIR

MODE pauses: each event {"at": s, "rank": r, "kind": sleep|evaluate|checkpoint, "seconds": s} runs
on its rank at the first step after `at` seconds; the job ends after DURATION_S (every rank agrees
through a per-step all_reduce of a stop flag, as a loss is logged). Fault modes run one fault at
the first event's `at` on its rank: raise, recvcycle (the event's rank and the next one receive
from each other), mismatch (the event's rank all_reduces 3 floats where the others reduce 4).
kill / stop are done from outside (soak.py signals the rank whose pid is in OUT_DIR/pid<R>).
At the end each rank writes OUT_DIR/stats<R>.json: its guard watchdog's CPU seconds and its wall time.
"""

import json
import os
import sys
import threading
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from distdoctor.machine.thread_clock import read_thread

mode, duration_s, schedule_path, out = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
with open(os.path.join(out, f"pid{rank}"), "w") as fh:
    fh.write(str(os.getpid()))
torch.manual_seed(rank)
model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8)))
loss_fn, optimizer = nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.001)
with open(schedule_path) as fh:
    events = [e for e in json.load(fh) if e["rank"] == rank or mode == "recvcycle" and e["rank"] + 1 == rank]


def load_batch(seconds):
    time.sleep(seconds)  # LINE:sleep


def evaluate(seconds):
    until = time.monotonic() + seconds
    with torch.no_grad():
        while time.monotonic() < until:
            model.module(torch.randn(256, 32))  # LINE:evaluate


def save_checkpoint(seconds):
    until = time.monotonic() + seconds
    path = os.path.join(out, f"checkpoint{rank}.pt")
    while time.monotonic() < until:
        torch.save(model.module.state_dict(), path)  # LINE:checkpoint


def fault(event):
    if mode == "raise":
        raise ValueError(f"no label in batch {step}")  # LINE:raise
    if mode == "recvcycle":
        peer = event["rank"] + 1 if rank == event["rank"] else event["rank"]
        dist.recv(torch.zeros(4), src=peer)  # LINE:recv
    if mode == "mismatch":
        global flag_size
        flag_size = 3


PAUSES = {"sleep": load_batch, "evaluate": evaluate, "checkpoint": save_checkpoint}
flag_size = 1
dist.barrier()
started = time.monotonic()
step = 0
while True:
    now = time.monotonic() - started
    while events and events[0]["at"] <= now:
        event = events.pop(0)
        if mode == "pauses":
            PAUSES[event["kind"]](event["seconds"])
        else:
            fault(event)
    time.sleep(0.05)  # the data loader
    optimizer.zero_grad()
    loss = loss_fn(model(torch.randn(16, 32)), torch.randn(16, 8))
    loss.backward()
    optimizer.step()
    stop = torch.tensor([1.0 if time.monotonic() - started >= duration_s else 0.0] * flag_size)
    dist.all_reduce(stop, op=dist.ReduceOp.MAX)  # LINE:stop
    step += 1
    if stop[0].item():
        break

watch = next((t for t in threading.enumerate() if t.name == "distdoctor-guard-watch"), None)
clock = read_thread(f"/proc/self/task/{watch.native_id}") if watch is not None else None
with open(os.path.join(out, f"stats{rank}.json"), "w") as fh:
    json.dump({"rank": rank, "steps": step, "wall_s": time.monotonic() - started,
               "guard_cpu_s": clock.cpu_s if clock is not None else None}, fh)
print(f"rank {rank} done after {step} steps", flush=True)
dist.destroy_process_group()
