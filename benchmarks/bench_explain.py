"""Throughput and memory of `distdoctor explain` on a large synthetic log.

    python benchmarks/bench_explain.py            # 100 MB
    python benchmarks/bench_explain.py --mb 20 --keep /tmp/big.log
    python benchmarks/bench_explain.py --mb 1000 --kind progress   # 1 GB of tqdm progress bars
    python benchmarks/bench_explain.py --ranks 1024                # a directory of 1,024 per-rank logs

Generates a log of --mb megabytes (training chatter from 8 ranks, NCCL INFO lines, warnings, and
a real failure pattern near the end: a rank SIGKILLed and its peers' connection resets), then
runs explain_files on it in a child process and prints lines per second and per CPU-second, MB/second
and the child's peak resident memory above its baseline after import. --kind progress writes tqdm
progress bars instead (carriage returns between updates, a newline every 200 of them: a 1 MB line
is normal there), with the same failure at the end. --ranks N writes N per-rank logs made from a real
failing job's (tests/explain/scale_logs.py: a 3-rank gloo job whose rank 2 was SIGKILLed, renumbered;
rank N/2+5 is the killed one) and times explain on the directory: the first failure named, the rest
grouped. The figures are printed, not asserted: the test suite only smoke-tests this script on a small size.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHATTER = [
    "2024-05-01 10:{m:02d}:{s:02d},123 INFO [rank{r}] step {i} loss=0.{i} lr=3.0e-04 grad_norm=1.{r}4 tokens/s=51234\n",
    "[rank{r}]: {i}it [00:{s:02d}, 12.3it/s] epoch 3 loss 2.{i}\n",
    "node-{r}:{i}:{i} [{r}] NCCL INFO Channel 0{r}/24 : 0[0] -> 1[1] via P2P/CUMEM/read\n",
    "2024-05-01 10:{m:02d}:{s:02d},456 WARNING [rank{r}] dataloader slow: batch {i} took 1.{r}s\n",
    "[rank{r}]: /workspace/model.py:88: UserWarning: TypedStorage is deprecated.\n",
]
TAIL = """[rank0]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [10.0.0.4]:4242: Connection reset by peer
[rank1]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [10.0.0.4]:4243
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
Root Cause (first observed failure):
[0]:
  time      : 2024-05-01_10:59:59
  host      : node-3
  rank      : 3 (local_rank: 3)
  exitcode  : -9 (pid: 4242)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 4242
=========================================================
"""


PROGRESS = "\rtrain: {p:3d}%|{bar:<20}| {i}/100000 [01:{s:02d}<04:00, 51.2it/s, loss=0.{i}]"


def generate_progress(path: Path, megabytes: float) -> int:
    """tqdm's output as a file sees it: updates separated by \\r, a \\n now and then."""
    target = int(megabytes * 2**20)
    written = lines = 0
    with open(path, "w", encoding="utf-8") as fh:
        i = 0
        while written < target:
            parts = [PROGRESS.format(p=i % 101, bar="█" * (i % 21), i=i, s=i % 60) for i in range(i, i + 200)]
            i += 200
            text = "".join(parts) + "\n"
            fh.write(text)
            written += len(text.encode())
            lines += 1
        fh.write(TAIL)
        lines += TAIL.count("\n")
    return lines


def generate(path: Path, megabytes: float) -> int:
    target = int(megabytes * 2**20)
    written = lines = 0
    with open(path, "w", encoding="utf-8") as fh:
        i = 0
        while written < target:
            chunk = []
            for _ in range(1000):
                template = CHATTER[i % len(CHATTER)]
                chunk.append(template.format(r=i % 8, i=i, m=(i // 60) % 60, s=i % 60))
                i += 1
            text = "".join(chunk)
            fh.write(text)
            written += len(text)
            lines += len(chunk)
        fh.write(TAIL)
        lines += TAIL.count("\n")
    return lines


def scale(ranks: int) -> int:
    """explain on a directory of per-rank logs of one large job, in a child process."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "explain"))
    from scale_logs import write_job

    killed = ranks // 2 + 5
    with tempfile.TemporaryDirectory(prefix="dd-bench-explain-ranks-") as tmp:
        paths = write_job(Path(tmp) / "logs", ranks, killed)
        size = sum(p.stat().st_size for p in paths)
        proc = subprocess.run([sys.executable, __file__, "--child", str(Path(tmp) / "logs")], capture_output=True,
                              text=True, timeout=1800)
        if proc.returncode != 0:
            print(proc.stderr, file=sys.stderr)
            return 1
        result = json.loads(proc.stdout)
    print(f"{ranks} per-rank logs ({size / 2**20:.1f} MB): explain {result['seconds']:.2f}s wall, "
          f"{result['cpu_seconds']:.2f}s CPU; top finding {result['top'][0]} [{result['top'][1]}] on rank(s) "
          f"{result['ranks']} (the killed rank is {killed}); peak RSS growth "
          f"{(result['peak_kb'] - result['baseline_kb']) / 1024:.1f} MB")
    return 0 if result["ranks"] == [killed] else 1


def child(path: str) -> None:
    from distdoctor.explain import explain_files

    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started, cpu = time.perf_counter(), time.process_time()
    report = explain_files([path])
    seconds = time.perf_counter() - started
    cpu_seconds = time.process_time() - cpu
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    top = report.findings[0]
    print(json.dumps({"seconds": seconds, "cpu_seconds": cpu_seconds, "baseline_kb": baseline, "peak_kb": peak, "top": [top.id, top.cause],
                      "lines": report.checks[0].get("lines", 0), "ranks": list(top.ranks)}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=100.0, help="size of the generated log in MB (default 100)")
    parser.add_argument("--keep", type=Path, help="write the log here and keep it")
    parser.add_argument("--kind", choices=("chatter", "progress"), default="chatter",
                        help="training chatter from 8 ranks (default) or tqdm progress bars")
    parser.add_argument("--ranks", type=int, help="time explain on a directory of this many per-rank logs instead")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return 0
    if args.ranks:
        return scale(args.ranks)
    with tempfile.TemporaryDirectory(prefix="dd-bench-explain-") as tmp:
        path = args.keep or Path(tmp) / "big.log"
        t0 = time.perf_counter()
        lines = (generate_progress if args.kind == "progress" else generate)(path, args.mb)
        size = path.stat().st_size
        print(f"generated {size / 2**20:.1f} MB, {lines:,} lines in {time.perf_counter() - t0:.1f}s: {path}")
        proc = subprocess.run([sys.executable, __file__, "--child", str(path)], capture_output=True, text=True,
                              timeout=1800)
        if proc.returncode != 0:
            print(proc.stderr, file=sys.stderr)
            return 1
        result = json.loads(proc.stdout)
        seconds = result["seconds"]
        cpu = result["cpu_seconds"]
        print(f"explain: {seconds:.2f}s wall, {cpu:.2f}s CPU; {result['lines'] / seconds:,.0f} lines/s, "
              f"{result['lines'] / cpu:,.0f} lines per CPU-second, {size / 2**20 / cpu:.1f} MB per CPU-second")
        print(f"peak RSS: {result['peak_kb'] / 1024:.1f} MB (after import: {result['baseline_kb'] / 1024:.1f} MB, "
              f"growth {(result['peak_kb'] - result['baseline_kb']) / 1024:.1f} MB for a {size / 2**20:.0f} MB log)")
        print(f"top finding: {result['top'][0]} [{result['top'][1]}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
