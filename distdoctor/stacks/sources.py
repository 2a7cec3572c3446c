"""Whether a rank's own script wraps its model in DistributedDataParallel, read from its source files."""

# py-spy --locals shows the variables of function frames; a training loop written at module level
# (most short scripts and tutorials) has none it can read, so the DistributedDataParallel model
# stays unseen and an idle backward cannot be told from a custom autograd wait. The rank's own
# source files on its stack are then the evidence: a script that names DistributedDataParallel
# wraps its model in it (diagnosis.waits.file_names_ddp: only the user's files are read, each at
# most 1 MiB, once per modification time).

from __future__ import annotations

from typing import Iterable

from distdoctor.diagnosis.frames import display_path
# The file rule is shared with the guard, which reads its own main thread's stack.
from distdoctor.diagnosis.waits import file_names_ddp
from distdoctor.stacks.snapshots import python_frames

__all__ = ["file_names_ddp", "source_names_ddp"]


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
