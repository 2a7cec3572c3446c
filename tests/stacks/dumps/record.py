"""Record real `py-spy dump --json` output of ranks stopped in each kind of wait (tests/stacks/jobs/waits.py).

    python tests/stacks/dumps/record.py                      # gloo cases, into tests/stacks/dumps/gloo/
    python tests/stacks/dumps/record.py --backend nccl       # on a machine with 2 GPUs: into dumps/nccl/

(NCCL needs one GPU per rank: two ranks on one GPU fail with "Duplicate GPU detected". The
one-GPU CUDA cases are recorded by tests/gpu/record_cuda_stacks.py into tests/gpu/recorded/.)

For each case a 2-rank torchrun job (sys.executable -m torch.distributed.run) is started; when
both ranks are at the case's point and a moment has passed, each rank is dumped twice — `py-spy
dump --json --nonblocking --locals` (what `distdoctor stacks` reads) and `py-spy dump --json
--native` (C/C++ frames) — into CASE.rankN.json and CASE.rankN.native.json, with meta.json
saying which torch, py-spy, Python and host recorded them. The job is then ended by its PIDs.
The tests (tests/stacks/test_waits.py) read these files; nothing here runs in the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
JOB = HERE.parent / "jobs" / "waits.py"
CASES = {"gloo": ["ddp_backward", "fsdp2_all_gather", "fsdp2_reduce", "fsdp1_reduce", "barrier", "store_wait",
                  "recv", "work_wait"]}
CASES["nccl"] = CASES["gloo"] + ["work_wait_blocking", "cuda_item", "cuda_compute_item"]
EXTRA_ENV = {"work_wait_blocking": {"TORCH_NCCL_BLOCKING_WAIT": "1"}}
READY_S = 300.0
SETTLE_S = 3.0


def pyspy() -> str:
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else (shutil.which("py-spy") or "py-spy")


def record_case(case: str, backend: str, out: Path, port: int) -> list[str]:
    scratch = Path(tempfile.mkdtemp(prefix=f"distdoctor-record-{case}-"))
    ready = scratch / "ready"
    ready.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", **EXTRA_ENV.get(case, {})}
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(port),
            str(JOB), case, str(ready), backend]
    with open(scratch / "job.log", "wb") as log:
        job = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                               cwd=str(scratch))
    pids: dict[int, int] = {}
    written = []
    try:
        deadline = time.monotonic() + READY_S
        while len(pids) < 2:
            if job.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{case}: the job did not reach its point:\n{(scratch / 'job.log').read_text()[-2000:]}")
            time.sleep(0.2)
            pids = {int(p.name[4:]): int(p.read_text()) for p in ready.glob("rank*") if p.read_text()}
        time.sleep(SETTLE_S)
        for rank, pid in sorted(pids.items()):
            for suffix, flags in ((".json", ["--nonblocking", "--locals"]), (".native.json", ["--native"])):
                done = subprocess.run([pyspy(), "dump", "--pid", str(pid), "--json", *flags], capture_output=True,
                                      text=True, timeout=120)
                if done.returncode != 0:
                    raise RuntimeError(f"{case}: py-spy failed on rank {rank}: {done.stderr[-500:]}")
                name = f"{case}.rank{rank}{suffix}"
                (out / name).write_text(json.dumps(json.loads(done.stdout), indent=1) + "\n")
                written.append(name)
    finally:
        for pid in pids.values():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if job.poll() is None:
            job.kill()
        job.wait(30)
        shutil.rmtree(scratch, ignore_errors=True)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=sorted(CASES), default="gloo")
    parser.add_argument("--cases", nargs="*", help="only these cases")
    parser.add_argument("--port", type=int, default=29731)
    args = parser.parse_args()
    import torch

    out = HERE / args.backend
    out.mkdir(exist_ok=True)
    version = subprocess.run([pyspy(), "--version"], capture_output=True, text=True).stdout.strip()
    files = []
    for number, case in enumerate(args.cases or CASES[args.backend]):
        files += record_case(case, args.backend, out, args.port + number)
        print(f"recorded {case}", flush=True)
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    meta = {"recorded_by": "tests/stacks/dumps/record.py", "backend": args.backend, "torch": torch.__version__,
            "py_spy": version, "python": platform.python_version(), "machine": platform.machine(),
            "gpus": gpus, "date": time.strftime("%Y-%m-%d"), "files": sorted(files)}
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")


if __name__ == "__main__":
    main()
