"""`distdoctor stacks --watch` on a real job whose rank 1 pauses (a stall that forms and clears), and its rendering."""

from __future__ import annotations

import io
import json
import re
import signal
import subprocess
import sys
import threading

import pytest

from distdoctor.core.findings import Finding, Severity
from distdoctor.stacks.watch import Row, Screen
from distdoctor.stacks.watch_view import changes, table
from tests.stacks.stacks_jobs import child_env, distdoctor, hung_job, line_of

PAUSE_LINE = line_of("time.sleep(PAUSE_S)")
# The job pauses 10 s every 30 steps (~0.3 s each on an idle core, more under load): a pause, its
# stall named and cleared, fits in this many seconds of watching.
WATCH_S = 150.0


@pytest.fixture(scope="module")
def pausing(tmp_path_factory):
    """2 DDP ranks computing; rank 1 sleeps 10 s every 30 steps while rank 0 waits in backward."""
    with hung_job(tmp_path_factory.mktemp("pause"), "pause", 2) as job:
        yield job


def _watch(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "distdoctor", "stacks", "--watch", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=child_env(), stdin=subprocess.DEVNULL)


def _lines_until(stream, done, limit_s: float) -> list[str]:
    """Lines of a live view until done(lines), or limit_s (read on a thread: never blocks the test)."""
    lines: list[str] = []
    finished = threading.Event()

    def read() -> None:
        for line in stream:
            lines.append(line.rstrip("\n"))
            if done(lines):
                break
        finished.set()

    threading.Thread(target=read, daemon=True).start()
    finished.wait(limit_s)
    return list(lines)


def _verdicts(lines: list[str]) -> list[str]:
    return [line.split("verdict: ", 1)[1] for line in lines if " verdict: " in line]


def test_a_stall_forms_on_the_late_rank_and_clears_when_it_arrives_then_ctrl_c_leaves_the_report(pausing):
    watch = _watch("--interval", "0.5", "--format", "json", str(pausing.pid))
    try:
        def cleared(lines):
            seen = _verdicts(lines)
            late = next((i for i, v in enumerate(seen) if v.startswith("error job.E002")), None)
            return late is not None and any(v.startswith("info job.I001") for v in seen[late:])

        lines = _lines_until(watch.stderr, cleared, WATCH_S)  # the live view goes to stderr with --format json
        watch.send_signal(signal.SIGINT)
        out, err = watch.communicate(timeout=60)
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait(10)
    assert "Traceback" not in err, err
    seen = _verdicts(lines)
    late = next((v for v in seen if v.startswith("error job.E002")), None)
    assert late is not None, lines[-20:]
    assert f"Rank 1 has not arrived" in late and f"train.py:{PAUSE_LINE}" in late
    assert any(v.startswith("info job.I001 Running") for v in seen[seen.index(late):]), seen
    # Rank 1's row was highlighted while the stall stood.
    assert any("rank 1 (PID" in line and "[error]" in line for line in lines), lines[-20:]
    report = json.loads(out)
    assert report["data"]["stacks"]["watch"]["reads"] >= 6
    assert watch.returncode in (0, 1) and watch.returncode == (1 if report["status"] == "error" else 0)
    assert pausing.alive()


def test_a_reader_that_leaves_or_a_closed_terminal_ends_the_watch_cleanly(pausing, tmp_path):
    # Piped into `head -n 1`: the pipe closes after the first line.
    shell = subprocess.run(f"{sys.executable} -m distdoctor stacks --watch --interval 0.5 {pausing.pid} | head -n 1",
                           shell=True, capture_output=True, text=True, timeout=120, env=child_env())
    # The first line is rank 0's row, or (py-spy's first dump slower than the interval, on a busy host)
    # that the job's ranks were found and are being read -- never that no job was found.
    first = r"\d\d:\d\d:\d\d rank 0 \(PID|found 2 rank processes; reading their stacks for the first time"
    assert "Traceback" not in shell.stderr and re.match(first, shell.stdout), shell
    # SIGHUP (the terminal closed): the report still goes to --output.
    report_file = tmp_path / "report.json"
    watch = _watch("--interval", "0.5", "--format", "json", "--output", str(report_file), str(pausing.pid))
    _lines_until(watch.stderr, lambda lines: len(lines) >= 2, 60)
    watch.send_signal(signal.SIGHUP)
    _, err = watch.communicate(timeout=60)
    assert "Traceback" not in err
    assert json.loads(report_file.read_text())["schema"] == "distdoctor.report/1"
    assert pausing.alive()


def test_bad_intervals_are_usage_errors():
    for value in ("0", "-1", "0.05"):
        result = distdoctor("stacks", "--watch", "--interval", value)
        assert result.returncode == 2 and "--interval" in result.stderr and "Traceback" not in result.stderr
    assert distdoctor("stacks", "--watch", "--slurm-job", "1").returncode == 2


def _screen(t: float, rows: list[Row], verdicts: dict) -> Screen:
    return Screen(t, tuple(rows), verdicts, reads=4)


def test_changes_print_one_line_per_change_and_the_verdict_as_it_forms_and_clears():
    job = "127.0.0.1:29500"
    stall = Finding("job.E002", Severity.ERROR, "straggler_rank", "Rank 1 has not arrived at all_reduce", ranks=(1,))
    running = Finding("job.I001", Severity.INFO, "unknown", "Running: every rank moved between reads", ranks=(0, 1))
    moving = [Row(job, 0, "vm", 10, "computing", "moving", 95.0, "train.py:30"),
              Row(job, 1, "vm", 11, "computing", "moving", 90.0, "train.py:30")]
    first = _screen(0, moving, {job: (running,)})
    assert len(changes(None, first)) == 3
    # Still moving, other lines: nothing to say.
    again = _screen(1, [Row(job, 0, "vm", 10, "computing", "moving", 80.0, "train.py:31"), moving[1]], {job: (running,)})
    assert changes(first, again) == []
    stalled = _screen(2, [Row(job, 0, "vm", 10, "in `all_reduce` for 3 s", "in `all_reduce`", 0.0, "train.py:40"),
                          Row(job, 1, "vm", 11, "idle for 3 s", "idle", 0.0, "train.py:20", "error")], {job: (stall,)})
    lines = changes(again, stalled)
    assert len(lines) == 3 and lines[1].endswith("[error]") and "verdict: error job.E002" in lines[2]
    assert "verdict: info job.I001" in changes(stalled, first)[-1]


def test_a_job_found_but_not_read_yet_is_said_so_and_no_job_is_said_apart():
    assert changes(None, Screen(0, (), {}, reads=0, unread=2)) == [
        "found 2 rank processes; reading their stacks for the first time"]
    assert changes(None, Screen(0, (), {}, reads=0)) == [
        "no torch.distributed job found yet; looking again every few seconds"]
    # Once rows are read, the status line gives way to them.
    row = Row("j", 0, "vm", 10, "computing", "moving", 95.0, "train.py:30")
    assert not any("found" in line for line in changes(None, Screen(0, (row,), {}, reads=1, unread=1)))


def test_the_table_fits_a_narrow_or_resized_terminal_and_highlights_the_late_rank():
    from rich.console import Console

    rows = [Row("j", r, "node-a", 100 + r, "in `all_reduce` for 12 s", "in `all_reduce`", 0.0,
                "`loss.backward()` at train.py:43") for r in (0, 2, 3)]
    rows.insert(1, Row("j", 1, "node-a", 101, "idle for 12 s", "idle", 0.0, "`time.sleep(3600)` at train.py:39", "error"))
    stall = Finding("job.E002", Severity.ERROR, "straggler_rank", "Rank 1 has not arrived at all_reduce", ranks=(1,))
    for width in (200, 60, 20):
        buffer = io.StringIO()
        Console(file=buffer, width=width, force_terminal=True, color_system="standard").print(
            table(_screen(0, rows, {"j": (stall,)}), interval_s=2))
        text = buffer.getvalue()
        assert "job.E002" in text.replace("\n", "")
    assert "\x1b[1;31m" in text  # the late rank's row (and the verdict) in bold red
