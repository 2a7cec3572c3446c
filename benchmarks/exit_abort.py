"""How often a healthy job aborts at exit, with the guard and without it: launches side by side, under load.

    python benchmarks/exit_abort.py --launches 300            # 300 guarded + 300 plain, 2 at a time
    python benchmarks/exit_abort.py --launches 20 --busy 1    # and one busy loop beside them
    python benchmarks/exit_abort.py --kinds preflight,plain    # docs/examples/train_preflight.py beside plain

Each launch is exit_job.py (a 4-rank DDP loop on gloo, ended by destroy_process_group without a
barrier) under ``python -m torch.distributed.run --standalone --nproc-per-node 4``; a guarded launch is
the same line under ``python -m distdoctor guard --``; a preflight launch is docs/examples/train_preflight.py
(distdoctor.init_process_group and preflight in the process, 2 ranks); the ``-barrier``, ``-release`` and
``-pause`` kinds end the job otherwise (exit_job.py says how). The kinds alternate, and ``--parallel`` of
them run at once (8 ranks on a 2-core machine is the load), so that the machine's state hits both alike. An abort is a launch whose output has "terminate called without an active
exception" or whose ranks ended by SIGABRT (exitcode -6); any other failure is counted apart. Every
launch is one line of ``--out`` (JSON lines); the table at the end has both counts. Not a test: the
project's tests never relaunch a run, and this is how the abort is counted.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from timing import PYTHON, REPO, clean_env  # noqa: E402

ABORT = "terminate called without an active exception"
JOB = HERE / "exit_job.py"
PREFLIGHT = Path(REPO) / "docs" / "examples" / "train_preflight.py"
NPROC = 4
# "-barrier": the same job with a barrier before destroy_process_group (what docs/api.md recommends).
KINDS = ("guarded", "plain", "preflight", "guarded-barrier", "plain-barrier", "guarded-release", "plain-release",
         "guarded-pause", "plain-pause")


def ranks(kind: str) -> int:
    return 2 if kind == "preflight" else NPROC


def line(kind: str, report_dir: str) -> list[str]:
    script = PREFLIGHT if kind == "preflight" else JOB
    torchrun = [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks(kind)), str(script),
                *([kind.split("-", 1)[1]] if "-" in kind else [])]
    kind = kind.split("-", 1)[0]
    return [PYTHON, "-m", "distdoctor", "guard", "--report-dir", report_dir, "--", *torchrun] if kind == "guarded" \
        else torchrun


def launch(index: int, kind: str, bound_s: float) -> dict:
    """One launch, in a session of its own (every process it started is killed at the end, by its group)."""
    with tempfile.TemporaryDirectory(prefix="exit-abort-") as tmp:
        env = clean_env(OMP_NUM_THREADS="1", PYTHONPATH=REPO)
        started = time.monotonic()
        proc = subprocess.Popen(line(kind, tmp), env=env, cwd=tmp, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=bound_s)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, code = proc.communicate()[0], None
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        done = sum(f"rank {r} done" in out for r in range(ranks(kind)))
        abort = ABORT in out or "exitcode  : -6" in out or "exitcode: -6" in out
        return {"launch": index, "kind": kind, "code": code, "abort": abort, "ranks_done": done,
                "wall_s": round(time.monotonic() - started, 2), "load": round(os.getloadavg()[0], 2),
                "tail": out[-1500:] if (code != 0 or abort) else ""}


def busy_loops(count: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([PYTHON, "-c", "while True: pass"]) for _ in range(count)]


def summary(rows: list[dict], kinds: list[str]) -> list[str]:
    out = []
    for kind in kinds:
        mine = [r for r in rows if r["kind"] == kind]
        aborts = sum(r["abort"] for r in mine)
        other = sum(1 for r in mine if not r["abort"] and r["code"] != 0)
        loads = sorted(r["load"] for r in mine) or [0.0]
        out.append(f"{kind:<9}: {len(mine)} launches, {aborts} aborted at exit, "
                   f"{other} failed otherwise; load {loads[0]:.1f}-{loads[-1]:.1f} (median {loads[len(loads) // 2]:.1f})")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=300, help="launches of each kind")
    parser.add_argument("--kinds", default="guarded,plain", help=f"comma-separated, of {', '.join(KINDS)}")
    parser.add_argument("--parallel", type=int, default=2, help="launches at once")
    parser.add_argument("--busy", type=int, default=0, help="busy loops beside them (ended by their PID)")
    parser.add_argument("--bound", type=float, default=300.0, help="seconds one launch may take")
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "exit_abort.jsonl")
    args = parser.parse_args()
    kinds = [k for k in args.kinds.split(",") if k in KINDS]
    plan = [(i, kinds[i % len(kinds)]) for i in range(len(kinds) * args.launches)]
    loops = busy_loops(args.busy)
    rows: list[dict] = []
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    try:
        with ThreadPoolExecutor(args.parallel) as pool, open(args.out, "w") as sink:
            for row in pool.map(lambda item: launch(item[0], item[1], args.bound), plan):
                rows.append(row)
                sink.write(json.dumps(row) + "\n")
                sink.flush()
                if row["abort"] or row["code"] != 0:
                    print(f"launch {row['launch']} ({row['kind']}): code {row['code']}, "
                          f"abort {row['abort']}", flush=True)
    finally:
        for loop in loops:
            loop.kill()
    print(f"exit_abort.py, {started} to {time.strftime('%H:%M:%S')}, --parallel {args.parallel} --busy {args.busy}")
    for text in summary(rows, kinds):
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
