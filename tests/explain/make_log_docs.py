"""Regenerate docs/findings/log.md from the catalog: python tests/explain/make_log_docs.py"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from distdoctor.core.causes import CAUSES  # noqa: E402
from distdoctor.explain import CATALOG  # noqa: E402

HEADER = """# log — causes named from a failed job's logs (`distdoctor explain`)

These findings come from `distdoctor explain FILE... | -`, which reads what a failed job printed
(torchrun's failure summary, `[rankN]:` tracebacks, c10d, Gloo, NCCL, CUDA, DDP, launcher and
kernel messages) and names the cause. Each finding carries a **confidence** (0-1) and its evidence
(the matching lines with file and line number, and the ranks, hosts, addresses, ports, sequence
numbers, op types and timeouts the lines show) in `data`. A generic text (one with several
possible causes) is still **one** finding: its ID and cause are those of the most likely
candidate after the other lines of the logs reordered them, and `data.candidates` lists every
alternative with its confidence and the observation that tells it apart. distdoctor's own JSON
reports given to `explain` are shown again with their own IDs. The signatures are data:
`distdoctor/explain/catalog.toml`. See docs/explain.md.

This page is generated from the catalog (`python tests/explain/make_log_docs.py`).
"""


def section(kind_id: str) -> str:
    kind = CATALOG.kinds[kind_id]
    lines = [f"## {kind_id} — {kind.title}", "", f"- **Severity:** {kind.severity.label} · **Cause:** `{kind.cause}`",
             f"- **Means:** {CAUSES[kind.cause][0].upper()}{CAUSES[kind.cause][1:]}."]
    own = [s for s in CATALOG.signatures if s.kind.id == kind_id]
    as_candidate = [s for s in CATALOG.signatures if any(c.kind.id == kind_id for c in s.candidates)]
    if own:
        lines.append("- **Detected:** from these messages (signature — what the line says — confidence when alone):")
        for s in own:
            generic = " — generic: ranked with other candidates" if s.candidates else ""
            lines.append(f"  - `{s.name}` — `{s.tokens[0].strip()}` — {s.confidence:.2f} ({s.role}){generic}")
    if as_candidate:
        names = ", ".join(f"`{s.name}`" for s in as_candidate)
        lines.append(f"- **Also the answer to** these generic texts when the evidence ranks it first: {names}.")
    if kind_id == "log.W030":
        lines.append("- **Detected:** when no signature matches (the most relevant lines are quoted), or when the only "
                     "input is an empty log that names no rank.")
    if kind_id == "log.E035":
        lines.append("- **Detected:** across ranks, when their own lines name different world sizes (`world_size=4` "
                     "on some ranks, `WORLD_SIZE=2` on another; `local_world_size` is not counted) or torchrun's "
                     "summaries put one rank on two hosts (two processes claimed it); confidence 0.85. Also a "
                     "candidate of the store-barrier, rendezvous, `Socket Timeout` and NCCL unique-id texts.")
    if kind_id == "log.E037":
        lines.append("- **Detected:** when no signature matches but a line is an exception as Python prints it "
                     "(`KeyError: 'labels'`) with no traceback or rank to place it (confidence 0.5); an exception "
                     "with its traceback and rank is the job diagnosis's `job.E001` instead. Also a candidate of "
                     "`Connection closed by peer`, `ncclRemoteError` and a bare `ChildFailedError`.")
    if kind_id == "log.W036":
        lines.append("- **Detected:** when files found in a directory given to `explain` cannot be read (binary data, "
                     "a corrupt or truncated flight-recorder dump), or the directory holds more files than explain "
                     "reads; each is named, and the other files are read. Text in another encoding is read, not "
                     "skipped (UTF-16/32 decoded; 8-bit text with its bytes that are not UTF-8 replaced).")
    if kind_id == "log.W040":
        lines.append("- **Detected:** torchrun's agent saying it received SIGINT or SIGTERM itself (`Received "
                     "Signals.SIGINT death signal`, `Received 15 death signal`): the job was stopped from outside "
                     "(Ctrl-C, a scheduler's preemption or time limit, a kill); what sent it, the logs do not say.")
    if kind_id == "log.I041":
        lines.append("- **Detected:** when the logs hold several attempts of a job torchelastic restarted "
                     "(`--max-restarts`): torchrun's console cut where an attempt ends (the agent's `failed "
                     "(exitcode: C) local_rank: R` line followed by more output of the workers, `Worker group FAILED "
                     "... will restart worker group`, the next attempt's `restart_count=N`), or `--log-dir`'s "
                     "`attempt_<N>` directories. Each attempt is read on its own: the job's end is explained by its "
                     "last attempt (the findings above it), and this finding lists every earlier attempt with its own "
                     "first failure (`data.attempts`). Its cause is `unknown`: it names no cause of the job's end.")
    if kind_id == "log.E006":
        lines.append("- **Also:** when per-rank logs are empty and nothing else matched: those ranks printed nothing "
                     "(hung, killed early or never started).")
    lines.append(f"- **Fix:** {kind.hint}.")
    if own:
        lines.append(f"  The finding's own remediation fills in what the log shows, e.g. for `{own[0].name}`: "
                     f"{' '.join(own[0].remediation.split())}")
    return "\n".join(lines)


def main() -> None:
    body = [HEADER] + [section(k) for k in sorted(CATALOG.kinds)]
    (REPO / "docs" / "findings" / "log.md").write_text("\n\n".join(body) + "\n")


if __name__ == "__main__":
    main()
