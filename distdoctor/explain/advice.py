"""What explain looked for in logs that name no cause, and what to collect next, from what they show."""

# A log with no known failure signature is still an answer: it says what was searched for (so the
# user knows the absence means something), what the logs do show (torch.distributed at work or not,
# how many ranks, the job still at work at the end), and the one or two things to collect that would
# name the cause, chosen by what is missing: NCCL's own lines, each rank's output, the other ranks,
# a view of the job while it hangs. Data, not prose assembled in the renderer: the finding carries
# `looked_for`, `shown` and `collect_next`.

from __future__ import annotations

from dataclasses import dataclass, field

from distdoctor.core.report import format_ranks
from distdoctor.explain.scan import Accumulator

LOOKED_FOR = ("{n} known failure messages of torch.distributed, its store, Gloo and NCCL (NCCL's own WARN lines "
              "too), CUDA, DDP, torchrun and the other launchers, the shell, the kernel and schedulers",
              "a Python traceback on any rank, and torchrun's failure summary (exit codes, signals)",
              "NCCL's watchdog lines, and which ranks kept printing while others complained")

NCCL_DEBUG = ("NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET on every rank: NCCL's own lines name the interface, "
              "transport and peers it uses, and its WARN lines say what failed")
PER_RANK = ("each rank's own output: torchrun --log-dir DIR --tee 3 (one file per rank, every line prefixed "
            "[rankN]:), and @record on main() so torchrun's summary carries the traceback")
OTHER_RANKS = ("the other ranks' logs (these show {ranks}): the rank that printed nothing is often the one that "
               "failed first")
HANG = ("a view of the job while it hangs: distdoctor guard -- <your launcher line> names the rank a stalled "
        "collective waits for; distdoctor stacks on a running job; TORCH_NCCL_TRACE_BUFFER_SIZE=2000 keeps "
        "torch's flight recorder for a dump")
NOT_DISTRIBUTED = ("the output of the job that failed: these logs show nothing of torch.distributed, a launcher or "
                   "NCCL (the failing rank's stderr, the scheduler's --output file, kubectl logs --previous)")
DETAIL = ("TORCH_DISTRIBUTED_DEBUG=DETAIL TORCH_CPP_LOG_LEVEL=INFO: torch.distributed's own account of each "
          "collective (a mismatch between ranks is named)")


@dataclass
class Advice:
    looked_for: list[str]
    shown: list[str]
    collect_next: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = ["What explain looked for, and found none of:"] + [f"  - {x}" for x in self.looked_for]
        if self.shown:
            out += ["What these logs show:"] + [f"  - {x}" for x in self.shown]
        out += ["What to collect next:"] + [f"  {i}. {x}" for i, x in enumerate(self.collect_next, 1)]
        return out

    def to_dict(self) -> dict:
        return {"looked_for": list(self.looked_for), "shown": list(self.shown), "collect_next": list(self.collect_next)}


def advice(acc: Accumulator, signatures: int, failed: bool) -> Advice:
    """failed: the logs hold an error-looking line (else they end while the job looked at work, or say nothing)."""
    nccl = "ctx_nccl" in acc.cues
    distributed = nccl or "ctx_torch_distributed" in acc.cues or any(
        token in text for *_, text in acc.relevant for token in ("torch.distributed", "c10d", "NCCL", "gloo"))
    shown = [("torch.distributed at work (its frames, its backends' lines, NCCL named)" if distributed
              else "nothing of torch.distributed, a launcher or NCCL")]
    if acc.ranks_seen:
        shown.append(f"the lines of rank{'s' if len(acc.ranks_seen) != 1 else ''} {format_ranks(acc.ranks_seen)}")
    if "ctx_nccl_debug" in acc.cues:
        shown.append("NCCL's INFO lines (NCCL_DEBUG=INFO was set)")
    if not failed:
        shown.append("no line that looks like an error: the job was at work or waiting when these logs end")
    steps = _collect(acc, distributed, nccl, failed)
    return Advice([LOOKED_FOR[0].format(n=signatures), *LOOKED_FOR[1:]], shown, steps)


def _collect(acc: Accumulator, distributed: bool, nccl: bool, failed: bool) -> list[str]:
    if not distributed and not acc.ranks_seen:
        return [NOT_DISTRIBUTED]
    steps = []
    if not failed:
        steps.append(HANG)
    if nccl and "ctx_nccl_debug" not in acc.cues:
        steps.append(NCCL_DEBUG)
    if not acc.ranks_seen and ("ctx_torchrun" in acc.cues or distributed):
        steps.append(PER_RANK)
    elif len(acc.ranks_seen) == 1:
        steps.append(OTHER_RANKS.format(ranks=f"rank {format_ranks(acc.ranks_seen)} only"))
    if failed and distributed:
        steps.append(DETAIL)
    return steps or [HANG]
