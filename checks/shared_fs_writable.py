"""Site check: the shared filesystem (checkpoints, datasets) must be mounted and writable.

Set the path in DISTDOCTOR_SITE_SHARED_FS (default /shared). The check writes and removes a
small probe file, bounded in time: a hung NFS mount shows up as "could not tell" instead of
hanging the run.
"""

from __future__ import annotations

import os
import uuid

from distdoctor import Unknown, call_with_deadline, check, finding_kind

DEFAULT_PATH = "/shared"
WRITE_TIMEOUT_S = 3.0

FS_MISSING = finding_kind(
    "site.E004",
    cause="resource_limit",
    title="The shared filesystem is not mounted",
    hint="Mount the shared filesystem on this node, or ask the cluster admins",
)
FS_READONLY = finding_kind(
    "site.E005",
    cause="resource_limit",
    title="The shared filesystem is not writable",
    hint="Fix the mount's permissions or remount it read-write",
)
FS_STALLED = finding_kind(
    "site.W006",
    cause="resource_limit",
    title="Could not tell whether the shared filesystem is writable: it did not answer",
    hint="Look for a hung network mount (stat the path, check `mount`)",
)


def _write_probe(path: str) -> None:
    probe = os.path.join(path, f".distdoctor-probe-{uuid.uuid4().hex}")
    with open(probe, "w", encoding="utf-8") as handle:
        handle.write("ok")
    os.remove(probe)


@check(stage="local", tags=("site", "filesystem"), emits=(FS_MISSING, FS_READONLY, FS_STALLED))
def shared_filesystem_writable(ctx):
    """The shared filesystem must be a mounted, writable directory."""
    path = ctx.env.get("DISTDOCTOR_SITE_SHARED_FS") or DEFAULT_PATH
    if not os.path.isdir(path):
        yield FS_MISSING(f"{path} is not a directory on this node", data={"path": path})
        return
    try:
        result = call_with_deadline(lambda: _write_probe(path), WRITE_TIMEOUT_S, f"write to {path}")
    except OSError as exc:
        yield FS_READONLY(
            f"{path} is not writable: {exc.strerror or exc}",
            remediation=f"Check the permissions and mount options of {path} (mount | grep {path})",
            data={"path": path, "error": str(exc)},
        )
        return
    if isinstance(result, Unknown):
        yield FS_STALLED(detail=str(result), data={"path": path})
