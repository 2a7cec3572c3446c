"""Jobs at the edges of the guard's policy, each chosen by argv[1]; the script knows nothing of distdoctor
(except `slowstore`, which builds its own store and turns the guard on itself).

lastminute T S   a group timeout of T s; rank 1 arrives S s late at one all_reduce (S just under T)
evaluate T S     a group timeout of T s; rank 0 evaluates for S s (S over T) while rank 1 waits
caught S         rank 1's all_reduce in a group rank 0 never joins fails, and rank 1 catches the error
                 and goes on; later rank 1 is S s late at one all_reduce of the default group
steps N DIR      N short steps (0.1 s each); each rank writes its pid to DIR/rank<R> first (a test
                 stops and continues it)
slowstore S PORT rank 1 reaches rank 0's store through a slow proxy on PORT; rank 0 is S s late once
transfer N DIR [group]  one small all_reduce, then DIR/ready<R>; once DIR/go exists, one all_reduce of N
                 floats (with "group": in a second gloo group, the default group idle)
"""

import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

mode = sys.argv[1]


def evaluate(seconds):
    time.sleep(seconds)  # LINE:evaluate


if mode in ("lastminute", "evaluate"):
    timeout_s, late_s = float(sys.argv[2]), float(sys.argv[3])
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))
elif mode == "slowstore":
    late_s, proxy = float(sys.argv[2]), int(sys.argv[3])
    rank = int(os.environ["RANK"])
    port = int(os.environ["MASTER_PORT"])
    # Rank 0 hosts the store; rank 1's client (torch's and the guard's) goes through the proxy.
    store = dist.TCPStore("127.0.0.1", port if rank == 0 else proxy, 2, rank == 0, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    import distdoctor

    distdoctor.guard(hang_timeout=float(os.environ["HANG_TIMEOUT"]))
else:
    dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(4)

if mode == "caught":
    late_s = float(sys.argv[2])
    lonely = dist.new_group([0, 1], timeout=timedelta(seconds=2))
    if rank == 1:
        try:
            dist.all_reduce(torch.ones(2), group=lonely)  # rank 0 never joins: gloo times out
        except Exception as exc:  # the user's own retry / fallback
            print(f"rank 1 caught {type(exc).__name__}", flush=True)

if mode == "transfer":
    second = dist.new_group([0, 1], backend="gloo") if sys.argv[4:] == ["group"] else None
    dist.all_reduce(t)
    if second is not None:
        dist.all_reduce(t, group=second)
    ready = os.path.join(sys.argv[3], f"ready{rank}")
    with open(ready, "w") as fh:
        fh.write(str(os.getpid()))
    until = time.monotonic() + 120
    while not os.path.exists(os.path.join(sys.argv[3], "go")) and time.monotonic() < until:
        time.sleep(0.1)
    started = time.monotonic()
    dist.all_reduce(torch.ones(int(sys.argv[2])), group=second)  # LINE:transfer
    print(f"rank {rank}: the all_reduce took {time.monotonic() - started:.1f} s", flush=True)
elif mode == "steps":
    with open(os.path.join(sys.argv[3], f"rank{rank}"), "w") as fh:
        fh.write(str(os.getpid()))
    for step in range(int(sys.argv[2])):
        time.sleep(0.1)
        dist.all_reduce(t)  # LINE:steps
else:
    for step in range(6):
        if mode in ("lastminute", "caught") and rank == 1 and step == 3:
            time.sleep(late_s)  # LINE:late
        if mode in ("evaluate", "slowstore") and rank == 0 and step == 3:
            evaluate(late_s)
        dist.all_reduce(t)  # LINE:wait
print(f"rank {rank} done", flush=True)
dist.destroy_process_group()
