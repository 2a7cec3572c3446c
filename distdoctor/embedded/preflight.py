"""The embedded API: ``preflight`` at a script's start and a bounded ``init_process_group``.

    import distdoctor
    distdoctor.init_process_group("gloo")          # torch's arguments; bounded rendezvous
    model = build_model()
    distdoctor.preflight(model=model, dataloader=loader)   # raises PreflightError on every rank

preflight's exchange, in order (every step has a deadline within ``timeout``):
1. check-in through the process group's store, with the one check-in protocol
   (distdoctor.world.checkin). Rank 0 waits for all and sets one verdict with compare_set
   (``ok``, or an abort naming the ranks that never came); a rank that gives up first sets the
   abort verdict the same way. So all ranks
   act on one decision and no rank enters a collective that another has abandoned. (Without a
   store, e.g. the MPI backend, this step is skipped and the collectives' deadlines remain.)
2. the local registry checks (cheap ones, tight deadline);
3. one all_gather of a fixed-size int64 tensor per rank: a SHA-256 digest of the spec table
   (structure and exact fingerprints) and of the versions, the size of this rank's findings,
   its batch count. Equal digests mean identical tables: nothing more to move.
4. only when digests differ: rank 0 broadcasts its table; the differing ranks compare with it
   (with tolerance) and keep only their differing rows. Then, when any rank has findings or
   rows: one all_gather of their sizes and one of the JSON bytes (padded to the largest).
   Every rank builds the same report from the same data, so the decision to raise is the same
   everywhere.
"""

from __future__ import annotations

import collections
import hashlib
import io
import json
import logging
import os
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Mapping

from distdoctor.checks._support import tensor_specs as ts
from distdoctor.checks._support.tensor_specs import SpecTable, TensorSpec, values_close
from distdoctor.checks.backend import TORCH_UNSUPPORTED
from distdoctor.core.config import Config, load_config
from distdoctor.core.findings import Finding, Severity
from distdoctor.core.kinds import RUN_DEADLINE
from distdoctor.core.registry import RegistryError
from distdoctor.core.render import make_console, render_rich
from distdoctor.core.report import Report, WorldSummary, build_report
from distdoctor.embedded import bounded_init as gi
from distdoctor.embedded import setup_checks as pc
from distdoctor.machine.host import diagnose_here
from distdoctor.machine.launchers import detect
from distdoctor.machine.probes import Probes
from distdoctor.machine.torch_support import OLDEST_TEXT, installed_version, refusal
from distdoctor.world.checkin import VERDICT, CheckInProtocol, Prefixed, StoreGone, first_line, malformed_finding
from distdoctor.world import kinds as world_kinds

logger = logging.getLogger("distdoctor")

# Local registry checks whose tags say they probe the network (DNS, connect) may block for
# seconds; inside a running job those questions are already answered by the live group.
PREFLIGHT_SKIPPED_TAGS = ("network",)
_GENERATIONS: dict[str, int] = {}


class PreflightError(RuntimeError):
    """Raised (on every rank) when preflight or init_process_group finds a problem.

    ``str(error)`` is the rendered plain-text report; ``error.report`` is the Report.
    """

    def __init__(self, report: Report, message: str | None = None) -> None:
        self.report = report
        super().__init__(message if message is not None else render_plain(report))


def _refuse_unsupported_torch() -> None:
    """PreflightError (its message one line) when this torch is older than distdoctor supports."""
    version = installed_version()
    line = refusal(version)
    if line is not None:
        finding = TORCH_UNSUPPORTED(f"torch {version} is older than the oldest release distdoctor supports ({OLDEST_TEXT})",
                                    detail=line, check="torch_support")
        raise PreflightError(build_report([finding], duration_s=0.0), message=f"distdoctor: {line}")


def render_plain(report: Report) -> str:
    buffer = io.StringIO()
    render_rich(report, make_console(buffer))
    return "distdoctor found problems:\n" + buffer.getvalue().rstrip()


# -- preflight ---------------------------------------------------------------------------------


def preflight(
    model: Any = None,
    dataloader: Any = None,
    tensors: Mapping[str, Any] | None = None,
    *,
    timeout: float = 60.0,
    fail_level: str | Severity = Severity.ERROR,
    group: Any = None,
    silence: tuple[str, ...] | list[str] = (),
    local_checks: bool = True,
    max_samples: int | None = None,
    rtol: float | None = None,
    wrap: str | None = None,
) -> Report:
    """Compare the model (and ``tensors``) across ranks and check the DDP set-up.

    Returns the Report when nothing reaches ``fail_level``; otherwise raises PreflightError on
    every rank. ``timeout`` (seconds) bounds the whole call. ``silence`` takes finding IDs or
    patterns ("spec.E004", "pre.*"). ``max_samples``/``rtol`` tune the value fingerprint
    (see distdoctor.checks._support.tensor_specs). ``wrap`` says what happens to a model that
    is not yet wrapped in DDP/FSDP: ``"later"`` (preflight runs before the wrap: differing values
    are expected, spec.I007) or ``"never"`` (no wrapper on purpose); left out, a plain module in
    a world of N > 1 gets warning pre.W011.

    Findings below ``fail_level`` at warning or above are logged at WARNING on rank 0 (logger
    ``distdoctor``), so they reach stderr without any logging set-up.
    """
    _refuse_unsupported_torch()
    # torch is imported here, not at the top: `import distdoctor` must stay cheap for the CLI.
    import torch
    import torch.distributed as dist

    started = time.monotonic()
    deadline = started + float(timeout)
    fail = Severity.parse(fail_level)
    max_samples = ts.DEFAULT_MAX_SAMPLES if max_samples is None else max_samples
    rtol = ts.DEFAULT_RTOL if rtol is None else rtol
    rank, world = _validate_inputs(torch, dist, model, tensors, group, wrap, started)
    facts = _local_facts(torch, dist, model, dataloader, tensors, group, rank, world, max_samples, wrap)
    checks: list[dict[str, Any]] = []
    extra = _check_in(dist, group, rank, world, started, deadline, checks, silence)
    facts.findings += extra
    if local_checks:
        local_findings, local_results = _local_checks(deadline, started, float(timeout))
        facts.findings += local_findings
        checks += local_results
    exchange = _Exchange(torch, dist, group, rank, world, _collective_device(torch, facts.backend), deadline)
    per_rank, counts, ref_table = exchange.run(facts.table, facts.versions, facts.findings, facts.batches, rtol)
    report = _same_report(facts, per_rank, counts, ref_table, checks, world, started, silence, rtol,
                          model, wrap, dataloader is not None)
    if report.exit_code(fail) != 0:
        raise PreflightError(report)
    if rank == 0:
        below = [f.id for f in report.findings]
        logger.info("distdoctor preflight: %s on %d ranks, %d tensors compared, %d finding(s) below the fail level%s (%.2f s)",
                    report.status, world, len(facts.table), len(below),
                    f" ({', '.join(sorted(set(below)))})" if below else "", report.duration_s)
        _log_warnings(report)
    return report


def _validate_inputs(torch: Any, dist: Any, model: Any, tensors: Mapping[str, Any] | None, group: Any,
                     wrap: str | None, started: float) -> tuple[int, int]:
    """This rank and the world size; PreflightError without a group, TypeError on wrong arguments."""
    if not (dist.is_available() and dist.is_initialized()):
        report = build_report([pc.NOT_INITIALIZED(check=pc.CHECK)], duration_s=time.monotonic() - started)
        raise PreflightError(report)
    if wrap not in (None, pc.WRAP_LATER, pc.WRAP_NEVER):
        raise ValueError(f"preflight(wrap=...) expects None, {pc.WRAP_LATER!r} or {pc.WRAP_NEVER!r}, got {wrap!r}")
    if model is not None and not hasattr(model, "named_parameters"):
        raise TypeError(f"preflight(model=...) expects a torch.nn.Module, got {type(model).__name__}")
    bad = [k for k, v in (tensors or {}).items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise TypeError(f"preflight(tensors=...) expects tensors; not a tensor: {', '.join(map(repr, bad))}")
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    if rank < 0:
        raise ValueError("preflight(group=...): this process is not a member of that group")
    return rank, world


@dataclass
class _Facts:
    """What this rank knows before talking to the others."""

    backend: str
    table: Any
    findings: list[Finding]
    batches: int | None
    versions: dict[str, Any]


def _local_facts(torch: Any, dist: Any, model: Any, dataloader: Any, tensors: Mapping[str, Any] | None, group: Any,
                 rank: int, world: int, max_samples: int, wrap: str | None) -> _Facts:
    backend = str(dist.get_backend(group))
    local_rank = _int_env("LOCAL_RANK")
    cuda_index = _expected_cuda_index(torch, local_rank)
    local: list[Finding] = []
    table = ts.SpecTable()
    if model is not None:
        table = pc.model_spec_table(model, max_samples)
        local += pc.model_findings(model, rank=rank, world_size=world, local_rank=local_rank, backend=backend,
                                   expected_cuda_index=cuda_index)
        local += pc.wrap_findings(model, rank=rank, world_size=world, wrap=wrap)
    if tensors:
        named = [(f"tensors[{k!r}]", v) for k, v in tensors.items()]
        table = ts.SpecTable(table.specs + ts.spec_table(named, max_samples=max_samples).specs)
        local += pc.tensors_findings(tensors, rank=rank, backend=backend, local_rank=local_rank,
                                     expected_cuda_index=cuda_index)
    local += pc.dataloader_findings(dataloader, rank=rank, world_size=world)
    versions = {"torch": torch.__version__, "cuda": torch.version.cuda}
    return _Facts(backend, table, local, pc.batch_count(dataloader), versions)


def _check_in(dist: Any, group: Any, rank: int, world: int, started: float, deadline: float,
              checks: list[dict[str, Any]], silence: Any) -> list[Finding]:
    """Step 1: the check-in through the group's store, one verdict for all ranks (raises when it
    fails); returns the findings about malformed store entries met on the way."""
    store = _default_store(dist)
    if store is None:
        return []
    name = str(getattr(group or dist.group.WORLD, "group_name", "world"))
    generation = _GENERATIONS[name] = _GENERATIONS.get(name, 0) + 1
    verdict, extra = _decide(store, f"distdoctor/preflight/{name}/{generation}/", rank, world, started, deadline)
    if not verdict.get("ok"):
        findings = [f for f in (_finding(raw) for raw in verdict.get("findings", ())) if f is not None] + extra
        raise PreflightError(_report(findings, checks, world, list(verdict.get("arrived", ())), started, silence,
                                     incomplete=True))
    return extra


def _same_report(facts: _Facts, per_rank: Mapping[int, Mapping[str, Any]], counts: Mapping[int, int | None],
                 ref_table: Any, checks: list[dict[str, Any]], world: int, started: float, silence: Any,
                 rtol: float, model: Any, wrap: str | None, loader_given: bool) -> Report:
    """The same report on every rank, from the same exchanged data."""
    findings: list[Finding] = []
    tables = {0: ref_table}
    for r, item in per_rank.items():
        findings += [Finding.from_dict(f) for f in item.get("findings", ())]
        if item.get("delta"):
            tables[r] = _apply_delta(ref_table, item["delta"])
    # With one table this only says which tensors could not be compared (sharded, meta).
    compared = ts.compare_tables(tables, rtol=rtol, label="parameter" if model is not None else "tensor",
                                 check=pc.CHECK)
    findings += ts.values_findings_for_wrap(compared, pc.wrappers_of(model), wrap) if model is not None else compared
    findings += pc.batch_count_findings(counts) if loader_given else []
    checks.append({"name": "preflight.exchange", "stage": "collective", "status": "fail" if findings else "pass",
                   "duration_s": round(time.monotonic() - started, 4)})
    return _report(findings, checks, world, list(range(world)), started, silence)


def _log_warnings(report: Report) -> None:
    """Warnings below the fail level must still reach the user: logged at WARNING, which Python's
    last-resort handler prints to stderr when the script configured no logging."""
    for finding in report.findings:
        if finding.severity >= Severity.WARNING:
            logger.warning("distdoctor preflight: %s %s\n  fix: %s", finding.id, finding.title, finding.remediation)


class _Exchange:
    """Steps 3 and 4 of preflight (see the module docstring); every wait bounded by ``deadline``."""

    def __init__(self, torch: Any, dist: Any, group: Any, rank: int, world: int, device: Any, deadline: float) -> None:
        self.torch, self.dist, self.group = torch, dist, group
        self.rank, self.world, self.device, self.deadline = rank, world, device, deadline

    def run(self, table: Any, versions: Mapping[str, Any], local: list[Finding], batches: int | None,
            rtol: float) -> tuple[dict[int, dict[str, Any]], dict[int, int | None], Any]:
        """(rank -> its findings and spec delta, rank -> batch count, rank 0's table)."""
        # Identical tables (same seed, or after DDP's broadcast) have bit-identical fingerprints,
        # so equal digests settle the comparison without moving any table.
        payload = _encode_payload(local, {})
        mine = [*_digest(table.structure_key(), table.checksums()), _digest(versions)[0], len(payload),
                -1 if batches is None else batches]
        rows = self.all_gather_ints(mine, "summary all_gather")
        counts = {r: (None if row[6] < 0 else int(row[6])) for r, row in enumerate(rows)}
        differs = [r for r, row in enumerate(rows) if row[:5] != rows[0][:5]]
        sizes = [int(row[5]) for row in rows]
        # A rank whose digests equal rank 0's holds rank 0's very table.
        ref_table = table
        if differs:
            # Rank 0 broadcasts its table; the ranks that differ compare with it (with the
            # tolerance) and send only their differing rows.
            encoded = json.dumps({"table": table.encode(), "versions": versions}).encode() if self.rank == 0 else b""
            received = self.broadcast_bytes(encoded)
            if self.rank in differs:
                reference = json.loads(received)
                ref_table = ts.SpecTable.decode(reference["table"])
                extra = pc.version_findings(versions, reference.get("versions", {}), self.rank)
                payload = _encode_payload(local + extra, _delta(ref_table, table, rtol))
            sizes = [row[0] for row in self.all_gather_ints([len(payload)], "sizes all_gather")]
        per_rank: dict[int, dict[str, Any]] = {}
        if any(sizes):
            for r, data in self.all_gather_bytes(payload, max(sizes), sizes).items():
                per_rank[r] = json.loads(data)
        return per_rank, counts, ref_table

    def all_gather_ints(self, values: list[int], what: str) -> list[list[int]]:
        torch = self.torch
        mine = torch.tensor(values, dtype=torch.int64, device=self.device)
        out = [torch.zeros_like(mine) for _ in range(self.world)]
        _hold(mine, out)
        _wait(self.dist.all_gather(out, mine, group=self.group, async_op=True), self.deadline, what, self.world)
        return [t.cpu().tolist() for t in out]

    def all_gather_bytes(self, data: bytes, width: int, sizes: list[int]) -> dict[int, bytes]:
        """Every rank's bytes (padded to ``width``); only the ranks with a non-zero size are returned."""
        torch = self.torch
        padded = torch.zeros(width, dtype=torch.uint8, device=self.device)
        if data:
            padded[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        out = [torch.zeros_like(padded) for _ in range(self.world)]
        _hold(padded, out)
        _wait(self.dist.all_gather(out, padded, group=self.group, async_op=True), self.deadline,
              "details all_gather", self.world)
        return {r: bytes(t[:size].cpu().tolist()) for r, (t, size) in enumerate(zip(out, sizes)) if size}

    def broadcast_bytes(self, data: bytes) -> bytes:
        """Group rank 0's bytes to every rank: a length, then the bytes."""
        torch, dist = self.torch, self.dist
        src = dist.get_global_rank(self.group, 0) if self.group is not None else 0
        size = torch.tensor([len(data)], dtype=torch.int64, device=self.device)
        _hold(size)
        _wait(dist.broadcast(size, src=src, group=self.group, async_op=True), self.deadline,
              "reference broadcast", self.world)
        buffer = torch.zeros(int(size.item()), dtype=torch.uint8, device=self.device)
        if data:
            buffer.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        _hold(buffer)
        _wait(dist.broadcast(buffer, src=src, group=self.group, async_op=True), self.deadline,
              "reference broadcast", self.world)
        return bytes(buffer.cpu().tolist())


# The tensors of preflight's last collectives, kept referenced after preflight returns. On torch
# 2.1-2.4 (measured: 2.1.2 and 2.4.1, gloo; not 2.8.0) a gloo worker thread that drops a finished
# Work holding the last reference to a tensor created in Python must take the GIL to free it, while
# destroy_process_group joins that thread holding the GIL: the job deadlocks at its end (a plain
# all_gather + destroy_process_group without distdoctor, on a loaded 2-core machine: 4 runs in 12
# on 2.1.2, 4 in 8 and 3 in 8 on 2.4.1; compat/jobs/preflight_job.py with preflight's tensors
# held as below: 0 in 8 on each, beside the 3 in 8).
# Held here, preflight's tensors are never the last reference. A gloo worker releases its Work
# before it takes the next, and preflight waits for each collective, so at most the last one per
# worker (gloo has 2) is unreleased: the last 4 collectives' tensors are kept. Only CPU tensors
# (gloo's): nothing of a GPU's memory is kept past preflight.
_HELD: collections.deque = collections.deque(maxlen=4)


def _hold(*tensors: Any) -> None:
    flat = [t for item in tensors for t in (item if isinstance(item, (list, tuple)) else [item])]
    if all(getattr(getattr(t, "device", None), "type", None) == "cpu" for t in flat):
        _HELD.append(tuple(flat))


def _encode_payload(findings: list[Finding], delta: Mapping[str, Any]) -> bytes:
    if not findings and not delta:
        return b""
    return json.dumps({"findings": [f.to_dict() for f in findings], "delta": dict(delta)},
                      separators=(",", ":")).encode()


def _digest(*parts: Any) -> list[int]:
    """Four signed int64 words of a SHA-256 over the parts' repr (stable within one torch/Python)."""
    raw = hashlib.sha256(repr(parts).encode()).digest()
    return [int.from_bytes(raw[i:i + 8], "little", signed=True) for i in range(0, 32, 8)]


def _report(findings: list[Finding], checks: list[dict[str, Any]], world: int, reported: list[int],
            started: float, silence: Any, incomplete: bool = False) -> Report:
    missing = sorted(set(range(world)) - set(reported))
    return build_report(findings, checks, world=WorldSummary(size=world, launcher=_launcher(), ranks_reported=tuple(reported),
                                                            ranks_missing=tuple(missing)),
                        duration_s=time.monotonic() - started, incomplete=incomplete, silence=tuple(silence))


def _launcher() -> str:
    try:
        return detect(dict(os.environ), ()).launcher
    except Exception:
        return "unknown"


def _default_store(dist: Any) -> Any:
    """The default group's store (for the bounded check-in); None where there is none (MPI)."""
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:
        return None


def _decide(store: Any, prefix: str, rank: int, world: int, started: float,
            deadline: float) -> tuple[dict[str, Any], list[Finding]]:
    """One verdict for all ranks through the check-in protocol: rank 0 decides when all arrived
    (at 85 % of the budget at the latest: it can name the missing); whoever gives up first aborts.
    Returns the verdict and the findings about malformed store entries."""
    protocol = CheckInProtocol(Prefixed(store, prefix), size=world)
    budget = deadline - time.monotonic()
    try:
        protocol.check_in(rank, {"pid": os.getpid()}, deadline)
        if rank == 0:
            seen, _ = protocol.wait_roster(world, time.monotonic() + budget * 0.85)
            proposal = _proposal({r for r, _ in seen}, world, deadline - started, "Rank 0")
        else:
            _, verdict = protocol.wait_for({"decision": VERDICT}, deadline)
            if verdict is not None:
                return verdict, _malformed(protocol, rank)
            present = {r for r, _ in protocol.roster(world)} - {0}
            proposal = _proposal(present, world, deadline - started, f"Rank {rank}")
        verdict = protocol.decide(proposal, *VERDICT)
    except (StoreGone, RuntimeError, OSError) as exc:  # the store went away: rank 0 ended
        finding = pc.ranks_missing_finding([0], world, deadline - started, f"Rank {rank}")
        finding.detail += f" The store stopped answering: {first_line(exc)}."
        verdict = {"ok": False, "findings": [finding.to_dict()], "arrived": [rank]}
    return verdict, _malformed(protocol, rank)


def _proposal(arrived: set[int], world: int, waited: float, who: str) -> dict[str, Any]:
    present = sorted(r for r in arrived if 0 <= r < world)
    missing = sorted(set(range(world)) - set(present))
    if not missing:
        return {"ok": True}
    return {"ok": False, "arrived": present,
            "findings": [pc.ranks_missing_finding(missing, world, waited, who).to_dict()]}


def _malformed(protocol: CheckInProtocol, rank: int) -> list[Finding]:
    finding = malformed_finding(protocol, rank, world_kinds.STORE_ENTRY_MALFORMED, check=pc.CHECK)
    return [finding] if finding is not None else []


def _finding(raw: Any) -> Finding | None:
    try:
        return Finding.from_dict(raw)
    except (KeyError, ValueError, TypeError):
        return None  # a finding of a shape no distdoctor writes: not trusted


def _delta(reference: Any, mine: Any, rtol: float) -> dict[str, Any]:
    """My specs that differ from rank 0's (rows), and the names of its tensors I lack."""
    ref_index = reference.index()
    changed = []
    for spec in mine.specs:
        ref = ref_index.get(spec.name)
        if ref is None or (spec.shape, spec.dtype, spec.device, spec.note) != (ref.shape, ref.dtype, ref.device, ref.note):
            changed.append(spec.to_row())
        elif spec.checksum is not None and ref.checksum is not None and (
                spec.sampled != ref.sampled or not values_close(ref.checksum, spec.checksum, ref.sampled, rtol)):
            changed.append(spec.to_row())
    index = mine.index()
    missing = [name for name in ref_index if name not in index] if len(index) != len(ref_index) or changed else []
    if not changed and not missing:
        return {}
    return {"changed": changed, "missing": missing}


def _apply_delta(reference: Any, delta: Mapping[str, Any]) -> Any:
    """Rebuild a rank's table from rank 0's and that rank's delta (O(tensors))."""
    changed = {row[0]: TensorSpec.from_row(row) for row in delta.get("changed", ())}
    missing = set(delta.get("missing", ()))
    specs = [changed.pop(s.name, s) for s in reference.specs if s.name not in missing]
    return SpecTable(specs + list(changed.values()))


def _wait(work: Any, deadline: float, what: str, world: int) -> None:
    """Wait for an async collective until the deadline; a timeout or a failure raises PreflightError."""
    remaining = max(0.1, deadline - time.monotonic())
    try:
        if work.wait(timeout=timedelta(seconds=remaining)) is not False:
            return
        title, reason = f"preflight's {what} did not complete within the deadline", "it timed out"
    except Exception as exc:  # gloo raises "Operation timed out!" at the deadline
        text = str(exc).splitlines()[0][:300] if str(exc) else ""
        title, reason = f"preflight's {what} failed or timed out", f"{type(exc).__name__}: {text}"
    finding = RUN_DEADLINE(title, detail=f"Every rank had checked in, then the collective broke off: {reason}. "
                                         "A rank crashed or stalled after checking in.", check="preflight")
    raise PreflightError(build_report([finding], world=WorldSummary(size=world), incomplete=True))


def _local_checks(deadline: float, started: float, timeout: float) -> tuple[list[Finding], list[dict[str, Any]]]:
    """The registry's local checks (minus the network probes), with a tight deadline."""
    budget = max(0.5, min(5.0, (deadline - time.monotonic()) * 0.25))
    try:
        config = load_config(cli={"stages": ("local",), "timeout": budget, "check_timeout": min(2.0, budget)})
    except Exception:
        config = Config(stages=("local",), timeout=budget, check_timeout=min(2.0, budget))
    try:
        report = diagnose_here(config, skip_tags=PREFLIGHT_SKIPPED_TAGS)
    except RegistryError:  # DISTDOCTOR_TAGS selecting no local check: nothing to add here
        return [], []
    return list(report.findings), report.checks


def _collective_device(torch: Any, backend: str) -> Any:
    parts = [p.split(":")[-1].strip().lower() for p in backend.split(",")]
    if "nccl" in parts and not any(p in ("gloo", "mpi", "ucc") for p in parts):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _int_env(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def _expected_cuda_index(torch: Any, local_rank: int | None) -> int | None:
    """This rank's GPU: LOCAL_RANK when set (the torchrun convention), else the current device."""
    try:
        if not torch.cuda.is_available():
            return None
        if local_rank is not None and local_rank < torch.cuda.device_count():
            return local_rank
        return torch.cuda.current_device()
    except Exception:
        return None


# -- bounded init_process_group ------------------------------------------------------------------

_UNSET: Any = object()


def init_process_group(
    backend: Any = _UNSET,
    init_method: Any = _UNSET,
    timeout: Any = _UNSET,
    world_size: Any = _UNSET,
    rank: Any = _UNSET,
    store: Any = _UNSET,
    group_name: Any = _UNSET,
    pg_options: Any = _UNSET,
    device_id: Any = _UNSET,
    *,
    rendezvous_timeout: float = 60.0,
    fail_level: str | Severity = Severity.ERROR,
    local_checks: bool = True,
    guard: bool | Mapping[str, Any] | None = None,
    **torch_kwargs: Any,
) -> None:
    """torch.distributed.init_process_group with local checks and a bounded rendezvous.

    Takes torch's arguments and passes exactly those given on to torch. Before that it runs
    the local checks (at most 10 s; raising PreflightError on findings at ``fail_level``) and,
    for env:// and tcp:// (the default), a check-in through the rendezvous store bounded by
    ``rendezvous_timeout`` seconds that names missing ranks, an unreachable master, a port in
    use or duplicate ranks. file:// and an explicit ``store`` are passed to torch unchecked
    apart from the local checks. ``guard=True`` (or a dict of distdoctor.guard's arguments)
    turns the runtime guard on once the group exists; left None, DISTDOCTOR_GUARD=1 does.
    """
    _refuse_unsupported_torch()
    # torch is imported here, not at the top: `import distdoctor` must stay cheap for the CLI.
    import torch.distributed as dist

    started = time.monotonic()
    fail = Severity.parse(fail_level)
    given = {k: v for k, v in dict(backend=backend, init_method=init_method, timeout=timeout, world_size=world_size,
                                   rank=rank, store=store, group_name=group_name, pg_options=pg_options,
                                   device_id=device_id).items() if v is not _UNSET}
    given.update(torch_kwargs)
    env = dict(os.environ)

    if local_checks:
        report = _init_local_checks(given.get("backend"), min(10.0, float(rendezvous_timeout) / 2))
        if report.exit_code(fail) != 0:
            raise PreflightError(report)

    # The rendezvous deadline starts after the local checks (bounded on their own).
    deadline = time.monotonic() + float(rendezvous_timeout)
    target = None
    if given.get("store") is None:
        target = gi.resolve_target(given.get("init_method"), int(given.get("rank", -1)),
                                   int(given.get("world_size", -1)), env)
    if target is not None and target.world_size > 1:
        try:
            our_store = gi.open_store(target, deadline, Probes())
            gi.check_in(our_store, target, deadline, env)
        except gi.CheckInFailed as failed:
            report = build_report(failed.findings, world=WorldSummary(size=target.world_size, launcher=_launcher()),
                                  duration_s=time.monotonic() - started, incomplete=False)
            raise PreflightError(report) from None
    wants_guard = guard if guard is not None else os.environ.get("DISTDOCTOR_GUARD", "") not in ("", "0")
    if wants_guard:  # the recorder's buffer is read when the group is created
        from distdoctor.embedded.guard.flight import prepare_this_process

        prepare_this_process()
    try:
        dist.init_process_group(**given)
    except Exception as exc:
        if target is None:
            raise
        finding = gi.INIT_TORCH_FAILED(
            f"torch's init_process_group failed on rank {target.rank}: {type(exc).__name__}",
            detail=str(exc)[:2000], ranks=(target.rank,), check=gi.CHECK)
        raise PreflightError(build_report([finding], duration_s=time.monotonic() - started)) from exc
    if wants_guard:
        # The runtime guard (and its torch hooks) loads only when it is asked for.
        from distdoctor.embedded.guard import guard as start_guard

        start_guard(**(dict(guard) if isinstance(guard, Mapping) else {}))


def _init_local_checks(backend: Any, budget: float) -> Report:
    cli: dict[str, Any] = {"stages": ("local",), "timeout": max(1.0, budget), "check_timeout": max(0.5, min(5.0, budget))}
    if isinstance(backend, str) and backend.lower() in ("nccl", "gloo", "mpi", "ucc", "xccl"):
        cli["backend"] = backend.lower()
    # torch's env:// derives nothing from srun/mpirun variables: check what it will read.
    env = dict(os.environ)
    return diagnose_here(load_config(cli=cli), env=env, launch=detect(env, tuple(sys.argv), derive=False))
