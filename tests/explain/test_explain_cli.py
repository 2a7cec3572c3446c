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
    # SIGKILL without an OOM-killer line is not specific to the OOM killer (a scheduler's limit, kill -9).
    assert 0.5 <= data["findings"][0]["confidence"] < 0.8
    assert "resource_limit" in [c["cause"] for c in data["findings"][0]["data"]["candidates"]]


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
        "directory": (str(tmp_path / "adir"), "is an empty directory"),
        "binary": (str(tmp_path / "binary.log"), "binary"),
    }


@pytest.mark.parametrize("case", ["missing", "directory", "binary"])
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
    # An empty log is evidence (the process printed nothing), never a usage error.
    assert empty.returncode == 0 and "the log is empty" in empty.stdout and "Traceback" not in empty.stderr


@pytest.mark.parametrize("content", [b"", b"\n  \n"], ids=["empty", "blank"])
def test_an_empty_log_alone_is_a_warning_not_exit_2(tmp_path, content):
    path = tmp_path / "job.log"
    path.write_bytes(content)
    result = invoke(str(path), "--format", "json")
    assert result.exit_code == 0, result.output
    finding = json.loads(result.stdout)["findings"][0]
    assert finding["id"] == "log.W030" and "empty" in finding["title"]


def test_an_empty_rank_log_is_evidence(tmp_path):
    # What a hung rank leaves: an empty log; the other ranks timed out waiting for it.
    line = ("[rank{r}]:[E1218 20:27:21.426415540 ProcessGroupNCCL.cpp:629] [Rank {r}] Watchdog caught collective "
            "operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) "
            "ran for 600081 milliseconds before timing out.\n")
    for r in range(2):
        (tmp_path / f"rank{r}.log").write_text(line.format(r=r))
    (tmp_path / "rank2.log").write_bytes(b"")
    result = invoke(*sorted(str(p) for p in tmp_path.glob("*.log")), "--format", "json")
    assert result.exit_code == 1, result.output
    data = json.loads(result.stdout)
    top = data["findings"][0]
    assert top["cause"] == "rank_missing" and top["data"]["empty_logs"] == [2]
    assert len(data["findings"]) == 1
    assert 2 in data["world"]["ranks_reported"]


def test_only_empty_rank_logs_name_those_ranks(tmp_path):
    (tmp_path / "rank0.log").write_text("step 1 loss 0.5\nstep 2 loss 0.4\n")
    (tmp_path / "rank1.log").write_bytes(b"")
    result = invoke(str(tmp_path / "rank0.log"), str(tmp_path / "rank1.log"), "--format", "json")
    top = json.loads(result.stdout)["findings"][0]
    assert result.exit_code == 1 and top["cause"] == "rank_missing" and top["ranks"] == [1]


def test_a_fifo_is_refused_not_waited_on(tmp_path):
    import os

    fifo = tmp_path / "pipe.log"
    os.mkfifo(fifo)
    proc = subprocess.run([sys.executable, "-m", "distdoctor", "explain", str(fifo)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "not a regular file" in proc.stderr


def test_no_file_at_all_is_a_usage_error():
    assert invoke().exit_code == 2


@pytest.mark.parametrize("encoding", ["latin-1", "gbk", "utf-16", "utf-16-le"])
def test_a_log_in_another_encoding_is_read_and_says_so(tmp_path, encoding):
    """PowerShell's `>` writes UTF-16; a Chinese or German Windows console, GBK or latin-1: the English
    messages torch prints read exactly, the rest is replaced, never a refusal or a traceback."""
    text = ("Fehler beim Laden: Größe überschritten\n" if encoding == "latin-1" else "训练开始 第1轮\n") + (
        "Traceback (most recent call last):\n  File \"train.py\", line 9, in <module>\n"
        "RuntimeError: use_libuv was requested but PyTorch was build without libuv support\n")
    path = tmp_path / "job.log"
    path.write_bytes(text.replace("\n", "\r\n").encode(encoding) if encoding.startswith("utf-16") else text.encode(encoding))
    result = invoke(str(path), "--format", "json")
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert report["findings"][0]["cause"] == "backend_unavailable"
    reason = report["checks"][0]["reason"]
    assert ("UTF-16" in reason) if encoding.startswith("utf-16") else ("not UTF-8" in reason), reason


def test_verbose_lists_a_skipped_file_without_a_traceback(tmp_path):
    """--verbose renders every file's pseudo-check, the skipped ones too (they once lacked a duration)."""
    folder = tmp_path / "mixed"
    folder.mkdir()
    (folder / "core.bin").write_bytes(b"\x7fELF\x00\x00\x01" * 100)
    (folder / "notes.txt").write_bytes("Fehler: Größe überschritten\n".encode("latin-1"))
    (folder / "job.log").write_text("[rank1]: ValueError: bad batch\n")
    result = invoke(str(folder), "--verbose")
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output and "looks like binary data" in result.output
    assert "not UTF-8 text" in result.output  # read, with its bytes that are not UTF-8 replaced
