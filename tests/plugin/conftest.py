"""Helpers for the plugin tests: pytester runs in subprocesses, and a scan for leftover ranks."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest


@pytest.fixture
def rank_tmp(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A TMPDIR for the run under test: rank processes carry it in their spec path, so we can find them."""
    tmp = pytester.path / "ranktmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    return tmp


@pytest.fixture
def leftovers():
    """processes_under, as a fixture (test modules here are not a package)."""
    return processes_under


def processes_under(directory: Path) -> list[int]:
    """PIDs of live processes whose command line mentions the directory (rank processes)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if any(str(directory) in part for part in proc.info["cmdline"] or ()):
                found.append(proc.info["pid"])
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found
