"""Runs last in tests/hosts (file order): every lab of this session was removed completely."""

from __future__ import annotations

import pytest

import netns

pytestmark = pytest.mark.hosts


def test_no_namespace_link_process_or_file_left_behind(netns_ready):
    assert netns.leftovers() == {"namespaces": [], "root_links": [], "dirs": [], "processes": []}
