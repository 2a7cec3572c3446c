"""The live status line: on a terminal's stderr only, cleared before the report, silenced by --quiet."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import time

import pytest

from tests.conftest import REPO, distdoctor_cmd, slack_s


@pytest.fixture
def env(clean_env):
    env = {**os.environ, "PYTHONPATH": str(REPO), "TERM": "xterm-256color", "COLUMNS": "160"}
    env.pop("NO_COLOR", None)
    return env


def run_with_terminal_stderr(args, env, bound):
    """distdoctor with stderr on a pseudo-terminal and stdout on a pipe: (code, stdout, terminal)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(distdoctor_cmd(*args), stdout=subprocess.PIPE, stderr=slave, env=env, cwd=REPO)
    os.close(slave)
    seen = b""
    until = time.monotonic() + bound
    while time.monotonic() < until:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # the other side closed: the process ended
                break
            if not data:
                break
            seen += data
        elif proc.poll() is not None:
            break
    os.close(master)
    try:
        out, _ = proc.communicate(timeout=max(until - time.monotonic(), 1))
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return proc.returncode, out.decode(), seen.decode(errors="replace")


def test_status_line_on_a_terminal_names_stage_ranks_and_deadline(env, startup_s):
    code, out, terminal = run_with_terminal_stderr(["check", "--timeout", "40"], env, 40 + slack_s(startup_s))
    assert code == 0, (out, terminal)
    assert "distdoctor: " in terminal
    assert "stage" in terminal and "/ 40s" in terminal
    assert "ranks 2/2" in terminal  # rank 0 counted the check-ins
    # Transient: the line is erased at the end (cursor shown again, the line cleared).
    assert terminal.rstrip().endswith("\x1b[2K")
    assert "OK:" in out and "distdoctor:" not in out


@pytest.mark.parametrize("extra", [["--quiet"], ["--format", "json"]])
def test_no_status_line_when_quiet_or_json(env, startup_s, extra):
    code, out, terminal = run_with_terminal_stderr(["check", "--stage", "local", *extra], env,
                                                   60 + slack_s(startup_s))
    assert code in (0, 1), (out, terminal)
    assert "distdoctor: " not in terminal


def test_nothing_on_stderr_when_it_is_not_a_terminal(clean_env, startup_s):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(distdoctor_cmd("check", "--stage", "local"), capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=60 + slack_s(startup_s))
    assert proc.returncode in (0, 1)
    assert proc.stderr == ""


def test_describe_reads_stage_ranks_and_deadline():
    from distdoctor.core.progress import RunProgress

    progress = RunProgress()
    progress.start(100.0, 60.0)
    progress.set_stage("rendezvous")
    progress.set_ranks(3, 8)
    line = progress.describe(clock=lambda: 102.5)
    assert line == "rendezvous stage · ranks 3/8 checked in · 2.5s / 60s"
