"""`distdoctor stacks --slurm-job JOBID`: this command run on every node of the job with srun, one merged report."""

# `srun --overlap --jobid JOBID --ntasks-per-node=1` starts one `distdoctor stacks --slurm-node
# JOBID --format json` per node of the job's allocation (--overlap: beside the job's own step,
# without waiting for its CPUs). Each node reports the ranks of that job it runs, as snapshots;
# here the jobs are merged across nodes and judged once, with every rank in view.
#
# A job of hundreds of nodes is read with a bounded fan-out: its nodes (squeue's node list,
# expanded) in groups of NODES_PER_SRUN, one srun per group (--nodelist), MAX_SRUNS of them at
# once. Every node reads its own ranks in parallel meanwhile; a group whose srun fails or hangs
# costs only its own nodes (what the others answered is merged, the failure named), and no one
# srun carries more than a group's reports through its pipe.

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterable, Mapping, Sequence

from distdoctor.core.findings import Finding
from distdoctor.core.registry import finding_kind
from distdoctor.core.report import Report
from distdoctor.machine.hostlist import expand_hostlist
from distdoctor.stacks.job import JobView, merge
from distdoctor.stacks.look import assemble
from distdoctor.stacks.procs import NO_JOB

SRUN_START_S = 60.0   # srun's own start-up on a busy controller, beyond the nodes' work
NODES_PER_SRUN = 64   # nodes one srun reads (its pipe carries their reports)
MAX_SRUNS = 8         # sruns at once: 512 nodes read in one wave
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


def job_nodes(job_id: str, squeue: str | None = None) -> list[str]:
    """The job's nodes (squeue's %N, expanded); [] when squeue cannot say (srun then reads them all)."""
    program = squeue or shutil.which("squeue")
    if program is None:
        return []
    try:
        done = subprocess.run([program, "-h", "-j", job_id, "-o", "%N"], capture_output=True, text=True, timeout=30,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return []
    lines = [line.strip() for line in done.stdout.splitlines() if line.strip()] if done.returncode == 0 else []
    try:
        return list(dict.fromkeys(n for line in lines for n in expand_hostlist(line)))
    except ValueError:
        return []


def node_groups(nodes: Sequence[str], size: int = NODES_PER_SRUN) -> list[list[str]]:
    """The nodes in groups of at most ``size`` (one srun each); [[]] when the nodes are not known."""
    nodes = list(nodes)
    if len(nodes) <= size:
        return [[]]  # one srun over the whole allocation
    return [nodes[i:i + size] for i in range(0, len(nodes), size)]


def _run_srun(argv: list[str], limit: float, program: str) -> tuple[str, str, int | None]:
    try:
        done = subprocess.run(argv, capture_output=True, timeout=limit, stdin=subprocess.DEVNULL)
        return done.stdout[:_MAX_OUTPUT].decode("utf-8", "replace"), done.stderr.decode("utf-8", "replace"), done.returncode
    except subprocess.TimeoutExpired as exc:
        return (exc.stdout or b"")[:_MAX_OUTPUT].decode("utf-8", "replace"), f"srun did not finish within {limit:g} s", None
    except OSError as exc:
        return "", f"cannot run {program}: {exc.strerror or exc}", None


def look_slurm_job(job_id: str, *, native: bool = False, timeout_s: float = 10.0, span_s: float = 1.0,
                   silence: Iterable[str] = (), srun: str | None = None, squeue: str | None = None) -> Report:
    """Every node of SLURM job job_id looked at (a bounded fan-out of sruns), one report."""
    started = time.monotonic()
    program = srun or shutil.which("srun")
    if program is None:
        failed = SRUN_FAILED("srun is not on PATH: --slurm-job needs it", detail="run this on a login or compute node of the cluster")
        return assemble([], [failed], started=started, silence=silence)
    base = srun_command(program, job_id, native=native, timeout_s=timeout_s, span_s=span_s)
    groups = node_groups(job_nodes(job_id, squeue))
    argvs = [base if not group else [*base[:1], "--nodelist", ",".join(group), "--nodes", str(len(group)), *base[1:]]
             for group in groups]
    # Each node reads its ranks in parallel within timeout_s; srun's start-up comes on top, and
    # the groups run MAX_SRUNS at a time.
    limit = timeout_s * 2 + SRUN_START_S
    with ThreadPoolExecutor(max_workers=min(MAX_SRUNS, len(argvs)), thread_name_prefix="distdoctor-srun") as pool:
        answers = list(pool.map(lambda argv: _run_srun(argv, limit, program), argvs))
    reports = [r for out, _, _ in answers for r in json_objects(out)]
    jobs, findings, nodes = merge_reports(reports, whole=all(code == 0 for _, _, code in answers))
    for argv, (out, err, code) in zip(argvs, answers):
        if code == 0:
            continue
        tail = "\n".join(err.strip().splitlines()[-8:])
        findings.append(SRUN_FAILED(f"srun {'exited with ' + str(code) if code is not None else 'failed'} for job {job_id}; "
                                    f"{len(json_objects(out))} node report(s) read",
                                    detail=f"{' '.join(argv)}\n{tail}"[:2000], data={"returncode": code}))
    return assemble(jobs, findings, started=started, silence=silence,
                    extra={"nodes": nodes, "slurm_job": job_id, "sruns": len(argvs)})
