"""Which frame of a stack is the job's own code, and frames read from `file:line in function` text."""

# A stack says where a rank is; what the user needs is the innermost line of *their* code
# (`loss.backward()` at train.py:42), not torch's autograd engine or the stdlib's selectors. A
# frame is the user's unless its file lies in the standard library, in an installed package
# (site-packages / dist-packages: torch, numpy, the data loader's libraries), in distdoctor
# itself, or is synthetic (`<frozen ...>`, `<string>`). Paths are compared as text, so frames
# read from another process (py-spy) or another host (a log) are judged the same way.

from __future__ import annotations

import linecache
import os
import re
import sysconfig
from functools import lru_cache
from typing import Iterable

from distdoctor.diagnosis.snapshot import Frame

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_INSTALLED = re.compile(r"[/\\](site|dist)-packages[/\\]")
# Another interpreter's standard library (a path from py-spy or from a log of another machine).
_STDLIB = re.compile(r"[/\\]lib[/\\]python\d(\.\d+)?[/\\]")
# A path that names torch's own tree even outside site-packages (a source checkout, a log from
# another machine): .../torch/distributed/..., .../torch/nn/...
_TORCH_TREE = re.compile(r"(^|[/\\])torch[/\\](distributed|nn|autograd|utils|_dynamo|_tensor|multiprocessing|cuda|_ops|optim|__init__)")
_FRAME_TEXT = re.compile(r"^\s*(?P<file>.+?):(?P<line>\d+)(?: in (?P<function>.+?))?\s*$")


@lru_cache(maxsize=1)
def _library_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    dirs = {paths.get("stdlib"), paths.get("platstdlib"), paths.get("purelib"), paths.get("platlib"), _PACKAGE_DIR}
    return tuple(sorted(os.path.abspath(d) + os.sep for d in dirs if d))


def is_user_file(path: str) -> bool:
    """False for the stdlib, installed packages, torch's tree, distdoctor and synthetic files."""
    if not path or path.startswith("<") or path.startswith("???"):
        return False
    if _INSTALLED.search(path) or _STDLIB.search(path) or _TORCH_TREE.search(path):
        return False
    absolute = os.path.abspath(path) if not os.path.isabs(path) else path
    return not absolute.startswith(_library_dirs())


def user_frame(stack: Iterable[Frame]) -> Frame | None:
    """The innermost frame of the user's code in a stack given innermost last."""
    for frame in reversed(list(stack)):
        if is_user_file(frame.file):
            return frame
    return None


def with_source(frame: Frame) -> Frame:
    """The frame with its source line filled in when the file is readable here."""
    if frame.code or frame.line is None:
        return frame
    try:
        code = linecache.getline(frame.file, frame.line).strip()
    except Exception:  # an unreadable file, a path from another host: the frame stays as it is
        code = ""
    return Frame(frame.file, frame.line, frame.function, code[:300]) if code else frame


def display_path(filename: str) -> str:
    """A path relative to the working directory when it lies under it, else as given."""
    try:
        relative = os.path.relpath(filename)
    except ValueError:
        return filename
    return filename if relative.startswith("..") else relative


def parse_frame(text: str) -> Frame | None:
    """`train.py:42 in train` (the guard's stack lines) -> Frame; None for anything else."""
    match = _FRAME_TEXT.match(text or "")
    if not match:
        return None
    return Frame(match["file"], int(match["line"]), match["function"] or "")
