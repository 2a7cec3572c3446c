"""`distdoctor explain` as users run it: formats, exit codes, bad input -> exit 2 without traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from distdoctor.cli import app

FIXTURES = Path(__file__).resolve().parent / "fixtures"
runner = CliRunner()


def invoke(*args: str, input: bytes | None = None):
    return runner.invoke(app, ["explain", *args], input=input)


def test_json_output_and_exit_code():
    result = invoke(str(FIXTURES / "torchrun_sigkill.log"), "--format", "json")
    assert result.exit_code == 1, result.output
    data = json.loads(result.stdout)
    assert data["schema"] == "distdoctor.report/1"
    assert data["findings"][0]["cause"] == "oom_killed_rank"
    assert data["findings"][0]["confidence"] >= 0.8


def test_fail_level_critical_exits_zero_for_errors():
    result = invoke(str(FIXTURES / "port_in_use.log"), "--fail-level", "critical", "--format", "json")
    assert result.exit_code == 0


def test_stdin_and_markdown():
    text = (FIXTURES / "env_missing.log").read_bytes()
    result = invoke("-", "--format", "markdown", input=text)
    assert result.exit_code == 1
    assert "`env_missing`" in result.stdout and "log.E001" in result.stdout


def test_rich_output_to_file(tmp_path):
    out = tmp_path / "report.txt"
    result = invoke(str(FIXTURES / "monitored_barrier.log"), "--output", str(out), "--verbose")
    assert result.exit_code == 1
    text = out.read_text()
    assert "straggler_rank" in text and "Rank 1 did not reach the monitored barrier" in text
    assert "read " in text  # --verbose lists the files read


def _bad_inputs(tmp_path: Path) -> dict[str, tuple[str, str]]:
    (tmp_path / "empty.log").write_bytes(b"")
    (tmp_path / "blank.log").write_bytes(b"\n  \n")
    (tmp_path / "binary.log").write_bytes(bytes(range(256)) * 64)
    (tmp_path / "latin1.log").write_bytes("Fehler: Verbindung zurückgesetzt, Größe überschritten\n".encode("latin-1") * 20)
    (tmp_path / "adir").mkdir()
    return {
        "missing": (str(tmp_path / "nope.log"), "no such file"),
        "directory": (str(tmp_path / "adir"), "is a directory"),
        "empty": (str(tmp_path / "empty.log"), "is empty"),
        "blank": (str(tmp_path / "blank.log"), "is empty"),
        "binary": (str(tmp_path / "binary.log"), "binary"),
        "latin1": (str(tmp_path / "latin1.log"), "not UTF-8"),
    }


@pytest.mark.parametrize("case", ["missing", "directory", "empty", "blank", "binary", "latin1"])
def test_bad_input_exits_2_with_a_clear_message(tmp_path, case):
    path, message = _bad_inputs(tmp_path)[case]
    result = invoke(path)
    assert result.exit_code == 2, result.output
    assert message in result.stderr and path in result.stderr
    assert "Traceback" not in result.output
    assert result.stdout == ""


def test_bad_input_through_the_real_command_line(tmp_path):
    path, _ = _bad_inputs(tmp_path)["binary"]
    proc = subprocess.run([sys.executable, "-m", "distdoctor", "explain", path], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith("distdoctor: error:") and "Traceback" not in proc.stderr
    empty = subprocess.run([sys.executable, "-m", "distdoctor", "explain", "-"], input="", capture_output=True,
                           text=True, timeout=60)
    assert empty.returncode == 2 and "<stdin>: is empty" in empty.stderr


def test_no_file_at_all_is_a_usage_error():
    assert invoke().exit_code == 2
