"""How long after a collective's call gloo raises for its group's timeout (plain torch, no distdoctor; torch 2.1+).

argv[1]: the timeout T in seconds. Rank 1 calls all_reduce, recv and barrier, each in a group of its own
with timeout T that rank 0 never joins; it prints one line per call, "OVERSHOOT <op> <seconds past T>".
"""

import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

timeout_s = float(sys.argv[1])
dist.init_process_group("gloo")
rank = dist.get_rank()
ops = {
    "all_reduce": lambda g: dist.all_reduce(torch.ones(1024), group=g),
    "recv": lambda g: dist.recv(torch.ones(1024), src=0, group=g),
    "barrier": lambda g: dist.barrier(group=g),
}
groups = {name: dist.new_group([0, 1], timeout=timedelta(seconds=timeout_s)) for name in ops}
if rank == 1:
    for name, call in ops.items():
        started = time.monotonic()
        try:
            call(groups[name])
            print(f"COMPLETED {name}", flush=True)
        except Exception:  # the group's timeout: what is measured
            print(f"OVERSHOOT {name} {time.monotonic() - started - timeout_s:.3f}", flush=True)
else:
    time.sleep(len(ops) * timeout_s + 5)
os._exit(0)  # a group whose collective timed out cannot be destroyed cleanly
