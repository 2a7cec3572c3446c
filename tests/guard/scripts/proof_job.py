"""Jobs at the edge of the guard's proof of "cannot finish", each chosen by argv[1]; the script knows nothing of distdoctor.

leak S      the issue's job: rank 0 isends (tag 7) at step 1 and drops the Work, nobody ever receives it; at
            step 8 rank 1 receives (tag 0) what rank 0 sends after S s; 21 short steps follow: it finishes
kept S      its twin: rank 1 receives the tag-7 send and rank 0 waits on it; the same pause at step 8
matched     rank 0 isends (tag 0) and drops the Work before rank 1 posts the receive that takes it: on gloo
            that send never arrives (rank 1 would wait for the group's timeout); rank 0 then sleeps
standin S   a second process group on a backend whose traffic no TCP socket of the job carries (a CPU
            stand-in for NCCL: its collectives go through the job's c10d store), whose all_reduce
            takes S s, while the default gloo group is idle: it finishes
"""

import gc
import sys
import threading
import time

import torch
import torch.distributed as dist

mode = sys.argv[1]


class StoreGroup(dist.ProcessGroup):
    """A process group whose all_reduce and all_gather move data through the c10d store (no socket of
    its own), its all_reduce ``slow_s`` seconds long: a slow NCCL collective, as a socket reader sees it."""

    def __init__(self, store, rank, size, slow_s):
        super().__init__(rank, size)
        self.store, self.me, self.n, self.slow_s, self.count, self.name_ = store, rank, size, slow_s, 0, ""

    @property
    def group_name(self):  # a Python group has no backend to hold its name
        return self.name_

    def _set_group_name(self, name):
        self.name_ = name

    def getBackendName(self):
        return "storegroup"

    def _exchange(self, tensor, done, slow_s=0.0):
        self.count += 1
        key, fut = f"x{self.count}", torch.futures.Future()

        def run():
            self.store.set(f"{key}/{self.me}", ",".join(repr(float(x)) for x in tensor.flatten().tolist()))
            rows = [torch.tensor([float(x) for x in self.store.get(f"{key}/{r}").decode().split(",")])
                    for r in range(self.n)]
            time.sleep(slow_s)
            done(rows)
            fut.set_result(None)

        threading.Thread(target=run, daemon=True).start()
        return torch._C._distributed_c10d._create_work_from_future(fut)

    def allreduce(self, tensors, opts=None):
        return self._exchange(tensors[0], lambda rows: tensors[0].copy_(sum(rows).view_as(tensors[0])), self.slow_s)

    def allgather(self, outputs, inputs, opts=None):
        def done(rows):
            for out, row in zip(outputs[0], rows):
                out.copy_(row.view_as(out).to(out.dtype))
        return self._exchange(inputs[0].double(), done)


def store_group(options, backend_options):
    group = StoreGroup(options.store, options.group_rank, options.group_size, float(sys.argv[2]))
    group._set_group_name(options.group_id)
    return group


dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(4)

if mode == "standin":
    dist.Backend.register_backend("storegroup", store_group, extended_api=True, devices=["cpu"])
    slow = dist.new_group([0, 1], backend="storegroup")
    dist.all_reduce(t)
    started = time.monotonic()
    dist.all_reduce(t, group=slow)  # LINE:standin
    print(f"rank {rank}: the stand-in's all_reduce took {time.monotonic() - started:.1f} s", flush=True)
    for step in range(20):
        time.sleep(0.1)  # the stall's owner closes it before the job ends
        dist.all_reduce(t)
elif mode == "matched":
    dist.all_reduce(t)
    if rank == 0:
        dist.isend(torch.ones(4), dst=1)  # LINE:matched
        gc.collect()
        time.sleep(120)
    else:
        time.sleep(1.0)  # the send is dropped before this receive is posted
        dist.recv(t, src=0)  # LINE:matchedrecv
else:
    pause = float(sys.argv[2])
    for step in range(30):
        if step == 1 and rank == 0:
            work = dist.isend(torch.ones(4), dst=1, tag=7)  # LINE:dropped
            if mode == "leak":
                del work
                gc.collect()
        if step == 1 and rank == 1 and mode == "kept":
            dist.recv(torch.zeros(4), src=0, tag=7)
        if step == 1 and rank == 0 and mode == "kept":
            work.wait()
        if step == 8:
            if rank == 0:
                time.sleep(pause)  # LINE:pause
                dist.send(torch.full((4,), 2.0), dst=1)
            else:
                dist.recv(t, src=0)  # LINE:recv
        if step > 8:
            time.sleep(0.1)  # the stall's owner closes it before the job ends
        dist.all_reduce(t)
print(f"rank {rank} done", flush=True)
dist.destroy_process_group()
