"""The runtime guard: torch.distributed calls verified across ranks while the job runs, hangs explained."""

#     import distdoctor
#     dist.init_process_group("nccl")
#     distdoctor.guard()                 # or distdoctor.init_process_group("nccl", guard=True)
#
# Every collective and point-to-point call of every group is recorded (sequence number, op,
# shapes, dtypes, devices, root, reduce op, the caller's file:line) in a ring buffer. The first
# ``verify_first`` collectives of each group, then samples (at most ``verify_budget`` of the time
# between calls, at least every ``verify_every``-th; distdoctor.embedded.guard.sample) are compared
# across the group's ranks before they run (``verify="all"``: every call); a mismatch raises GuardError
# on every rank of the group. A stall longer than ``hang_timeout`` opens an episode of the
# cross-rank diagnosis (distdoctor.embedded.guard.watch); ``on_hang`` says what it does to the job
# (distdoctor.embedded.guard.policy: "auto" ends it only when it cannot finish). See docs/guard.md.

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from distdoctor.embedded.guard.report import HANG_EXIT_CODE, GuardError, on_hang_exit, render_text

__all__ = ["HANG_EXIT_CODE", "GuardError", "GuardSettings", "active", "guard", "on_hang_exit", "render_text",
           "settings_from_env", "unguard"]

if TYPE_CHECKING:
    from distdoctor.embedded.guard.process import Guard

VERIFY_MODES = ("sample", "all", "off")
ON_HANG = ("auto", "exit", "report")
SLOW_MODES = ("on", "off")
_ACTIVE: "Guard | None" = None
_GENERATION = [0]


@dataclass(frozen=True)
class GuardSettings:
    verify: str = "sample"
    verify_first: int = 8
    verify_every: int = 1000
    verify_budget: float = 0.005
    hang_timeout: float = 120.0
    on_hang: str = "auto"
    report_dir: str | None = None
    ring_size: int = 256
    answer_s: float = 1.5
    poll_s: float = 0.25
    slow: str = "off"           # the slow-rank accounting (embedded.guard.pace; docs/slow-ranks.md: why off)
    slow_window: float = 30.0   # seconds per window of it

    def check(self) -> "GuardSettings":
        if self.verify not in VERIFY_MODES:
            raise ValueError(f"guard(verify=...): expected one of {', '.join(VERIFY_MODES)}, got {self.verify!r}")
        if self.on_hang not in ON_HANG:
            raise ValueError(f"guard(on_hang=...): expected one of {', '.join(ON_HANG)}, got {self.on_hang!r}")
        if not self.hang_timeout > 0:
            raise ValueError(f"guard(hang_timeout=...): expected seconds > 0, got {self.hang_timeout!r}")
        if self.slow not in SLOW_MODES:
            raise ValueError(f"guard(slow=...): expected one of {', '.join(SLOW_MODES)}, got {self.slow!r}")
        if not self.slow_window > 0:
            raise ValueError(f"guard(slow_window=...): expected seconds > 0, got {self.slow_window!r}")
        if self.verify_first < 0 or self.verify_every < 1 or not 0 <= self.verify_budget < 1:
            raise ValueError("guard(verify_first=..., verify_every=..., verify_budget=...): expected verify_first >= 0, "
                             "verify_every >= 1 and 0 <= verify_budget < 1")
        return self


def settings_from_env(env: dict[str, str] | None = None, **given: Any) -> GuardSettings:
    """Arguments given > DISTDOCTOR_HANG_TIMEOUT / _REPORT_DIR / _GUARD_VERIFY / _GUARD_ON_HANG / _GUARD_SLOW /
    _GUARD_SLOW_WINDOW > defaults."""
    env = dict(os.environ if env is None else env)
    values: dict[str, Any] = {}
    for key, name, parse in (("DISTDOCTOR_HANG_TIMEOUT", "hang_timeout", float),
                             ("DISTDOCTOR_REPORT_DIR", "report_dir", str),
                             ("DISTDOCTOR_GUARD_VERIFY", "verify", str), ("DISTDOCTOR_GUARD_ON_HANG", "on_hang", str),
                             ("DISTDOCTOR_GUARD_SLOW", "slow", str), ("DISTDOCTOR_GUARD_SLOW_WINDOW", "slow_window", float)):
        if env.get(key):
            try:
                values[name] = parse(env[key])
            except ValueError:
                raise ValueError(f"environment variable {key}: expected a number, got {env[key]!r}") from None
    values.update({k: v for k, v in given.items() if v is not None})
    return replace(GuardSettings(), **values).check()


def active() -> "Guard | None":
    return _ACTIVE


def guard(*, verify: str | None = None, hang_timeout: float | None = None, on_hang: str | None = None,
          report_dir: str | os.PathLike | None = None, verify_first: int | None = None,
          verify_every: int | None = None, verify_budget: float | None = None,
          ring_size: int | None = None, slow: str | None = None, slow_window: float | None = None) -> "Guard":
    """Turn the guard on in this process (after init_process_group); returns the Guard.

    Calling it again replaces the settings of the running guard. Arguments left None come from
    the environment (DISTDOCTOR_HANG_TIMEOUT, DISTDOCTOR_REPORT_DIR, ...) or the defaults.
    """
    global _ACTIVE
    settings = settings_from_env(verify=verify, hang_timeout=hang_timeout, on_hang=on_hang,
                                 report_dir=str(report_dir) if report_dir is not None else None,
                                 verify_first=verify_first, verify_every=verify_every,
                                 verify_budget=verify_budget, ring_size=ring_size, slow=slow, slow_window=slow_window)
    import torch.distributed as dist  # torch is imported on first use: it costs seconds, and `import distdoctor` must stay cheap

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("distdoctor.guard() needs an initialized process group: call it after "
                           "init_process_group (or use distdoctor.init_process_group(..., guard=True))")
    if _ACTIVE is not None and not _ACTIVE.shut_down:
        _ACTIVE.apply(settings)
        return _ACTIVE
    if _ACTIVE is not None:  # its group was destroyed and a new one created: a fresh guard for it
        _ACTIVE.stop()
        _ACTIVE = None
    from distdoctor.embedded.guard.process import Guard  # the embedded modules import torch; loaded only on this path

    _GENERATION[0] += 1
    _ACTIVE = Guard(settings).start(_GENERATION[0])
    return _ACTIVE


def unguard() -> None:
    """Turn the guard off: torch's functions are restored, the threads stop."""
    global _ACTIVE
    if _ACTIVE is not None:
        _ACTIVE.stop()
        _ACTIVE = None
