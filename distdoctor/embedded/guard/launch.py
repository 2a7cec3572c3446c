"""The environment under which `distdoctor guard -- <command>` runs a launcher line."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

HOOK_DIR = Path(__file__).resolve().parent / "hook"


def guard_environment(env: Mapping[str, str], *, hang_timeout: float | None = None, report_dir: str | None = None,
                      verify: str | None = None, on_hang: str | None = None, slow: str | None = None,
                      slow_window: float | None = None) -> dict[str, str]:
    """``env`` plus the import hook first on PYTHONPATH, the guard's settings and the recorder's buffer.

    The settings are validated here (ValueError names the bad one), so a typo fails before the
    job starts rather than in every worker.
    """
    from distdoctor.embedded.guard import settings_from_env  # the embedded modules import torch; loaded only on this path
    from distdoctor.embedded.guard.flight import launch_environment  # loaded only on this path, like the line above

    out = dict(env)
    given = {"DISTDOCTOR_HANG_TIMEOUT": hang_timeout, "DISTDOCTOR_REPORT_DIR": report_dir,
             "DISTDOCTOR_GUARD_VERIFY": verify, "DISTDOCTOR_GUARD_ON_HANG": on_hang, "DISTDOCTOR_GUARD_SLOW": slow,
             "DISTDOCTOR_GUARD_SLOW_WINDOW": slow_window}
    out.update({k: str(v) for k, v in given.items() if v is not None})
    if out.get("DISTDOCTOR_REPORT_DIR"):
        out["DISTDOCTOR_REPORT_DIR"] = str(Path(out["DISTDOCTOR_REPORT_DIR"]).resolve())
    settings_from_env(out)
    package_root = str(Path(__file__).resolve().parents[3])
    paths = [str(HOOK_DIR), package_root] + [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p]
    out["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    out["DISTDOCTOR_GUARD"] = "1"
    # The flight recorder counts DDP's and FSDP's collectives: its buffer must be set before
    # init_process_group, so here, for every worker.
    note = launch_environment(out)
    if note:
        out["DISTDOCTOR_GUARD_FR_NOTE"] = note
    else:
        out.pop("DISTDOCTOR_GUARD_FR_NOTE", None)
    return out
