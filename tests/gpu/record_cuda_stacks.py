"""Record real py-spy dumps of CUDA jobs on a GPU machine (the fixtures of tests/stacks' CUDA cases).

    python tests/gpu/record_cuda_stacks.py OUTDIR

Starts small jobs on GPU 0 and reads each with `py-spy dump --json` (with and without --native),
several times, into OUTDIR/<job>/<rank>-<n>[-native].json, plus OUTDIR/<job>/log.txt (the job's
own output) and OUTDIR/facts.json (torch, CUDA, NCCL, py-spy versions). The jobs:

- cuda_busy: one process queues large matrix products and calls loss.item(): a healthy GPU job
  whose main thread waits in the CUDA runtime while the GPU computes (no collective anywhere);
- nccl_one_rank: a 1-rank NCCL world, all_reduce then .item() in a loop (healthy);
- gloo_cuda_straggler: 2 ranks with gloo on CUDA tensors; rank 1 sleeps, rank 0 waits in
  all_reduce of a CUDA tensor;
- ddp_gloo_cuda_straggler: DDP on CUDA with gloo; rank 1 sleeps before a step, rank 0 waits in
  backward (the reducer's all-reduce);
- nccl_two_ranks_one_gpu: 2 NCCL ranks on one GPU (what NCCL says when two ranks share a GPU).

Nothing here is a test: it records evidence. It needs root (py-spy --native attaches with ptrace).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

JOBS = {
    "cuda_busy": textwrap.dedent("""
        import time, torch
        x = torch.randn(8192, 8192, device="cuda")
        print("ready", flush=True)
        end = time.time() + 40
        while time.time() < end:
            y = x
            for _ in range(40):
                y = (y @ x).clamp_(-1, 1)
            loss = y.sum()
            print("loss", loss.item(), flush=True)
    """),
    "nccl_one_rank": textwrap.dedent("""
        import time, torch, torch.distributed as dist
        dist.init_process_group("nccl", rank=0, world_size=1)
        torch.cuda.set_device(0)
        x = torch.randn(8192, 8192, device="cuda")
        print("ready", flush=True)
        end = time.time() + 40
        while time.time() < end:
            y = x
            for _ in range(20):
                y = (y @ x).clamp_(-1, 1)
            dist.all_reduce(y)
            print("loss", y.sum().item(), flush=True)
        dist.destroy_process_group()
    """),
    "gloo_cuda_straggler": textwrap.dedent("""
        import os, time, torch, torch.distributed as dist
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        t = torch.ones(1 << 20, device="cuda")
        dist.all_reduce(t)
        print("ready", flush=True)
        if rank == 1:
            time.sleep(60)
        dist.all_reduce(t)
        print("done", t[0].item(), flush=True)
    """),
    "ddp_gloo_cuda_straggler": textwrap.dedent("""
        import time, torch, torch.distributed as dist
        from torch import nn
        from torch.nn.parallel import DistributedDataParallel as DDP
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        model = DDP(nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024)).cuda())
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        print("ready", flush=True)
        for step in range(1000):
            if rank == 1 and step == 3:
                time.sleep(60)
            loss = model(torch.randn(256, 1024, device="cuda")).square().mean()
            loss.backward()
            opt.step(); opt.zero_grad()
            print("step", step, loss.item(), flush=True)
    """),
    "nccl_two_ranks_one_gpu": textwrap.dedent("""
        import torch, torch.distributed as dist
        dist.init_process_group("nccl")
        torch.cuda.set_device(0)
        t = torch.ones(4, device="cuda")
        dist.all_reduce(t)
        torch.cuda.synchronize()
        print("all_reduce on one GPU with two ranks:", t.tolist(), flush=True)
    """),
}
WORLD = {"cuda_busy": 1, "nccl_one_rank": 1, "gloo_cuda_straggler": 2, "ddp_gloo_cuda_straggler": 2,
         "nccl_two_ranks_one_gpu": 2}
READS = 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(name: str, folder: Path) -> list[subprocess.Popen]:
    script = folder / "job.py"
    script.write_text(JOBS[name])
    port = free_port()
    procs = []
    for rank in range(WORLD[name]):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(WORLD[name]), "LOCAL_RANK": str(rank),
               "LOCAL_WORLD_SIZE": str(WORLD[name]), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "PYTHONUNBUFFERED": "1", "TORCH_FR_BUFFER_SIZE": "2000"}
        log = open(folder / f"log-rank{rank}.txt", "w")
        procs.append(subprocess.Popen([sys.executable, str(script)], env=env, stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True))
    return procs


def wait_ready(folder: Path, ranks: int, limit_s: float) -> bool:
    until = time.monotonic() + limit_s
    while time.monotonic() < until:
        logs = [(folder / f"log-rank{r}.txt").read_text(errors="replace") for r in range(ranks)]
        if all("ready" in text for text in logs):
            return True
        time.sleep(0.5)
    return False


def dump(pid: int, native: bool) -> dict:
    cmd = [shutil.which("py-spy") or "py-spy", "dump", "--pid", str(pid), "--json"]
    if native:
        cmd.append("--native")
    else:
        cmd.append("--nonblocking")
    started = time.monotonic()
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        return {"cmd": cmd, "rc": out.returncode, "seconds": round(time.monotonic() - started, 3),
                "stdout": out.stdout, "stderr": out.stderr[-4000:]}
    except subprocess.TimeoutExpired:
        return {"cmd": cmd, "rc": None, "seconds": 30, "stdout": "", "stderr": "timed out"}


def record(name: str, out: Path) -> None:
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    procs = start(name, folder)
    try:
        ready = wait_ready(folder, len(procs), 60 if name != "nccl_two_ranks_one_gpu" else 0)
        if name == "nccl_two_ranks_one_gpu":
            for p in procs:
                try:
                    p.wait(60)
                except subprocess.TimeoutExpired:
                    pass
            (folder / "exit.json").write_text(json.dumps([p.returncode for p in procs]))
            return
        if not ready:
            (folder / "not-ready.txt").write_text("the job did not print 'ready' within 60 s")
        time.sleep(3)  # past the first steps: in the loop (or in the straggler's wait)
        for n in range(READS):
            for rank, p in enumerate(procs):
                for native in (False, True):
                    result = dump(p.pid, native)
                    suffix = "-native" if native else ""
                    (folder / f"rank{rank}-{n}{suffix}.json").write_text(json.dumps(result))
            time.sleep(0.4)
        (folder / "proc.json").write_text(json.dumps({r: open(f"/proc/{p.pid}/stat").read() for r, p in enumerate(procs)
                                                      if p.poll() is None}))
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
            p.wait()


def facts(out: Path) -> None:
    import torch

    info = {"torch": torch.__version__, "cuda": torch.version.cuda,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None,
            "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
            "python": sys.version,
            "py_spy": subprocess.run(["py-spy", "--version"], capture_output=True, text=True).stdout.strip()}
    (out / "facts.json").write_text(json.dumps(info, indent=1))


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    facts(out)
    for name in (sys.argv[2:] or JOBS):
        started = time.monotonic()
        record(name, out)
        print(f"{name}: {time.monotonic() - started:.1f} s", flush=True)


if __name__ == "__main__":
    main()
