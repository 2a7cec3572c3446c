"""The recipes in checks/ load through --checks-dir exactly as users load them, and work."""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_site_checks(tmp_path, **env):
    full_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), **env}
    proc = subprocess.run(
        [sys.executable, "-m", "distdoctor", "check", "--stage", "local", "--tag", "site",
         "--checks-dir", str(REPO / "checks"), "--format", "json"],
        env=full_env, cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def test_interface_and_filesystem_recipes_pass_when_satisfied(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    code, report = run_site_checks(tmp_path, DISTDOCTOR_SITE_IFACE="lo", DISTDOCTOR_SITE_SHARED_FS=str(shared))
    assert code == 0, report
    names = {c["name"]: c["status"] for c in report["checks"]}
    assert names == {"interface_up.data_plane_interface_up": "pass", "shared_fs_writable.shared_filesystem_writable": "pass"}
    assert not list(shared.iterdir()), "the probe file was left behind"


def test_recipes_report_a_missing_interface_and_filesystem(tmp_path):
    code, report = run_site_checks(
        tmp_path, DISTDOCTOR_SITE_IFACE="ib7", DISTDOCTOR_SITE_SHARED_FS=str(tmp_path / "not-mounted")
    )
    assert code == 1
    found = {f["id"]: f for f in report["findings"]}
    assert found["site.E001"]["cause"] == "wrong_interface" and "ib7" in found["site.E001"]["title"]
    assert found["site.E004"]["cause"] == "resource_limit"


def test_read_only_filesystem_is_reported(tmp_path):
    """A real read-only bind mount, in a private mount namespace so nothing outside changes."""
    import shutil

    import pytest

    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("a read-only bind mount needs root and unshare")
    shared = tmp_path / "ro"
    shared.mkdir()
    script = (
        f"mount --bind {shared} {shared} && mount -o remount,bind,ro {shared} && "
        f"exec {sys.executable} -m distdoctor check --stage local --tag site "
        f"--checks-dir {REPO / 'checks'} --format json"
    )
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path),
           "DISTDOCTOR_SITE_IFACE": "lo", "DISTDOCTOR_SITE_SHARED_FS": str(shared)}
    proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    if proc.returncode not in (0, 1):
        pytest.skip(f"could not make a read-only mount here: {proc.stderr.strip()[:200]}")
    report = json.loads(proc.stdout)
    (finding,) = [f for f in report["findings"] if f["id"] == "site.E005"]
    assert "Read-only file system" in finding["title"]
