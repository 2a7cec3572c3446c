"""--help shows defaults, list never truncates, show renders and knows checks, reports carry versions."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess

import pytest

from tests.conftest import REPO, distdoctor_cmd, slack_s


@pytest.fixture
def env(clean_env):
    return {**os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1"}


def run(args, env, bound=120, **extra):
    return subprocess.run(distdoctor_cmd(*args), capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=bound, **extra)


def test_help_shows_the_defaults(env):
    proc = run(["check", "--help"], {**env, "COLUMNS": "100"})
    assert proc.returncode == 0
    text = re.sub(r"[│\s]+", " ", proc.stdout)
    for default in ("[default: 60s]", "[default: 10s]", "[default: error]", "[default: rich]"):
        assert default in text, default


def test_list_piped_prints_every_id_whole(env):
    proc = run(["list"], {**env, "COLUMNS": "80"})
    assert proc.returncode == 0
    assert "…" not in proc.stdout
    listed = run(["list", "--format", "json"], env)
    data = json.loads(listed.stdout)
    words = set(proc.stdout.split())
    for kind in data["findings"]:
        assert kind["id"] in words
    for check in data["checks"]:
        assert check["name"] in words


def test_list_table_on_a_narrow_terminal_keeps_ids_whole():
    from rich.console import Console

    from distdoctor.cli import print_table

    buffer = io.StringIO()
    console = Console(file=buffer, width=80, force_terminal=True, color_system=None)
    rows = [("collective.broadcast_consistency", "collective", "collective,gloo", "coll.E003, " * 8),
            ("agreement.seeded_tensors_agree", "collective", "agreement", "spec.E001")]
    print_table(console, "Checks", ("check", "stage", "tags", "emits"), rows)
    out = buffer.getvalue()
    assert "…" not in out
    assert "collective.broadcast_consistency" in out and "agreement.seeded_tensors_agree" in out


def test_show_accepts_a_check_name(env):
    proc = run(["show", "network.rendezvous_port"], env)
    assert proc.returncode == 0, proc.stderr
    assert "# network.rendezvous_port" in proc.stdout and "## net.E011" in proc.stdout


def test_show_unknown_name_is_a_usage_error_with_suggestions(env):
    proc = run(["show", "netwrk.rendezvous_port"], env)
    assert proc.returncode == 2
    assert "unknown finding ID or check name" in proc.stderr and "network.rendezvous_port" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_show_renders_markdown_on_a_terminal(env):
    import pty

    master, slave = pty.openpty()
    proc = subprocess.Popen(distdoctor_cmd("show", "core.E004"), stdout=slave, stderr=slave,
                            env={**env, "TERM": "xterm", "COLUMNS": "100"}, cwd=REPO)
    os.close(slave)
    seen = b""
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:
            break
        if not data:
            break
        seen += data
    proc.wait(timeout=120)
    os.close(master)
    text = seen.decode(errors="replace")
    assert proc.returncode == 0
    assert "core.E004" in text
    assert "## core.E004" not in text and "**Severity:**" not in text  # rendered, not raw


def test_reports_and_env_carry_versions_host_and_time(env, startup_s):
    proc = run(["check", "--stage", "local", "--format", "json"], env, 60 + slack_s(startup_s))
    about = json.loads(proc.stdout)["about"]
    assert set(about) == {"distdoctor", "python", "torch", "cuda", "nccl", "host", "time_utc"}
    assert about["torch"] and about["python"] and about["host"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", about["time_utc"])
    markdown = run(["check", "--stage", "local", "--format", "markdown"], env, 60 + slack_s(startup_s)).stdout
    assert f"torch {about['torch']}" in markdown and "distdoctor " in markdown
    snapshot = json.loads(run(["env", "--format", "json"], env, 60 + slack_s(startup_s)).stdout)
    assert snapshot["distdoctor"] == about["distdoctor"] and snapshot["time_utc"].endswith("Z")
    assert snapshot["torch"]["torch"] == about["torch"] and "nccl" in snapshot["torch"]
