"""SIGINT and SIGTERM sent by PID to a real distdoctor: a partial report (or one line), exit 130 / 143."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
import time

import pytest

from tests.conftest import REPO, distdoctor_cmd, slack_s


@pytest.fixture
def env(clean_env):
    return {**os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1"}


def wait_for_file(path, proc, bound):
    until = time.monotonic() + bound
    while time.monotonic() < until:
        if path.exists() and path.read_text():
            return
        if proc.poll() is not None:
            raise AssertionError(f"distdoctor ended early: {proc.communicate()}")
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"{path} never appeared: {proc.communicate()}")


def interrupt(proc, signum, bound):
    proc.send_signal(signum)
    try:
        out, err = proc.communicate(timeout=bound)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"still running {bound}s after the signal: {proc.communicate()}")
    return out, err


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_in_a_world_prints_the_partial_report(env, tmp_path, startup_s, signum, code):
    mark = tmp_path / "hanging"
    env = {**env, "DISTDOCTOR_TESTING": "1", "DISTDOCTOR_TEST_HANG": "1:gather",
           "DISTDOCTOR_TEST_HANG_FILE": str(mark)}
    proc = subprocess.Popen(distdoctor_cmd("check", "--timeout", "120", "--format", "json"), env=env,
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_file(mark, proc, 60 + slack_s(startup_s, 4))
    out, err = interrupt(proc, signum, 10 + slack_s(startup_s))
    assert proc.returncode == code, (out, err)
    report = json.loads(out)
    assert report["status"] == "incomplete"
    (cut,) = [f for f in report["findings"] if f["id"] == "core.E006"]
    assert cut["data"]["stage"] == "collective" and signal.Signals(signum).name in cut["title"]
    assert "Traceback" not in err


def test_signal_in_a_local_run_names_the_stage_and_check(env, tmp_path, startup_s):
    mark = tmp_path / "started"
    plugins = tmp_path / "checks"
    plugins.mkdir()
    (plugins / "slow.py").write_text(textwrap.dedent(f"""
        import os
        import time
        from distdoctor import check

        @check(stage="local")
        def slow_probe(ctx):
            open({str(mark)!r}, "w").write(str(os.getpid()))
            time.sleep(120)
    """))
    proc = subprocess.Popen(distdoctor_cmd("check", "--stage", "local", "--checks-dir", str(plugins),
                                           "--timeout", "300", "--check-timeout", "200"),
                            env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_file(mark, proc, 60 + slack_s(startup_s, 4))
    out, err = interrupt(proc, signal.SIGTERM, 10 + slack_s(startup_s))
    assert proc.returncode == 143, (out, err)
    assert "interrupted by SIGTERM in the local stage" in err and "slow_probe" in err
    assert "Traceback" not in err
    # The site check ran in a forked child (sleeping 120 s): it did not outlive the run.
    import psutil

    checker = int(mark.read_text())
    until = time.monotonic() + 5
    while True:
        try:
            if psutil.Process(checker).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        assert time.monotonic() < until, f"the check's process {checker} outlived the run"
        time.sleep(0.1)


def test_signal_while_starting_is_one_line(env, startup_s):
    proc = subprocess.Popen(distdoctor_cmd("check", "--timeout", "120"), env=env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # Past Python's own start-up (a signal inside its `site` import is a fatal error of Python
    # itself), before the report: distdoctor is starting or importing torch.
    time.sleep(1.0)
    out, err = interrupt(proc, signal.SIGINT, 15 + slack_s(startup_s, 3))
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in err + out
    assert "interrupted by SIGINT" in err or "interrupted by SIGINT" in out
