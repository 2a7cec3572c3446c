"""What the rest of the environment makes of this torch: NumPy's bridge (tried) and torchvision's
requirement (its metadata); a clash is named as the versions' clash, never as the user's code."""

from __future__ import annotations

import pytest

from distdoctor.checks import backend
from distdoctor.machine.torch_facts import read_numpy_bridge, read_torch_info, read_torchvision, satisfies
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


def installed_torchvision(tmp_path, monkeypatch, version: str, requirement: str) -> None:
    site = tmp_path / "site"
    (site / "torchvision").mkdir(parents=True)
    (site / "torchvision" / "__init__.py").write_text("raise ImportError('never imported')\n")
    info = site / f"torchvision-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torchvision\nVersion: {version}\n"
                                   f"Requires-Dist: numpy\nRequires-Dist: {requirement}\n"
                                   "Requires-Dist: scipy ; extra == 'scipy'\n")
    monkeypatch.syspath_prepend(str(site))


@pytest.mark.parametrize("requirement, torch_version, ok", [
    ("torch (>=2.14.0)", "2.4.1+cu121", False),   # torchvision 0.29's wheel, on torch 2.4 (measured)
    ("torch (>=2.14.0)", "2.14.1", True),
    ("torch==2.1.2", "2.1.2+cu121", True),        # the older wheels pin the exact release
    ("torch==2.1.2", "2.4.1", False),
])
def test_torchvisions_requirement_is_read_without_importing_it(tmp_path, monkeypatch, requirement, torch_version, ok):
    installed_torchvision(tmp_path, monkeypatch, "0.29.1", requirement)
    vision = read_torchvision(torch_version)
    assert vision["version"] == "0.29.1" and vision["satisfied"] is ok


def test_a_torchvision_for_another_torch_is_backend_W009():
    mismatched = {**CPU_TORCH, "torch": "2.4.1+cu121",
                  "torchvision": {"version": "0.29.1", "requires": "torch>=2.14.0", "satisfied": False}}
    found = findings(backend.torchvision_matches, torch=mismatched)
    assert [(f.id, f.cause) for f in found] == [("backend.W009", "version_incompat")]
    assert "torchvision 0.29.1 requires torch>=2.14.0; this is torch 2.4.1+cu121" == found[0].title
    for fine in (None, {"version": "0.19.1", "requires": "torch==2.4.1", "satisfied": True},
                 {"version": None, "requires": None, "satisfied": None}):
        assert findings(backend.torchvision_matches, torch={**CPU_TORCH, "torchvision": fine}) == []


@pytest.mark.parametrize("version, spec, expected", [
    ("2.4.1", "==2.4.1", True), ("2.4.1+cu121", "==2.4.1", True), ("2.4.1", ">=2.14.0", False),
    ("2.14.1", ">=2.14.0,<3", True), ("2.4.1", "==2.4.*", True), ("2.5.0", "==2.4.*", False),
    ("2.4", "==2.4.0", True), ("2.4.1", "~=2.4.0", True), ("2.5.0", "~=2.4.0", False), ("2.4.1", "=== 2", None),
])
def test_satisfies(version, spec, expected):
    assert satisfies(version, spec) is expected
