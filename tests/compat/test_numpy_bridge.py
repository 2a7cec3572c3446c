"""torch's bridge to NumPy: the fact is read by trying it, and a broken one is named as the versions' clash."""

from __future__ import annotations

import pytest

from distdoctor.checks import backend
from distdoctor.machine.torch_facts import read_numpy_bridge, read_torch_info
from tests.checks.test_local_checks import CPU_TORCH, findings

torch = pytest.importorskip("torch")


def test_this_environments_bridge_is_read_and_works():
    bridge = read_torch_info()["numpy"]
    numpy = pytest.importorskip("numpy")
    assert bridge == {"version": numpy.__version__, "works": True}


def test_a_bridge_that_raises_is_read_as_broken():
    class Torch1x:  # what torch 2.1's from_numpy does with NumPy 2 installed (measured on 2.1.2 + NumPy 2.4)
        @staticmethod
        def from_numpy(array):
            raise RuntimeError("Numpy is not available")

    bridge = read_numpy_bridge(Torch1x)
    assert bridge["works"] is False and bridge["error"] == "RuntimeError: Numpy is not available"


def test_a_broken_bridge_is_backend_E008_and_a_working_or_absent_one_is_silent():
    broken = {**CPU_TORCH, "torch": "2.1.2+cu121",
              "numpy": {"version": "2.4.6", "works": False, "error": "RuntimeError: Numpy is not available"}}
    found = findings(backend.numpy_bridge, torch=broken)
    assert [(f.id, f.cause) for f in found] == [("backend.E008", "version_incompat")]
    assert "torch 2.1.2+cu121 cannot use NumPy 2.4.6" in found[0].title and "numpy<2" in found[0].remediation
    for fine in ({"version": "2.4.6", "works": True}, None):
        assert findings(backend.numpy_bridge, torch={**CPU_TORCH, "numpy": fine}) == []
