"""A real guarded job with a straggler leaves trace.json and report.html that open; a healthy job leaves neither."""

from __future__ import annotations

import json
import socket
import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "guard"))
from guard_torchrun import guarded_run, line_of  # noqa: E402  (the guard tests' launcher, shared)
from trace_format import problems  # noqa: E402

pytestmark = pytest.mark.multiproc

SCRIPT = textwrap.dedent("""\
    import sys
    import time
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DDP(nn.Linear(16, 4))
    slow = int(sys.argv[1])
    for step in range(40):
        if rank == slow and step == 10:
            time.sleep(8)  # a checkpoint written to slow storage  # LINE:late
        model(torch.randn(8, 16)).sum().backward()
        time.sleep(0.01)
    dist.destroy_process_group()
    """)


def late_line(script: Path) -> str:
    return f"train.py:{line_of(script, 'late').rsplit(':', 1)[1]}"  # stalls.json names the file as the rank ran it


@pytest.fixture(scope="module")
def straggler_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("pictures")
    script = root / "train.py"
    script.write_text(SCRIPT)
    result, _ = guarded_run(script, ["2"], root, "--hang-timeout", "5", nproc=4, timeout=240)
    return root, script, result


def test_the_run_leaves_its_pictures_and_each_rank_s_collectives(straggler_run):
    root, _, result = straggler_run
    assert result.returncode == 0, result.stdout[-3000:]
    assert "could not draw" not in result.stdout
    assert sorted(p.name for p in (root / "timeline").glob("rank*.json")) == [f"rank{r}.json" for r in range(4)]
    assert (root / "trace.json").is_file() and (root / "report.html").is_file()


def test_trace_json_shows_the_late_rank_at_its_line_and_every_collective_after_it(straggler_run):
    root, script, _ = straggler_run
    trace = json.loads((root / "trace.json").read_text())
    assert problems(trace) == []
    host = socket.gethostname()
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"}
    assert names == {r + 1: f"rank {r} on {host}" for r in range(4)}
    stalls = [e for e in trace["traceEvents"] if e.get("cat") == "stall" and e["ph"] == "X"]
    late = [e for e in stalls if e["args"]["role"] == "late"]
    assert [(e["pid"], e["args"]["where"], e["args"]["verdict"]) for e in late] == \
        [(3, late_line(script), "job.E002")]
    assert sorted(e["pid"] for e in stalls if e["args"]["role"] == "waiting") == [1, 2, 4]
    assert sorted(e["pid"] for e in trace["traceEvents"] if e["ph"] == "f") == [1, 2, 4]
    # The end-of-run collectives: every rank's trace runs to its last collective, the 29 steps after the stall's.
    for rank in range(4):
        seqs = [e["args"]["seq"] for e in trace["traceEvents"] if e.get("cat") == "collective" and e["pid"] == rank + 1]
        kept = json.loads((root / "timeline" / f"rank{rank}.json").read_text())["flight_recorder"]
        assert max(seqs) == int(kept["pg_status"]["0"]["last_enqueued_collective"])
        assert max(seqs) >= late[0]["args"]["seq"] + 29, (rank, max(seqs))


def test_report_html_opens_and_shows_the_late_rank_and_its_line(straggler_run, browser):
    root, script, _ = straggler_run
    page = browser.open(root / "report.html")
    assert page.errors() == []
    assert page.evaluate("document.querySelector('.late-label').lastChild.textContent") == \
        f"▲ rank 2 on {socket.gethostname()}"
    late = page.evaluate("[...document.querySelectorAll('rect[fill=\"#d32f2f\"] > title')].map(t => t.textContent)")
    assert len(late) == 1 and "rank 2 late" in late[0] and late_line(script) in late[0]


# extended: test_trace.py::test_chrome_s_devtools_trace_engine_reads_the_trace covers this path (the same writer and
# engine); this run's trace is checked by test_trace_json_shows_the_late_rank_at_its_line_and_every_collective_after_it
@pytest.mark.extended
def test_chrome_s_devtools_trace_engine_reads_the_run(straggler_run, browser):
    from chromium_page import devtools_model

    root, _, _ = straggler_run
    model = devtools_model(browser, (root / "trace.json").read_text())
    assert len(model["processes"]) == 4
    assert len(model["flows"]) == 3
    assert all(len(t["entries"]) >= 40 for t in model["threads"] if t["name"] == "collectives")


def test_a_healthy_run_draws_nothing(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    result, _ = guarded_run(script, ["-1"], tmp_path, "--hang-timeout", "5", nproc=2, timeout=180)
    assert result.returncode == 0, result.stdout[-3000:]
    assert not (tmp_path / "trace.json").exists() and not (tmp_path / "report.html").exists()
    assert not (tmp_path / "timeline").exists()


def test_without_the_recorder_the_picture_says_what_it_lacks(tmp_path, browser):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    result, _ = guarded_run(script, ["1"], tmp_path, "--hang-timeout", "5", nproc=2, timeout=180,
                            env={"TORCH_FR_BUFFER_SIZE": "0"})
    assert result.returncode == 0, result.stdout[-3000:]
    trace = json.loads((tmp_path / "trace.json").read_text())
    assert problems(trace) == []
    assert [e["pid"] for e in trace["traceEvents"] if e.get("cat") == "stall" and e["ph"] == "X"
            and e["args"]["role"] == "late"] == [2]
    assert not [e for e in trace["traceEvents"] if e.get("cat") == "collective"]
    assert any("no flight-recorder dump" in x for x in trace["otherData"]["lacks"])
    page = browser.open(tmp_path / "report.html")
    assert page.errors() == []
    lacks = page.evaluate("[...document.querySelectorAll('.lacks li')].map(li => li.textContent)")
    assert any("collectives are not drawn" in x for x in lacks)
