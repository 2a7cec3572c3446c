"""A real self-test world on a torch whose stores lack what torch 2.1 and 2.2 lack (Store.check is
removed from torch's class at interpreter start): the check-in works from the interfaces left,
and an interface no fallback can stand in for is said as such, never as an unreachable master."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.local_faults.conftest import REPO, base_env

TIMEOUT_S = 40


def world(tmp_path: Path, *removed: str) -> tuple[int, dict, str]:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import torch.distributed as d\n" + "".join(f"delattr(d.Store, {name!r})\n" for name in removed))
    env = base_env(PYTHONPATH=os.pathsep.join([str(site), str(REPO)]), NO_COLOR="1")
    done = subprocess.run([sys.executable, "-m", "distdoctor", "check", "--nproc", "2", "--format", "json",
                           "--timeout", str(TIMEOUT_S)], env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_S * 3)
    return done.returncode, json.loads(done.stdout), done.stderr


def test_a_store_without_check_still_forms_the_world(tmp_path):
    code, report, stderr = world(tmp_path, "check")
    assert code == 0, (report["findings"], stderr)
    assert report["world"]["ranks_reported"] == [0, 1] and report["status"] in ("ok", "warning")
    assert "Traceback" not in stderr


def test_a_store_interface_nothing_stands_in_for_is_not_the_network(tmp_path):
    code, report, stderr = world(tmp_path, "check", "compare_set")
    assert code == 1 and "Traceback" not in stderr
    causes = {f["id"]: f["cause"] for f in report["findings"]}
    assert "core.E007" in causes, report["findings"]
    assert "master_unreachable" not in causes.values() and "firewall" not in causes.values()
    lacking = next(f for f in report["findings"] if f["id"] == "core.E007")
    assert "compare_set" in lacking["detail"]


def test_a_torch_without_distributed_gets_the_local_report_not_a_world(tmp_path):
    """As a build without distributed support looks (is_available() False, no stores): the local
    stage names it, the cross-rank stages are skipped with that reason, no rank is started."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import torch.distributed as d\nd.is_available = lambda: False\n"
        "for name in ('TCPStore', 'PrefixStore', 'init_process_group', 'ProcessGroupGloo'):\n"
        "    delattr(d, name) if hasattr(d, name) else None\n")
    env = base_env(PYTHONPATH=os.pathsep.join([str(site), str(REPO)]), NO_COLOR="1")
    done = subprocess.run([sys.executable, "-m", "distdoctor", "check", "--format", "json", "--timeout", "30"],
                          env=env, capture_output=True, text=True, timeout=120)
    report = json.loads(done.stdout)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert [f["id"] for f in report["findings"]] == ["backend.C001"]
    skipped = [c for c in report["checks"] if c["stage"] in ("rendezvous", "collective")]
    assert skipped and all(c["status"] == "skip" for c in skipped)


def test_a_store_no_backend_can_serve_is_a_report_not_a_traceback(tmp_path):
    """Both of torch's store backends refuse the self-test's socket: one finding, the ranks ended."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import torch.distributed as d\nreal = d.TCPStore\n"
        "def refusing(*args, **kwargs):\n"
        "    if kwargs.get('master_listen_fd') is not None:\n"
        "        raise RuntimeError('The server socket has failed to listen on any local network address.')\n"
        "    return real(*args, **kwargs)\n"
        "d.TCPStore = refusing\n")
    env = base_env(PYTHONPATH=os.pathsep.join([str(site), str(REPO)]), NO_COLOR="1")
    done = subprocess.run([sys.executable, "-m", "distdoctor", "check", "--format", "json", "--timeout", "30"],
                          env=env, capture_output=True, text=True, timeout=120)
    report = json.loads(done.stdout)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert [(f["id"], f["check"]) for f in report["findings"]] == [("rdzv.C018", "selftest")]
    assert "failed to listen" in report["findings"][0]["detail"]
