"""Whether a rank's own script wraps its model in DistributedDataParallel, read from its source files."""

# py-spy --locals shows the variables of function frames; a training loop written at module level
# (most short scripts and tutorials) has none it can read, so the DistributedDataParallel model
# stays unseen and an idle backward cannot be told from a custom autograd wait. The rank's own
# source files on its stack are then the evidence: a script that names DistributedDataParallel
# wraps its model in it. Only the user's files (not torch's, not installed packages) are read, each
# at most _MAX_BYTES, once per modification time.

from __future__ import annotations

import os
import re
from functools import lru_cache
from typing import Iterable

from distdoctor.diagnosis.frames import display_path, is_user_file
from distdoctor.stacks.snapshots import python_frames

_MAX_BYTES = 1 << 20
_DDP_NAME = re.compile(rb"\bDistributedDataParallel\b")


@lru_cache(maxsize=256)
def _names_ddp(path: str, mtime_ns: int) -> bool:
    try:
        with open(path, "rb") as fh:
            return bool(_DDP_NAME.search(fh.read(_MAX_BYTES)))
    except OSError:
        return False


def file_names_ddp(path: str) -> bool:
    """True when the file (the user's, readable here) names DistributedDataParallel."""
    if not is_user_file(path):
        return False
    try:
        return _names_ddp(path, os.stat(path).st_mtime_ns)
    except OSError:
        return False


def source_names_ddp(reads: Iterable) -> str:
    """How the rank's script is known to use DDP ("" when its files do not say): the first of its
    main thread's user files that names DistributedDataParallel."""
    for read in reads:
        if read.main is None:
            continue
        for frame in python_frames(read.main, read.cwd):
            if file_names_ddp(frame.file):
                return f"its script {display_path(frame.file)} wraps a model in DistributedDataParallel"
    return ""
