"""Run every benchmark and print each figure: its median, its baseline's, and their ratio.

    python benchmarks/run.py               # every figure, 5 runs each (a few minutes)
    python benchmarks/run.py --quick       # 1 run each, small sizes: checks that it all runs
    python benchmarks/run.py --only local,selftest --repeats 9
    python benchmarks/run.py --markdown    # the table as markdown (docs/performance.md)

Each benchmark is a script ``bench_<name>.py`` here that prints its figures as JSON with
``--json`` (see README.md); each runs in its own process so that one failing benchmark is a
line in the table, not the end of the run. A benchmark whose script does not exist yet, or
whose subject is not built yet, prints "not available yet" and why.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from table import print_table  # noqa: E402
from timing import Figure, median  # noqa: E402

# name -> (script, the design's target, what it measures)
BENCHMARKS: dict[str, tuple[str, str, str]] = {
    "local": ("bench_local.py", "<= 1.05x", "distdoctor check --stage local vs python -c 'import torch'"),
    "selftest": ("bench_selftest.py", "<= 1.25x / <= 1.0x",
                 "2-rank self-test vs python -c 'import torch', and vs a bare torchrun gloo all_reduce script"),
    "detection": ("bench_detection.py", "<= deadline + 1 s", "missing rank / unreachable master named vs plain torch"),
    "preflight": ("bench_preflight.py", "<= 1.10x", "preflight(model) on 2 ranks vs the bare script, small and large model"),
    "exchange": ("bench_exchange.py", "a few s at 1024 ranks", "exchange + aggregation at rank 0 for 1-1024 simulated ranks"),
    "explain": ("bench_explain.py", "", "distdoctor explain on a large synthetic log"),
    "guard": ("bench_guard.py", "<= 1.03x", "DDP tutorial step time with the runtime guard vs without; hang to named cause"),
    "collectives": ("bench_collectives.py", "<= 30 s / <= 10 s", "distdoctor bench: default 2-rank CPU sweep; 8-rank link matrix"),
    "lint": ("bench_lint.py", ">= 50,000 lines/s", "distdoctor lint vs ast.parse of the same files"),
    "scale": ("bench_scale.py", "straggler alone <= hang_timeout + 5 s (48, 64 real); <= + 3 s and <= 1 req/s/rank (4,096 simulated)",
              "the guard at 16-64 real DDP ranks and 256-4,096 simulated ranks on one TCPStore"),
    "pace": ("bench_pace.py", "<= 1.01x; named, <= 0.1 req/s/rank (1,024 and 4,096 simulated)",
             "the slow-rank accounting's cost in the DDP loop; its store load and verdict at 1,024 and 4,096 simulated ranks"),
    "soak": ("soak.py", "every pause and fault as scheduled",
             "a guarded 4-rank DDP job with random pauses around the hang timeout (20 min), then real faults"),
}
BOUND_S = 900  # one benchmark script, all its runs
# A full run that needs longer: scale starts 64-rank jobs on this machine; the soak runs a
# 20-minute job, then five fault runs.
LONGER_S = {"scale": 3600, "soak": 3600, "pace": 3600}


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "loadavg_1m": round(os.getloadavg()[0], 2),
    }
    try:
        import psutil

        info["memory_gib"] = round(psutil.virtual_memory().total / 2**30, 1)
    except Exception:  # the figures matter more than the header
        info["memory_gib"] = None
    try:
        info["cpu"] = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                            if line.startswith("model name")), platform.processor())
    except OSError:
        info["cpu"] = platform.processor()
    version = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"],
                             capture_output=True, text=True, timeout=120)
    info["torch"] = version.stdout.strip() or "unknown"
    return info


def run_benchmark(name: str, quick: bool, repeats: int) -> list[tuple[str, Figure]]:
    """(benchmark name, figure) for every figure the benchmark's script printed."""
    return [(name, figure) for figure in _figures(name, quick, repeats)]


def _figures(name: str, quick: bool, repeats: int) -> list[Figure]:
    script, target, _ = BENCHMARKS[name]
    path = HERE / script
    if not path.exists():
        return [Figure.unavailable(name, f"benchmarks/{script} does not exist", target)]
    if '"--json"' not in path.read_text(encoding="utf-8") and name in ADAPTERS:
        # A benchmark written before the --json protocol: measured through its own functions.
        try:
            return ADAPTERS[name](quick, repeats)
        except Exception as exc:  # one benchmark's failure is one line of the table
            return [Figure.unavailable(name, f"{script}: {type(exc).__name__}: {exc}", target)]
    argv = [sys.executable, str(path), "--json"] + (["--quick"] if quick else ["--repeats", str(repeats)])
    try:
        bound = BOUND_S if quick else LONGER_S.get(name, BOUND_S)
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=bound, cwd=str(HERE.parent))
    except subprocess.TimeoutExpired:
        return [Figure.unavailable(name, f"{script} ran past {bound} s", target)]
    try:
        data = json.loads(proc.stdout[proc.stdout.find("["):]) if "[" in proc.stdout else None
    except json.JSONDecodeError:
        data = None
    if proc.returncode != 0 or not isinstance(data, list):
        tail = (proc.stderr.strip().splitlines() or proc.stdout.strip().splitlines() or ["no output"])[-1]
        return [Figure.unavailable(name, f"{script} --json exited {proc.returncode}: {tail[:200]}", target)]
    known = set(Figure.__dataclass_fields__)
    return [Figure(**{k: v for k, v in item.items() if k in known}) for item in data]


def explain_figures(quick: bool, repeats: int) -> list[Figure]:
    """bench_explain.py: generate one synthetic log, then time `explain` on it ``repeats`` times
    (its --child mode prints seconds, lines and peak memory as JSON)."""
    import tempfile

    import bench_explain

    megabytes = 5.0 if quick else 100.0
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="distdoctor-bench-") as tmp:
        log = Path(tmp) / "big.log"
        lines = bench_explain.generate(log, megabytes)
        size_mb = log.stat().st_size / 2**20
        for _ in range(1 if quick else repeats):
            proc = subprocess.run([sys.executable, str(HERE / "bench_explain.py"), "--child", str(log)],
                                  capture_output=True, text=True, timeout=BOUND_S)
            if proc.returncode != 0:
                tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
                return [Figure.unavailable("explain", f"bench_explain.py --child exited {proc.returncode}: {tail}")]
            runs.append(json.loads(proc.stdout))
    seconds = [r["seconds"] for r in runs]
    med = median(seconds)
    growth = max(r["peak_kb"] - r["baseline_kb"] for r in runs) / 1024
    return [Figure(
        name=f"explain, {size_mb:.0f} MB log", subject=f"explain_files on {lines:,} lines", median_s=med,
        runs_s=[round(x, 3) for x in seconds], baseline="", target="streams: memory flat in the log size",
        note=f"{size_mb / med:.1f} MB/s, {lines / med:,.0f} lines/s; peak memory growth {growth:.1f} MB; "
        f"top finding {runs[-1]['top'][0]} [{runs[-1]['top'][1]}]",
    )]


ADAPTERS = {"explain": explain_figures}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 run each, small sizes (a smoke run)")
    parser.add_argument("--repeats", type=int, default=5, help="runs per figure for the median (default 5)")
    parser.add_argument("--only", default="", help=f"comma-separated subset of: {', '.join(BENCHMARKS)}")
    parser.add_argument("--markdown", action="store_true", help="print the table as markdown")
    parser.add_argument("--json", dest="json_path", help="also write machine and figures as JSON to this file")
    parser.add_argument("--from-json", dest="from_json", help="print a saved --json run again (e.g. as --markdown)")
    args = parser.parse_args(argv)
    if args.from_json:
        saved = json.loads(Path(args.from_json).read_text())
        known = set(Figure.__dataclass_fields__)
        print_table([(f.get("bench", "-"), Figure(**{k: v for k, v in f.items() if k in known}))
                     for f in saved["figures"]], markdown=args.markdown)
        return 0
    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(BENCHMARKS)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(BENCHMARKS)}")

    info = machine()
    started = time.time()
    print(f"machine: {info['cores']} cores ({info['cpu']}), {info['memory_gib']} GiB, "
          f"python {info['python']}, torch {info['torch']}, load {info['loadavg_1m']} at start", flush=True)
    figures: list[tuple[str, Figure]] = []
    for name in names:
        print(f"running {name}: {BENCHMARKS[name][2]} ...", file=sys.stderr, flush=True)
        figures += run_benchmark(name, args.quick, max(1, args.repeats))
    info["loadavg_1m_end"] = round(os.getloadavg()[0], 2)
    info["duration_s"] = round(time.time() - started, 1)
    print(f"({'quick' if args.quick else f'{args.repeats} runs'} per figure; {info['duration_s']} s in all; "
          f"load {info['loadavg_1m_end']} at end)")
    print_table(figures, markdown=args.markdown)
    if args.json_path:
        Path(args.json_path).write_text(json.dumps({"machine": info, "figures": [{"bench": b, **f.to_dict()} for b, f in figures]},
                                                   indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
