"""`distdoctor stacks --slurm-job JOBID`: this command run on every node of the job with srun, one merged report."""

# `srun --overlap --jobid JOBID --ntasks-per-node=1` starts one `distdoctor stacks --slurm-node
# JOBID --format json` per node of the job's allocation (--overlap: beside the job's own step,
# without waiting for its CPUs). Each node reports the ranks of that job it runs, as snapshots;
# here the jobs are merged across nodes and judged once, with every rank in view.

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from typing import Any, Iterable, Mapping

from distdoctor.core.findings import Finding
from distdoctor.core.registry import finding_kind
from distdoctor.core.report import Report
from distdoctor.stacks.job import JobView, merge
from distdoctor.stacks.look import assemble
from distdoctor.stacks.procs import NO_JOB

SRUN_START_S = 60.0   # srun's own start-up on a busy controller, beyond the nodes' work
_MAX_OUTPUT = 64 * 2**20
# Judged again over the merged job: a node's own view of these is partial.
_REJUDGED = ("job.", "stacks.I002", "stacks.W002", "stacks.W003")

SRUN_FAILED = finding_kind(
    "stacks.E006", cause="unknown", title="srun could not run distdoctor stacks on the job's nodes",
    hint="Check the job ID (squeue -j JOBID), that distdoctor and py-spy are installed on every node, and that srun --overlap is allowed (Slurm >= 20.11)")


def node_command(job_id: str, *, native: bool, timeout_s: float, span_s: float = 1.0) -> list[str]:
    # --fail-level critical: a node's report with findings still exits 0, so srun's exit code
    # says only whether every node answered.
    return [sys.executable, "-m", "distdoctor", "stacks", "--slurm-node", job_id, "--format", "json",
            "--fail-level", "critical",
            "--timeout", f"{timeout_s:g}", "--span", f"{span_s:g}", *(["--native"] if native else [])]


def srun_command(srun: str, job_id: str, *, native: bool, timeout_s: float, span_s: float = 1.0) -> list[str]:
    return [srun, "--overlap", "--jobid", job_id, "--ntasks-per-node=1", "--kill-on-bad-exit=0",
            "--job-name", "distdoctor-stacks", *node_command(job_id, native=native, timeout_s=timeout_s, span_s=span_s)]


def json_objects(text: str) -> list[dict[str, Any]]:
    """Every JSON object in srun's output (one per node), skipping anything else."""
    decoder, out, i = json.JSONDecoder(), [], 0
    while i < len(text):
        start = text.find("{", i)
        if start < 0:
            break
        try:
            value, i = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            i = start + 1
            continue
        if isinstance(value, dict):
            out.append(value)
    return out


def _node_findings(reports: Iterable[Mapping[str, Any]]) -> list[Finding]:
    kept = []
    for report in reports:
        for raw in report.get("findings") or []:
            if not isinstance(raw, Mapping) or str(raw.get("id", "")).startswith(_REJUDGED):
                continue
            try:
                kept.append(Finding.from_dict(raw))
            except (KeyError, ValueError, TypeError):
                continue
    return kept


def merge_reports(reports: list[Mapping[str, Any]], *, whole: bool) -> tuple[list[JobView], list[Finding], list[str]]:
    """Node reports -> the jobs (merged across nodes), the nodes' own findings, the nodes."""
    by_key: dict[str, list[JobView]] = {}
    nodes: list[str] = []
    for report in reports:
        stacks = (report.get("data") or {}).get("stacks") or {}
        nodes += [str(n) for n in stacks.get("nodes") or [] if str(n) not in nodes]
        for raw in stacks.get("jobs") or []:
            if isinstance(raw, Mapping):
                view = JobView.from_dict(raw)
                by_key.setdefault(view.key, []).append(view)
    jobs = [merge(views, whole=whole) for views in by_key.values()]
    findings = _node_findings(reports)
    if jobs:  # a node without ranks of the job is not news when others have them
        findings = [f for f in findings if f.id != NO_JOB.id]
    return jobs, findings, nodes


def look_slurm_job(job_id: str, *, native: bool = False, timeout_s: float = 10.0, span_s: float = 1.0,
                   silence: Iterable[str] = (), srun: str | None = None) -> Report:
    """Every node of SLURM job job_id looked at, one report."""
    started = time.monotonic()
    program = srun or shutil.which("srun")
    if program is None:
        failed = SRUN_FAILED("srun is not on PATH: --slurm-job needs it", detail="run this on a login or compute node of the cluster")
        return assemble([], [failed], started=started, silence=silence)
    argv = srun_command(program, job_id, native=native, timeout_s=timeout_s, span_s=span_s)
    # Each node reads its ranks in parallel within timeout_s; srun's start-up comes on top.
    limit = timeout_s * 2 + SRUN_START_S
    try:
        done = subprocess.run(argv, capture_output=True, timeout=limit, stdin=subprocess.DEVNULL)
        out, err, code = done.stdout[:_MAX_OUTPUT].decode("utf-8", "replace"), done.stderr.decode("utf-8", "replace"), done.returncode
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"")[:_MAX_OUTPUT].decode("utf-8", "replace")
        err, code = f"srun did not finish within {limit:g} s", None
    except OSError as exc:
        out, err, code = "", f"cannot run {program}: {exc.strerror or exc}", None
    reports = json_objects(out)
    jobs, findings, nodes = merge_reports(reports, whole=code == 0)
    if code != 0:
        tail = "\n".join(err.strip().splitlines()[-8:])
        findings.append(SRUN_FAILED(f"srun {'exited with ' + str(code) if code is not None else 'failed'} for job {job_id}; "
                                    f"{len(reports)} node report(s) read",
                                    detail=f"{' '.join(argv)}\n{tail}"[:2000], data={"returncode": code}))
    return assemble(jobs, findings, started=started, silence=silence, extra={"nodes": nodes, "slurm_job": job_id})
