"""How often torch's teardown aborts a rank, with distdoctor in the process and without (not a test).

    python tests/api/teardown_abort.py --runs 40

torch 2.13 with gloo and DDP has been seen to abort a rank after the script's last line:
"terminate called without an active exception", exit -6, after preflight passed and
destroy_process_group ran. This launches, interleaved, docs/examples/train_preflight.py (distdoctor's
init_process_group and preflight in the process) and teardown_plain.py (the same training without
distdoctor), each with and without the final barrier, under `python -m torch.distributed.run
--standalone --nproc-per-node=2`, and counts the aborts of each. docs/api.md has the figures.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
ABORT = "terminate called without an active exception"
EXAMPLE = REPO / "docs" / "examples" / "train_preflight.py"
NO_BARRIER = Path(tempfile.gettempdir()) / "distdoctor_train_preflight_no_barrier.py"
VARIANTS = {
    "with distdoctor": [str(EXAMPLE)],
    "with distdoctor, no barrier": [str(NO_BARRIER)],
    "without distdoctor": [str(HERE / "teardown_plain.py")],
    "without distdoctor, no barrier": [str(HERE / "teardown_plain.py"), "--no-barrier"],
}


def launch(args: list[str]) -> tuple[int, bool]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", *args],
                          cwd=REPO / "docs" / "examples", env=env, capture_output=True, text=True, timeout=300)
    return proc.returncode, ABORT in proc.stdout + proc.stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    NO_BARRIER.write_text("".join(line for line in EXAMPLE.read_text().splitlines(keepends=True)
                                  if line.strip() != "torch.distributed.barrier()"))
    counts = {name: [0, 0, 0] for name in VARIANTS}  # runs, aborts, other failures
    for _ in range(args.runs):
        for name, argv in VARIANTS.items():
            code, aborted = launch(argv)
            counts[name][0] += 1
            counts[name][1] += aborted
            counts[name][2] += code != 0 and not aborted
    load = os.getloadavg()[0]
    for name, (runs, aborts, other) in counts.items():
        print(f"{name:<32} {aborts} aborts in {runs} launches ({other} other failures); load {load:.1f}")


if __name__ == "__main__":
    main()
