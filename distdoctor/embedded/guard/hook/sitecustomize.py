"""`distdoctor guard -- <launcher line>`: turns the runtime guard on in every worker, unmodified."""

# This directory is put first on PYTHONPATH, so Python imports this module at start-up in the
# launcher and in every worker. With DISTDOCTOR_GUARD=1 it wraps
# torch.distributed.init_process_group as soon as torch defines it: the group is created exactly
# as the script asks, then distdoctor.guard() starts (settings from DISTDOCTOR_HANG_TIMEOUT,
# DISTDOCTOR_REPORT_DIR, ...). A sitecustomize that this directory shadows is run afterwards.

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from typing import Any

TARGET = "torch.distributed.distributed_c10d"
HERE = os.path.dirname(os.path.abspath(__file__))


def _start_guard() -> None:
    try:
        from distdoctor.embedded.guard import guard  # the embedded modules import torch; loaded only on this path

        guard()
    except Exception as exc:  # the job runs as it would without the guard, and says so
        sys.stderr.write(f"distdoctor guard: not started in this process: {type(exc).__name__}: {exc}\n")


def _patch(module: Any) -> None:
    original = getattr(module, "init_process_group", None)
    if original is None or getattr(original, "__distdoctor_hook__", False):
        return

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        _start_guard()
        return result

    init_process_group.__distdoctor_hook__ = True  # type: ignore[attr-defined]
    module.init_process_group = init_process_group


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def create_module(self, spec: Any) -> Any:
        return self.inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.inner.exec_module(module)
        # torch/distributed/__init__ re-exports with `from .distributed_c10d import *` right
        # after this, so patching the module here patches torch.distributed too.
        _patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


def _chain() -> None:
    """Run the sitecustomize this one shadows (a distribution's or a virtualenv's), if any."""
    for entry in sys.path:
        if os.path.abspath(entry or ".") == HERE:
            continue
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", [entry])
        if spec is not None and spec.loader is not None:
            module = importlib.util.module_from_spec(spec)
            try:
                spec.loader.exec_module(module)
            except Exception as exc:
                sys.stderr.write(f"distdoctor guard: the shadowed sitecustomize ({spec.origin}) failed: {exc}\n")
            return


def _install() -> None:
    if os.environ.get("DISTDOCTOR_GUARD", "") in ("", "0"):
        return
    if TARGET in sys.modules:
        _patch(sys.modules[TARGET])
    else:
        sys.meta_path.insert(0, _Finder())


_install()
_chain()
