"""Start one world across lab hosts, either as distdoctor ranks or as the plain torch script.

Every rank is one process on its host, started the way a user starts a multi-node job by hand
(RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE / MASTER_ADDR / MASTER_PORT), all at once
(Popen, then wait), so a world's wall time is its slowest rank, not the sum.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from netns import Lab, Started
from tests.conftest import DISTDOCTOR_AFTER_TORCH, IMPORTED, recent_startup_s

PLAIN_TORCH = str(Path(__file__).with_name("plain_torch.py"))
# Any port is free in a namespace the lab has just made: nothing else runs there.
MASTER_PORT = 29500
_SCRUB_PREFIXES = ("DISTDOCTOR_", "TORCHELASTIC_", "SLURM_", "OMPI_", "PMI_", "PMIX_", "JSM_", "PET_",
                   "GLOO_", "NCCL_", "TORCH_NCCL_", "KUBERNETES_")
_SCRUB_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                "GROUP_RANK", "ROLE_RANK", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "NODE_RANK")


def scenario_deadline(base: float = 10.0) -> float:
    """distdoctor's --timeout in a lab scenario: ``base`` plus three start-ups measured now.

    Every rank must import torch and run its local stages before the rendezvous exchange; on a
    loaded machine that alone took 9 s of a fixed 10 s deadline (the rendezvous stage was then
    skipped and its findings never made), so the deadline scales with the measured start-up.
    """
    return float(round(base + 3 * recent_startup_s()))


def base_env() -> dict[str, str]:
    """This process's environment without anything that would describe another job."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(_SCRUB_PREFIXES) and k not in _SCRUB_NAMES and not k.startswith("PYTEST_")}
    # Two cores shared by every rank of every host: keep each rank to one compute thread.
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1", NO_COLOR="1")
    return env


@dataclass
class RankSpec:
    """One rank of the world: on which host, and what differs in its environment."""

    host: str
    rank: int
    local_rank: int = 0
    local_world_size: int = 1
    env: Mapping[str, str | None] = field(default_factory=dict)  # None removes a variable
    start: bool = True  # False: the rank belongs to the world but is never started


@dataclass
class WorldRun:
    ranks: dict[int, Started]
    bound: float
    timeout: float | None = None  # the --timeout distdoctor was given (distdoctor_world)

    def wait(self) -> "WorldRun":
        """Wait for every rank up to ``bound`` s from the start; kill what is still running."""
        for started in self.ranks.values():
            remaining = self.bound - (time.monotonic() - started.started_at)
            started.wait(max(remaining, 0.01))
        for started in self.ranks.values():
            started.kill()
        return self

    def code(self, rank: int) -> int | None:
        """The exit code, or None when the rank was still running at the bound (killed)."""
        started = self.ranks[rank]
        return None if started.ended_at is None else started.popen.returncode

    def elapsed(self, rank: int) -> float | None:
        return self.ranks[rank].elapsed

    def elapsed_in_distdoctor(self, rank: int) -> float | None:
        """The rank's wall time less the torch import that came before distdoctor's clock (DISTDOCTOR_AFTER_TORCH)."""
        elapsed = self.elapsed(rank)
        said = re.search(rf"^{re.escape(IMPORTED)}([\d.]+) s$", self.ranks[rank].stderr, re.M)
        return None if elapsed is None else elapsed - (float(said.group(1)) if said else 0.0)

    def output(self, rank: int) -> str:
        started = self.ranks[rank]
        return started.stdout + started.stderr

    def report(self, rank: int = 0) -> dict[str, Any]:
        """The JSON report a rank printed (``--format json``); fails the test with its output."""
        text = self.ranks[rank].stdout
        start = text.find("{")
        try:
            if start < 0:
                raise ValueError("no '{' in stdout")
            report, end = json.JSONDecoder().raw_decode(text, start)
            if text[end:].strip():
                raise ValueError(f"more output after the report: {text[end:end + 200]!r}")
            return report
        except ValueError as exc:
            raise AssertionError(
                f"rank {rank} printed no single JSON report (exit {self.code(rank)}; {exc}):\n"
                f"stdout:\n{self.ranks[rank].stdout[-3000:]}\nstderr:\n{self.ranks[rank].stderr[-3000:]}"
            ) from None

    def describe(self) -> str:
        """Per rank: exit code, time, and the report's findings (or the output's tail)."""
        lines = []
        for rank, started in sorted(self.ranks.items()):
            elapsed = self.elapsed(rank)
            lines.append(f"--- rank {rank} on {started.host.name}: exit {self.code(rank)} after "
                         f"{f'{elapsed:.2f}s' if elapsed is not None else 'the bound (killed)'}")
            text = started.stdout
            try:
                report = json.loads(text[text.index("{"):])
            except ValueError:
                lines.append("stdout: " + text[-1500:])
            else:
                lines.append(f"status {report.get('status')}, world {report.get('world')}")
                for f in report.get("findings", []):
                    lines.append(f"  {f.get('id')} [{f.get('cause')}] ranks {f.get('ranks')} hosts {f.get('hosts')}: "
                                 f"{f.get('title')} | {str(f.get('detail'))[:300]} | fix: {str(f.get('remediation'))[:300]}")
                odd = [f"{c['name']}={c['status']}" for c in report.get("checks", []) if c.get("status") not in ("pass", "skip")]
                lines.append(f"  checks not passed: {odd}")
            lines.append("stderr: " + started.stderr[-1500:])
        return "\n".join(lines)


def _rank_env(spec: RankSpec, world_size: int, master_addr: str, master_port: int) -> dict[str, str]:
    env = base_env()
    env.update(RANK=str(spec.rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(spec.local_rank),
               LOCAL_WORLD_SIZE=str(spec.local_world_size), MASTER_ADDR=master_addr,
               MASTER_PORT=str(master_port))
    for key, value in spec.env.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def start_world(lab: Lab, specs: Sequence[RankSpec], argv: Sequence[str], *, world_size: int | None = None,
                master_addr: str = "hosta", master_port: int = MASTER_PORT, bound: float = 30.0,
                label: str = "rank") -> WorldRun:
    world_size = world_size if world_size is not None else len(specs)
    ranks: dict[int, Started] = {}
    for spec in specs:
        if not spec.start:
            continue
        env = _rank_env(spec, world_size, master_addr, master_port)
        ranks[spec.rank] = lab.spawn(spec.host, argv, env=env, label=f"{label}{spec.rank}", cwd=str(lab.workdir))
    return WorldRun(ranks, bound)


# (test, deadline, slowest rank's seconds or None when killed, exit codes): the session summary.
DISTDOCTOR_RESULTS: list[tuple[str, float, float | None, dict[int, int | None]]] = []


def current_test() -> str:
    return os.environ.get("PYTEST_CURRENT_TEST", "?").split("::")[-1].split(" ")[0]


def distdoctor_world(lab: Lab, specs: Sequence[RankSpec], *, timeout: float, args: Sequence[str] = (),
                     **kwargs: Any) -> WorldRun:
    """Every started rank runs ``distdoctor check --format json --timeout T``; waits for them."""
    # torch is imported before distdoctor's clock starts. The lab judges what the ranks find about the network
    # within the deadline; torch's import, which a real node does in seconds, took 19.6 s of a 27 s deadline on a
    # lab rank in a quiet CI run while both workers' jobs imported torch at once, and the run was cut off before
    # any check began. The rank says on stderr how long the import took: the deadline is judged from when
    # distdoctor started. What a rank says when its own start-up outlasts the deadline is tested without the lab
    # (tests/crossrank/test_watchdog_and_merge.py).
    argv = [*DISTDOCTOR_AFTER_TORCH, "check", "--format", "json", "--timeout", f"{timeout:g}", *args]
    # Generous outer bound: the assertions check the deadline, this only stops a runaway.
    run = start_world(lab, specs, argv, bound=timeout + 60, label="dd", **kwargs)
    run.timeout = timeout
    run.wait()
    times = [run.elapsed_in_distdoctor(r) for r in run.ranks]
    slowest = None if any(t is None for t in times) else max(times, default=0.0)
    DISTDOCTOR_RESULTS.append((current_test(), timeout, slowest, {r: run.code(r) for r in run.ranks}))
    return run


@dataclass
class PlainTorchOutcome:
    """What the plain script did within the bound: finished, failed (with its error) or hung."""

    scenario: str
    bound: float
    hung: bool
    elapsed: float
    codes: dict[int, int | None]
    errors: dict[int, str]

    def summary(self) -> str:
        if self.hung and not any(self.errors.values()):
            return f"still hanging after {self.bound:g}s (killed), no error printed"
        parts = []
        for rank, error in sorted(self.errors.items()):
            state = "hung" if self.codes[rank] is None else f"exit {self.codes[rank]}"
            parts.append(f"rank {rank} {state}: {error or '(no error)'}")
        return "; ".join(parts)


PLAIN_TORCH_RESULTS: list[PlainTorchOutcome] = []


def last_error_line(text: str) -> str:
    """The line a user would read first: the exception (or torch's error) at the end."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    for line in reversed(lines):
        if "Error" in line or "error" in line or "Exception" in line or "failed" in line:
            return line[:400]
    return lines[-1][:400] if lines else ""


def plain_torch_world(lab: Lab, specs: Sequence[RankSpec], scenario: str, *, bound: float = 10.0,
                      **kwargs: Any) -> PlainTorchOutcome:
    """Run the plain torch script (torch's default timeouts) for at most ``bound`` s."""
    run = start_world(lab, specs, [sys.executable, PLAIN_TORCH], bound=bound, label="torch", **kwargs).wait()
    codes = {rank: run.code(rank) for rank in run.ranks}
    errors = {rank: (last_error_line(run.ranks[rank].stderr) if codes[rank] not in (0,) else "")
              for rank in run.ranks}
    hung = any(code is None for code in codes.values())
    elapsed = max((run.elapsed(r) or bound) for r in run.ranks) if run.ranks else 0.0
    outcome = PlainTorchOutcome(scenario, bound, hung, elapsed, codes, errors)
    PLAIN_TORCH_RESULTS.append(outcome)
    return outcome


# -- reading a report ---------------------------------------------------------------------
def findings(report: Mapping[str, Any], cause: str | None = None) -> list[dict[str, Any]]:
    return [f for f in report.get("findings", []) if cause is None or f.get("cause") == cause]


def text_of(finding: Mapping[str, Any]) -> str:
    return " ".join(str(finding.get(k, "")) for k in ("title", "detail", "remediation"))


def check_statuses(report: Mapping[str, Any], stage: str) -> dict[str, str]:
    return {c["name"]: c["status"] for c in report.get("checks", []) if c.get("stage") == stage}
