"""A torch that cannot be imported, crashes or hangs on import: the local stage reads torch's facts
in a child process, so it reports the fault instead of dying with it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from distdoctor.__main__ import needs_torch_facts_only
from distdoctor.machine.torch_facts import CANNOT_IMPORT, import_failed, parse_answer
from tests.conftest import deadline_bound, distdoctor_cmd
from tests.local_faults.conftest import REPO, base_env, check_local

# The body of each fake torch package's __init__.py.
SEGFAULT = "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n"
MISSING_LIBRARY = 'raise ImportError("libcudnn.so.9: cannot open shared object file: No such file or directory")\n'
HANG = 'import os, time\nopen(os.environ["FAKE_TORCH_PIDFILE"], "w").write(str(os.getpid()))\ntime.sleep(600)\n'


def fake_torch(tmp_path: Path, body: str) -> dict[str, str]:
    """An environment whose `import torch` runs ``body`` (PYTHONPATH puts it before the real one)."""
    package = tmp_path / "fake" / "torch"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(body)
    return base_env(PYTHONPATH=os.pathsep.join([str(tmp_path / "fake"), str(REPO)]), NO_COLOR="1",
                    FAKE_TORCH_PIDFILE=str(tmp_path / "torch.pid"))


def wait_gone(pid: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        if Path(f"/proc/{pid}/stat").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
            return True  # ended; only its exit status waits for a reaper
        time.sleep(0.1)
    return False


def test_a_healthy_torch_is_read_in_the_child():
    outcome = check_local(base_env(NO_COLOR="1"))
    import torch

    assert outcome.returncode == 0, outcome.report["findings"]
    assert outcome.report["about"]["torch"] == torch.__version__
    assert next(c for c in outcome.report["checks"] if c["name"] == "backend.backend_available")["status"] == "pass"


def test_a_torch_that_crashes_on_import_is_a_critical_not_a_dead_diagnosis(tmp_path):
    # In this process the segfault would end distdoctor with no report; in the child it is a finding.
    outcome = check_local(fake_torch(tmp_path, SEGFAULT))
    broken = outcome.findings(id="backend.C006")
    assert outcome.returncode == 1 and broken, outcome.report["findings"]
    assert "SIGSEGV" in broken[0]["title"] and "system library" in broken[0]["detail"]
    assert outcome.report["about"]["torch"] is None


def test_a_torch_missing_a_library_names_the_library(tmp_path):
    outcome = check_local(fake_torch(tmp_path, MISSING_LIBRARY))
    (broken,) = outcome.findings(id="backend.C006")
    assert "libcudnn.so.9: cannot open shared object file" in broken["title"], broken
    assert "system library" not in broken["detail"]


def test_a_torch_that_hangs_on_import_ends_at_the_deadline_and_the_child_with_it(tmp_path):
    env = fake_torch(tmp_path, HANG)
    timeout = 5
    start = time.monotonic()
    proc = subprocess.run(distdoctor_cmd("check", "--stage", "local", "--format", "json", "--timeout", str(timeout)),
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=deadline_bound(timeout) + 30)
    elapsed = time.monotonic() - start
    report = json.loads(proc.stdout)
    assert proc.returncode == 3 and report["status"] == "incomplete", (proc.stdout, proc.stderr)
    assert {f["id"] for f in report["findings"]} >= {"core.E004", "core.W003"}
    assert elapsed < deadline_bound(timeout), f"took {elapsed:.1f}s"
    child = int((tmp_path / "torch.pid").read_text())
    assert wait_gone(child, 10), f"the child importing torch (PID {child}) outlived distdoctor"


def test_the_child_ends_when_distdoctor_is_killed(tmp_path):
    env = fake_torch(tmp_path, HANG)
    parent = subprocess.Popen(distdoctor_cmd("check", "--stage", "local", "--timeout", "120"), env=env, cwd=REPO,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pidfile = tmp_path / "torch.pid"
    try:
        deadline = time.monotonic() + deadline_bound(30)
        while not pidfile.exists() or not pidfile.read_text():
            assert time.monotonic() < deadline and parent.poll() is None, "the child never imported torch"
            time.sleep(0.05)
    finally:
        parent.send_signal(signal.SIGKILL)  # no atexit, no handler: only the child's own watch is left
        parent.wait(timeout=30)
    child = int(pidfile.read_text())
    assert wait_gone(child, 10), f"the child importing torch (PID {child}) outlived a killed distdoctor"


@pytest.mark.parametrize("argv, expected", [
    (["check", "--stage", "local"], True),
    (["check", "-s", "local", "--format", "json"], True),
    (["check", "--stage=local"], True),
    (["check", "--timeout", "5", "--", "torchrun", "--nproc-per-node", "2", "train.py"], True),
    (["env"], True),
    (["check"], False),  # the self-test world imports torch in this process
    (["check", "--stage", "local", "--stage", "collective"], False),
    (["check", "--stage", "local,rendezvous"], False),
    (["check", "--stage", "local", "--help"], False),
    (["explain", "job.log"], False),
    ([], False),
])
def test_which_command_lines_start_the_child(argv, expected):
    assert needs_torch_facts_only(argv) is expected


def test_the_childs_answer_or_its_failure():
    assert parse_answer(0, b'{"torch_info": {"torch": "2.13.0"}}', b"")["torch_info"] == {"torch": "2.13.0"}
    crashed = parse_answer(-signal.SIGSEGV, b"", b"Fatal Python error: Segmentation fault\n")
    reason = crashed["gpus"]["unknown"]
    assert reason.startswith(CANNOT_IMPORT) and "SIGSEGV" in reason and "Segmentation fault" in reason
    assert import_failed(reason)
    silent = parse_answer(0, b"", b"")["torch_info"]["unknown"]
    assert not import_failed(silent)
    assert import_failed("ModuleNotFoundError: No module named 'torch'")
    assert not import_failed("torch_info did not answer within 5s")


def test_a_fact_missing_from_the_childs_answer_is_unknown(monkeypatch):
    from distdoctor.machine import torch_facts
    from distdoctor.machine.probes import Probes, Unknown

    class Answered:
        def facts(self):
            return {"torch_info": {"torch": "2.13.0"}}

    monkeypatch.setattr(torch_facts, "_prefetched", Answered())
    assert Probes().torch_info() == {"torch": "2.13.0"}
    gpus = Probes().gpus()
    assert isinstance(gpus, Unknown) and "gave no gpus" in gpus.reason
