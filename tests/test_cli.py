"""The CLI through typer's CliRunner (fast) and, for the never-a-traceback promises, as a process."""

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from distdoctor.cli import app

runner = CliRunner()
LOCAL = ["check", "--stage", "local"]


def invoke(args, env=None):
    return runner.invoke(app, args, env=env, catch_exceptions=False)


def test_version():
    result = invoke(["--version"])
    assert result.exit_code == 0 and result.stdout.startswith("distdoctor ")


def test_json_is_exactly_one_object_and_follows_the_contract(clean_env):
    result = invoke([*LOCAL, "--format", "json"])
    assert result.exit_code in (0, 1)
    report = json.loads(result.stdout)  # fails if anything else was printed to stdout
    assert report["schema"] == "distdoctor.report/1"
    assert set(report) >= {"schema", "status", "world", "findings", "checks", "duration_s"}
    assert report["status"] in ("ok", "warning", "error", "incomplete")
    assert all(c["stage"] == "local" for c in report["checks"])
    assert report["checks"], "no checks ran"


def test_garbage_env_gives_findings_and_exit_1(clean_env):
    env = {"RANK": "abc", "WORLD_SIZE": "-3", "MASTER_PORT": "70000", "MASTER_ADDR": ""}
    result = invoke([*LOCAL, "--format", "json"], env=env)
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    titles = " ".join(f["title"] for f in report["findings"] if f["cause"] == "env_invalid")
    for var in ("RANK", "WORLD_SIZE", "MASTER_PORT", "MASTER_ADDR"):
        assert var in titles


@pytest.mark.parametrize(
    "args, message",
    [
        ([*LOCAL, "--timeout", "soon"], "Invalid value"),
        ([*LOCAL, "--fail-level", "fatal"], "--fail-level: unknown severity"),
        ([*LOCAL, "--format", "yaml"], "--format: expected one of"),
        ([*LOCAL, "--stage", "warmup"], "--stage: expected some of"),  # the flag typed, not the setting's name
        ([*LOCAL, "--checks-dir", "/nonexistent/dir"], "does not exist"),
        (["show", "net.E999"], "unknown finding ID"),
    ],
)
def test_usage_errors_exit_2_with_a_message(clean_env, args, message):
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output


def test_bad_env_config_names_the_variable(clean_env):
    result = runner.invoke(app, LOCAL, env={"DISTDOCTOR_TIMEOUT": "-5"})
    assert result.exit_code == 2
    assert "DISTDOCTOR_TIMEOUT" in result.output


def test_malformed_pyproject_table_is_a_usage_error(clean_env, tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text("[tool.distdoctor]\ntimeout = 'x'\n")
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, LOCAL)
    assert result.exit_code == 2
    assert "[tool.distdoctor] timeout" in result.output


def test_output_file_and_markdown(clean_env, tmp_path):
    out = tmp_path / "report.md"
    result = invoke([*LOCAL, "--format", "markdown", "--output", str(out)])
    assert result.exit_code in (0, 1)
    assert result.stdout == ""
    assert out.read_text().startswith("## ")


def test_unwritable_output_is_a_usage_error(clean_env, tmp_path):
    result = runner.invoke(app, [*LOCAL, "--output", str(tmp_path / "no" / "such" / "dir" / "r.txt")])
    assert result.exit_code == 2 and "cannot write" in result.output


def test_fail_level_and_silence(clean_env):
    env = {"RANK": "abc", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    assert invoke(LOCAL, env=env).exit_code == 1
    result = invoke([*LOCAL, "--silence", "launch.C002", "--fail-level", "critical"], env=env)
    assert "silenced (launch.C002)" in result.stdout
    assert invoke([*LOCAL, "--silence", "launch.*", "--fail-level", "critical"], env=env).exit_code == 0


def test_list_json_names_every_check_and_id():
    result = invoke(["list", "--format", "json"])
    data = json.loads(result.stdout)
    ids = {k["id"] for k in data["findings"]}
    assert {"core.W001", "launch.C001", "launch.C002"} <= ids
    # IDs emitted only by explain, preflight() and the bounded init are listed too.
    assert {i.split(".")[0] for i in ids} >= {"log", "pre", "init", "spec", "rdzv", "coll", "net"}
    assert all(set(k) >= {"id", "cause", "title", "severity"} for k in data["findings"])
    assert any(c["name"] == "launch.rendezvous_env" for c in data["checks"])


def test_show_prints_the_documentation():
    result = invoke(["show", "launch.C001"])
    assert result.exit_code == 0
    assert "env_missing" in result.stdout and "## launch.C001" in result.stdout


def test_env_snapshot_redacts_secrets(clean_env):
    env = {"NCCL_DEBUG": "INFO", "TORCH_HF_TOKEN": "hf_supersecret123", "MASTER_ADDR": "node-a"}
    result = invoke(["env", "--format", "json"], env=env)
    snapshot = json.loads(result.stdout)
    assert snapshot["env"]["NCCL_DEBUG"] == "INFO"
    assert snapshot["env"]["TORCH_HF_TOKEN"] == "<redacted>"
    assert "hf_supersecret123" not in result.stdout
    assert {"torch", "interfaces", "gpus", "launcher", "host"} <= set(snapshot)


def test_real_process_with_garbage_never_prints_a_traceback(tmp_path):
    """As a user runs it: a fresh interpreter, garbage everywhere, no traceback."""
    env = {
        "PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "RANK": "abc", "WORLD_SIZE": "-3",
        "MASTER_PORT": "70000", "MASTER_ADDR": "", "CUDA_VISIBLE_DEVICES": ",,x", "LOCAL_RANK": "zero",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "distdoctor", "check", "--stage", "local", "--format", "json"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 1
    assert json.loads(proc.stdout)["status"] == "error"


def test_a_later_command_in_the_same_process_gets_its_own_deadline(clean_env, monkeypatch):
    # The CLI module was imported long ago (a test session, an embedding program): a command run
    # now must not count that time against its --timeout (it exited 3, "cut off", in the suite).
    import time

    import distdoctor.cli as cli

    monkeypatch.setattr(cli, "STARTED", time.monotonic() - 10_000)
    monkeypatch.setattr(cli, "_first_command", [False])  # as in-process (CliRunner) runs are
    result = invoke([*LOCAL, "--timeout", "60"])
    assert result.exit_code in (0, 1), result.output
