"""Fixtures of the picture tests: one headless Chromium per module (skipped where none is installed)."""

from __future__ import annotations

import pytest

from chromium_page import Browser, chromium_binary


@pytest.fixture(scope="module")
def browser():
    binary = chromium_binary()
    if binary is None:
        pytest.skip("no Chromium on this machine (.ci/install-launchers installs Debian's chromium)")
    started = Browser(binary, timeout=60.0)
    try:
        yield started
    finally:
        started.close()
