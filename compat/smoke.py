"""The compatibility smoke set: real jobs through every way into distdoctor, judged, one JSON line per case.

Run with the Python of the environment under test (compat/matrix.py does; by hand:
``ENV/bin/python compat/smoke.py [--only check,stacks]``). It imports neither torch nor
distdoctor itself: every case is a command of that environment (``python -m distdoctor ...``,
``python -m torch.distributed.run ...``), so an import that fails is a case's result, not a
crash of the smoke set. Each case has a deadline; a case that passes its deadline is ended (its
whole process group, by PID) and fails with what it printed.

The cases, and what passes:
- check:      ``distdoctor check`` (local stage + a 2-rank self-test world), then under torchrun
              (2 ranks): exit 0, no error, both ranks reported, with TORCH_NCCL_* switches set
              (gloo ignores them: nothing may be said).
- preflight:  init_process_group + preflight(model) on 2 ranks: silent on the same model,
              PreflightError naming shape_mismatch on every rank when rank 1's model differs
              (that job with USE_LIBUV=0: the other store backend).
- guard-ok:   a healthy DDP job under ``distdoctor guard``: exit 0, no diagnosis.
- guard-late: rank 1 sleeps while rank 0 waits in DDP's all-reduce: straggler_rank, rank 1.
- guard-raise: rank 1 raises: worker_exception, rank 1.
- guard-kill: rank 1 is killed (SIGKILL) while rank 0 waits: named by rank (any cause that names
              rank 1's end: oom_killed_rank, rank_missing or worker_exception).
- bench:      ``distdoctor bench`` on 2 ranks, every collective at two sizes: each measured and
              correct, or left out as one the backend cannot run (bench.I006), exit 0.
- pytest:     ``pytest --distdoctor`` on a test body marked ``distributed(world_size=2)``: passes.
- stacks:     the straggler job started without distdoctor: ``distdoctor stacks`` names rank 1.
- explain:    the raising job's torchrun output (``--tee 3``): ``distdoctor explain`` names rank 1's
              exception.
- guard-grace: gloo's end of a collective at its group's timeout (2 s; all_reduce, recv, barrier in
              groups rank 0 never joins): each raises at or after 2 s and within half the guard's gloo
              grace after it (distdoctor.embedded.guard.policy.grace_s), so torch ends it first.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
JOBS = HERE / "jobs"
# Variables a launcher or an earlier run may have left; every case starts without them.
LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK",
               "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
HANG_TIMEOUT_S = 6
# A guarded job ends by itself in 20-60 s on a busy 2-core machine; one still running after this
# is a guard that did not name (or end) the hang.
GUARD_DEADLINE_S = 120
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
DISTDOCTOR = [sys.executable, "-m", "distdoctor"]


class Outcome:
    def __init__(self, ok: bool, why: str = "", seconds: float = 0.0) -> None:
        self.ok, self.why, self.seconds = ok, why, seconds


def clean_env(**switches: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in LAUNCH_VARS and not k.startswith(("DISTDOCTOR_", "TORCH_NCCL_")) and k != "USE_LIBUV"}
    env["PYTHONUNBUFFERED"] = "1"  # (PYTHONPATH is kept: matrix.py clears it, a test sets it to its checkout)
    env.update(switches)
    return env


def run(command: list[str], deadline_s: float, cwd: str | None = None, **switches: str) -> tuple[int | None, str]:
    """(exit code or None when the deadline ended it, stdout+stderr); the command runs in its own
    session, and what is left of it at the deadline is ended by its process group's ID.
    ``switches``: environment variables the case sets (torch's store backend, NCCL's handling)."""
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=clean_env(**switches), cwd=cwd,
                                start_new_session=True)
        try:
            code: int | None = proc.wait(timeout=deadline_s)
        except subprocess.TimeoutExpired:
            code = None
        end_group(proc)
        out.seek(0)
        return code, out.read().decode("utf-8", "replace")


def end_group(proc: subprocess.Popen) -> None:
    """End what is left of the process group ``proc`` leads (its ranks too), by its ID."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            continue
        time.sleep(0.2)  # ranks of the group may outlive the leader by a moment


def tail(text: str, lines: int = 6) -> str:
    kept = [line for line in text.strip().splitlines() if line.strip()][-lines:]
    return " | ".join(kept)[-900:]


def said(text: str) -> str:
    """What distdoctor itself printed (its lines name it or a finding ID), else the output's tail."""
    own = [line.strip() for line in text.splitlines()
           if "distdoctor" in line or re.match(r"\s*[a-z]+\.[ECWI]\d{3} ", line)]
    return " | ".join(own[-4:])[-600:] if own else f"nothing ({tail(text, 3)})"


def traceback_in(text: str) -> bool:
    return "Traceback (most recent call last)" in text


def findings_of(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for f in report.get("findings", []) if isinstance(f, dict)]


def names(findings: list[dict[str, Any]], cause: str, rank: int) -> bool:
    return any(f.get("cause") == cause and rank in (f.get("ranks") or []) for f in findings)


def json_object(text: str) -> dict[str, Any] | None:
    """The JSON report in a command's output (other lines may come before it)."""
    decoder = json.JSONDecoder()
    at = text.find("{")
    while at >= 0:
        if at == 0 or text[at - 1] == "\n":
            try:
                value = decoder.raw_decode(text[at:])[0]
            except ValueError:
                value = None
            if isinstance(value, dict) and "schema" in value:
                return value
        at = text.find("{", at + 1)
    return None


# -- the cases ---------------------------------------------------------------------------------
def case_check(work: str) -> Outcome:
    # torch's switches set as users set them: on gloo they change nothing, so nothing may be said.
    switches = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "TORCH_NCCL_BLOCKING_WAIT": "1"}
    for how, command in (("self-test", DISTDOCTOR + ["check", "--format", "json", "--timeout", "60"]),
                         ("under torchrun", TORCHRUN + ["-m", "distdoctor", "check", "--format", "json", "--timeout", "60"])):
        code, out = run(command, 150, **switches)
        report = json_object(out)
        if code != 0 or report is None or traceback_in(out):
            return Outcome(False, f"{how}: exit {code}: {said(out)}")
        bad = [f"{f.get('id')} {f.get('title')}" for f in findings_of(report) if f.get("severity") in ("error", "critical")]
        if bad or report.get("status") not in ("ok", "warning"):
            return Outcome(False, f"{how}: status {report.get('status')}: {'; '.join(bad)[:600]}")
        reported = (report.get("world") or {}).get("ranks_reported") or []
        if reported != [0, 1]:
            return Outcome(False, f"{how}: the world reported ranks {reported}, not 0 and 1")
    return Outcome(True)


def case_preflight(work: str) -> Outcome:
    # The healthy job on the store backend torch's rendezvous picks by default, the other one
    # with USE_LIBUV=0 (the legacy backend, which torch 2.1 uses anyway: it ignores the switch).
    for mode, switches in (("healthy", {}), ("mismatch", {"USE_LIBUV": "0"})):
        out_dir = Path(work, f"preflight-{mode}")
        out_dir.mkdir()
        code, out = run(TORCHRUN + [str(JOBS / "preflight_job.py"), mode, str(out_dir)], 180, **switches)
        results = {}
        for rank in (0, 1):
            try:
                results[rank] = json.loads((out_dir / f"rank{rank}.json").read_text())
            except (OSError, ValueError):
                return Outcome(False, f"{mode}: rank {rank} left no result (exit {code}): {tail(out)}")
        if mode == "healthy" and (code != 0 or any(r["raised"] for r in results.values())):
            return Outcome(False, f"healthy job: exit {code}, {results}")
        if mode == "mismatch" and not all(r["raised"] and "shape_mismatch" in r["causes"] for r in results.values()):
            return Outcome(False, f"mismatch job: shape_mismatch not raised on every rank: {results}")
    return Outcome(True)


def guarded(work: str, mode: str) -> tuple[int | None, str, list[dict[str, Any]], str]:
    report_dir = Path(work, f"guard-{mode}")
    code, out = run(DISTDOCTOR + ["guard", "--hang-timeout", str(HANG_TIMEOUT_S), "--on-hang", "exit",
                                  "--report-dir", str(report_dir), "--"] + TORCHRUN + [str(JOBS / "train.py"), mode],
                    GUARD_DEADLINE_S)
    findings: list[dict[str, Any]] = []
    for path in sorted(glob.glob(str(report_dir / "distdoctor-guard-*.json"))):
        try:
            findings += findings_of(json.loads(Path(path).read_text()))
        except (OSError, ValueError):
            pass
    return code, out, findings, str(report_dir)


def case_guard_ok(work: str) -> Outcome:
    code, out, findings, _ = guarded(work, "healthy")
    said = [f"{f.get('id')} {f.get('title')}" for f in findings if f.get("severity") in ("warning", "error", "critical")]
    if code != 0 or said or traceback_in(out):
        return Outcome(False, f"exit {code}; {'; '.join(said)[:300]} {tail(out)}")
    return Outcome(True)


def guard_names(work: str, mode: str, *causes: str) -> Outcome:
    code, out, findings, _ = guarded(work, mode)
    if code is None:
        return Outcome(False, f"still running after {GUARD_DEADLINE_S} s; distdoctor said: {said(out)}")
    if not any(names(findings, cause, 1) for cause in causes):
        cause = " or ".join(causes)
        got = ", ".join(sorted({f"{f.get('id')} [{f.get('cause')}] ranks {f.get('ranks')}" for f in findings})) or "no report"
        return Outcome(False, f"{cause} of rank 1 not named (exit {code}; reports: {got}); distdoctor said: {said(out)}")
    return Outcome(True)


def case_guard_late(work: str) -> Outcome:
    return guard_names(work, "straggler", "straggler_rank")


def case_guard_raise(work: str) -> Outcome:
    return guard_names(work, "raise", "worker_exception")


def case_guard_kill(work: str) -> Outcome:
    return guard_names(work, "kill", "oom_killed_rank", "rank_missing", "worker_exception")


def case_bench(work: str) -> Outcome:
    code, out = run(DISTDOCTOR + ["bench", "--nproc", "2", "--sizes", "1K,64K", "--iters", "3", "--warmup", "1",
                                  "--format", "json", "--timeout", "90"], 150)
    report = json_object(out)
    if code != 0 or report is None or traceback_in(out):
        return Outcome(False, f"exit {code}: {said(out)}")
    bench = (report.get("data") or {}).get("bench") or {}
    measured = {row.get("op") for row in bench.get("sweep") or [] if row.get("correct")}
    left_out = set(bench.get("unsupported") or {})
    missing = [op for op in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")
               if op not in measured | left_out]
    if missing or "all_reduce" not in measured:
        return Outcome(False, f"not measured: {', '.join(missing) or 'all_reduce'}")
    return Outcome(True)


def case_pytest(work: str) -> Outcome:
    code, out = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--distdoctor",
                     str(JOBS / "test_marker.py")], 240, cwd=work)
    if code != 0 or "1 passed" not in out:
        return Outcome(False, f"exit {code}: {tail(out)}")
    return Outcome(True)


def case_stacks(work: str) -> Outcome:
    ready = Path(work, "stacks-ready")
    ready.mkdir()
    with tempfile.TemporaryFile() as log:
        job = subprocess.Popen(TORCHRUN + [str(JOBS / "train.py"), "straggler", str(ready)], stdout=log,
                               stderr=subprocess.STDOUT, env=clean_env(), start_new_session=True)
        try:
            until = time.monotonic() + 90
            while len(list(ready.iterdir())) < 2 and time.monotonic() < until and job.poll() is None:
                time.sleep(0.2)
            if len(list(ready.iterdir())) < 2:
                log.seek(0)
                return Outcome(False, f"the hung job never reached its fault (exit {job.poll()}): "
                                      f"{tail(log.read().decode('utf-8', 'replace'))}")
            time.sleep(2.0)  # rank 0 is inside DDP's all-reduce by now
            code, out = run(DISTDOCTOR + ["stacks", str(job.pid), "--format", "json"], 90)
        finally:
            end_group(job)
    report = json_object(out)
    if report is None:
        return Outcome(False, f"exit {code}, no report: {tail(out)}")
    if not names(findings_of(report), "straggler_rank", 1):
        got = ", ".join(f"{f.get('id')} [{f.get('cause')}] ranks {f.get('ranks')}" for f in findings_of(report))
        return Outcome(False, f"rank 1 not named a straggler (exit {code}): {got or tail(out)}")
    return Outcome(True)


def case_explain(work: str) -> Outcome:
    # torchrun --tee 3: every worker line carries its rank on every release (torch 2.1's workers
    # print tracebacks without the "[rankN]:" prefix that later releases add).
    code, out = run(TORCHRUN + ["--tee", "3", str(JOBS / "train.py"), "raise"], 120)
    if code in (0, None):
        return Outcome(False, f"the raising job did not fail as expected (exit {code}): {tail(out)}")
    log = Path(work, "job.log")
    log.write_text(out)
    code, text = run(DISTDOCTOR + ["explain", str(log), "--format", "json"], 60)
    report = json_object(text)
    if report is None:
        return Outcome(False, f"exit {code}, no report: {tail(text)}")
    if not names(findings_of(report), "worker_exception", 1):
        got = ", ".join(f"{f.get('id')} [{f.get('cause')}] ranks {f.get('ranks')}" for f in findings_of(report))
        return Outcome(False, f"rank 1's exception not named (exit {code}): {got}")
    return Outcome(True)


def case_guard_grace(work: str) -> Outcome:
    code, out = run(TORCHRUN + [str(JOBS / "timeout_job.py"), "2"], 90)
    overshoot = {op: float(s) for op, s in re.findall(r"OVERSHOOT (\w+) (-?[\d.]+)", out)}
    if set(overshoot) != {"all_reduce", "recv", "barrier"}:
        return Outcome(False, f"not every call timed out (exit {code}): {tail(out)}")
    probe = "from distdoctor.embedded.guard.policy import grace_s; print(grace_s('gloo'))"
    code, text = run([sys.executable, "-c", probe], 60)
    try:
        grace = float(text.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return Outcome(False, f"the guard's grace could not be read (exit {code}): {tail(text)}")
    figures = ", ".join(f"{op} {s:.3f} s" for op, s in overshoot.items())
    if not all(0 <= s < grace / 2 for s in overshoot.values()):
        return Outcome(False, f"gloo raised past its 2 s timeout by {figures}; the guard's grace is {grace:g} s")
    return Outcome(True, f"past the timeout: {figures} (grace {grace:g} s)")


CASES: dict[str, Callable[[str], Outcome]] = {
    "check": case_check,
    "preflight": case_preflight,
    "guard-ok": case_guard_ok,
    "guard-late": case_guard_late,
    "guard-raise": case_guard_raise,
    "guard-kill": case_guard_kill,
    "bench": case_bench,
    "pytest": case_pytest,
    "stacks": case_stacks,
    "explain": case_explain,
    "guard-grace": case_guard_grace,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated case names (default: every case)")
    args = parser.parse_args(argv)
    chosen = [c for c in args.only.split(",") if c] or list(CASES)
    unknown = [c for c in chosen if c not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; the cases: {', '.join(CASES)}")
    failed = 0
    for name in chosen:
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix=f"distdoctor-compat-{name}-") as work:
            try:
                outcome = CASES[name](work)
            except Exception as exc:  # a broken case is a failed case, with why
                outcome = Outcome(False, f"the smoke case itself failed: {type(exc).__name__}: {exc}")
        outcome.seconds = time.monotonic() - started
        failed += not outcome.ok
        print(json.dumps({"case": name, "ok": outcome.ok, "seconds": round(outcome.seconds, 1), "why": outcome.why}),
              flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
