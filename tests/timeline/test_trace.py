"""trace.json from report directories of every shape: valid Trace Event Format, bounded, honest about what it lacks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from distdoctor.timeline.material import read_material
from distdoctor.timeline.trace import MAX_COLLECTIVE_SPANS, MAX_WAITING_DRAWN, build_trace
from report_dirs import T0, entry, dump, snapshot, stall, steady_dumps, write_dir, write_end_collectives
from trace_format import problems

REPO = Path(__file__).resolve().parents[2]


def events(trace, **match):
    return [e for e in trace["traceEvents"] if all(e.get(k) == v for k, v in match.items())]


def test_a_straggler_is_one_late_span_with_its_line_and_arrows_to_the_ranks_it_held_up(tmp_path):
    root = write_dir(tmp_path / "R", ranks=4, stalls=[stall(1, 2, [0, 1, 3], 1.0, 4.5)],
                     dumps=steady_dumps(4, 40, gap=(10, 4.5)))
    trace = build_trace(read_material([root]))
    assert problems(trace) == []
    names = {e["pid"]: e["args"]["name"] for e in events(trace, ph="M", name="process_name")}
    assert names == {1: "rank 0 on node-a", 2: "rank 1 on node-a", 3: "rank 2 on node-a", 4: "rank 3 on node-a"}
    late = [e for e in events(trace, cat="stall", ph="X") if e["args"]["role"] == "late"]
    assert [(e["pid"], e["args"]["where"], e["args"]["verdict"]) for e in late] == [(3, "train.py:14", "job.E002")]
    assert "train.py:14" in late[0]["name"] and late[0]["dur"] == pytest.approx(4.5e6)
    waiting = [e for e in events(trace, cat="stall", ph="X") if e["args"]["role"] == "waiting"]
    assert sorted(e["pid"] for e in waiting) == [1, 2, 4]
    starts, ends = events(trace, ph="s"), events(trace, ph="f")
    assert {e["pid"] for e in starts} == {3} and sorted(e["pid"] for e in ends) == [1, 2, 4]
    collectives = events(trace, cat="collective")
    assert len(collectives) == 4 * 40
    held = [e for e in collectives if e["pid"] == 1 and e["name"] == "all_reduce #10"][0]
    assert held["dur"] == pytest.approx(4.6e6) and held["args"]["end"] == "next call"
    assert held["args"]["sizes"] == "[4680]" and held["args"]["dtypes"] == "Float"


def test_the_recorder_s_own_completion_times_are_used_where_it_has_them(tmp_path):
    items = [entry(1, T0, time_discovered_started_ns=int((T0 + 0.01) * 1e9),
                   time_discovered_completed_ns=int((T0 + 0.25) * 1e9), state="completed"),
             entry(2, T0 + 1.0, duration_ms=30.0, time_discovered_started_ns=int((T0 + 1.1) * 1e9)),
             entry(3, T0 + 2.0, retired=False)]
    root = write_dir(tmp_path / "R", ranks=1, stalls=[], dumps={0: dump(items, 2)}, pickled=False)
    trace = build_trace(read_material([root]))
    assert problems(trace) == []
    spans = {e["name"]: e for e in events(trace, cat="collective")}
    assert spans["all_reduce #1"]["dur"] == pytest.approx(250_000) and spans["all_reduce #1"]["args"]["end"] == "recorded"
    assert spans["all_reduce #2"]["ts"] == pytest.approx(1e6) and spans["all_reduce #2"]["dur"] == pytest.approx(130_000)
    assert spans["all_reduce #2"]["args"]["end"] == "duration"
    assert spans["all_reduce #3"]["args"]["end"] == "pending at the dump"  # seq 3 > last completed 2


def test_a_rank_s_end_of_run_collectives_replace_its_stall_time_dump(tmp_path):
    # The stall-time dump holds calls 1-20; the end of the run left the newest, 15-40 (the ring moved on).
    root = write_dir(tmp_path / "R", ranks=2, stalls=[stall(1, 1, [0], 0.5, 1.0)], dumps=steady_dumps(2, 20))
    end = steady_dumps(1, 40)[0]
    write_end_collectives(root, 1, {**end, "entries": end["entries"][14:]})
    trace = build_trace(read_material([root]))
    assert problems(trace) == []
    seqs = {pid: sorted(e["args"]["seq"] for e in events(trace, cat="collective", pid=pid)) for pid in (1, 2)}
    assert seqs[1] == list(range(1, 21)) and seqs[2] == list(range(15, 41))


def test_overlapping_calls_get_lanes_of_their_own(tmp_path):
    # NCCL's asynchronous calls: the next one is enqueued before the previous completes.
    items = [entry(seq, T0 + seq * 0.1, time_discovered_completed_ns=int((T0 + seq * 0.1 + 0.35) * 1e9))
             for seq in range(1, 9)]
    root = write_dir(tmp_path / "R", ranks=1, stalls=[], dumps={0: dump(items, 8)})
    trace = build_trace(read_material([root]))
    assert problems(trace) == []
    assert len({e["tid"] for e in events(trace, cat="collective")}) == 4


def test_a_stall_still_open_at_the_end_lasts_until_the_end_of_the_record(tmp_path):
    root = write_dir(tmp_path / "R", ranks=2, stalls=[stall(1, 1, [0], 2.0, 3.0), stall(2, 1, [0], 10.0, None)])
    trace = build_trace(read_material([root]))
    assert problems(trace) == []
    opened = [e for e in events(trace, cat="stall", ph="X") if e["args"]["episode"] == 2]
    assert opened and all(e["args"]["open"] for e in opened)


def test_faults_are_instants_on_their_rank(tmp_path):
    snaps = {1: snapshot(1, status="raised", error={"type": "ValueError", "message": "bad batch", "time": T0 + 3.0}),
             2: {**snapshot(2, status="killed"), "exit_code": -9}}
    root = write_dir(tmp_path / "R", ranks=3, stalls=[stall(1, 1, [0, 2], 1.0, 2.0)], snapshots=snaps)
    trace = build_trace(read_material([root]))
    assert problems(trace) == []
    faults = {e["pid"]: e for e in events(trace, cat="fault")}
    assert faults[2]["name"] == "raised: ValueError: bad batch" and faults[2]["s"] == "p"
    assert faults[3]["args"]["what"] == "kill"


def test_a_week_of_stalls_at_4096_ranks_stays_bounded(tmp_path):
    # What the guard leaves after 2,000 stalls at 4,096 ranks: the first 200 whole, the rest summed up.
    ranks = 4096
    kept = [stall(i, i % 7, [r for r in range(ranks) if r != i % 7], i * 3.0, 1.5) for i in range(1, 201)]
    summary = {"omitted": 1800, "seconds": 2700.0, "longest": {"episode": 977, "seconds": 9.5, "late_rank": 3},
               "note": "episodes after the first 200 are summarized here"}
    root = write_dir(tmp_path / "R", ranks=ranks, stalls=kept + [summary], dumps=steady_dumps(64, 2000, every_s=0.01))
    trace = build_trace(read_material([root]))
    assert problems(trace) == []
    assert len(events(trace, cat="stall", ph="X")) == 200 * (1 + MAX_WAITING_DRAWN)  # every stall is kept
    assert trace["otherData"]["stalls_summarized"] == 1800
    assert len(events(trace, cat="collective")) <= MAX_COLLECTIVE_SPANS
    assert len(json.dumps(trace)) < 100 << 20
    late = [e for e in events(trace, cat="stall", ph="X") if e["args"]["role"] == "late"][0]
    assert late["args"]["waiting_ranks"] == "0, 2-4095"  # the ranks not drawn are still named


def test_thousands_of_stalls_are_all_drawn(tmp_path):
    stalls = [stall(i, i % 3, [r for r in range(4) if r != i % 3], i * 2.0, 1.0) for i in range(1, 5001)]
    root = write_dir(tmp_path / "R", ranks=4, stalls=stalls)
    trace = build_trace(read_material([root]))
    assert problems(trace) == []
    assert len([e for e in events(trace, cat="stall", ph="X") if e["args"]["role"] == "late"]) == 5000


@pytest.mark.parametrize("damage", ["truncated stalls.json", "truncated pickle", "foreign pickle", "old stalls.json"])
def test_a_damaged_or_older_directory_gives_a_partial_picture_that_says_what_it_lacks(tmp_path, damage):
    root = write_dir(tmp_path / "R", ranks=2, stalls=[stall(1, 1, [0], 1.0, 2.0)], dumps=steady_dumps(2, 20))
    if damage == "truncated stalls.json":
        text = (root / "stalls.json").read_text()
        (root / "stalls.json").write_text(text[: len(text) // 2])
    elif damage == "truncated pickle":
        path = root / "flight_recorder" / "distdoctor_fr_rank_1"
        path.write_bytes(path.read_bytes()[:300])
    elif damage == "foreign pickle":
        # A pickle that would run code when loaded by pickle.load: refused, never run.
        (root / "flight_recorder" / "distdoctor_fr_rank_1").write_bytes(
            b"cos\nsystem\n(S'touch " + str(tmp_path / "ran").encode() + b"'\ntR.")
    else:  # 0.3's stalls.json had no started_at (and no late_rank for a whole-job hang)
        (root / "stalls.json").write_text(json.dumps([{"episode": 1, "where": "train.py:3", "seconds": 2.0}]))
    material = read_material([root])
    trace = build_trace(material)
    assert problems(trace) == []
    assert trace["otherData"]["lacks"], "the trace must say what it could not read"
    assert not (tmp_path / "ran").exists()
    assert events(trace, ph="M", name="process_name")  # the rest is still drawn


def test_the_trace_command_on_bad_input_says_so_and_exits_2(tmp_path):
    (tmp_path / "empty").mkdir()
    cases = [[str(tmp_path / "missing")], [str(tmp_path / "empty")]]
    for args in cases:
        done = subprocess.run([sys.executable, "-m", "distdoctor", "trace", *args], capture_output=True, text=True,
                              cwd=tmp_path, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, timeout=120)
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith("distdoctor: error:") and "Traceback" not in done.stderr


def test_the_trace_command_writes_into_the_directory_and_names_what_it_lacks(tmp_path):
    root = write_dir(tmp_path / "R", ranks=2, stalls=[stall(1, 1, [0], 1.0, 2.0)])  # no recorder dumps
    done = subprocess.run([sys.executable, "-m", "distdoctor", "trace", str(root), "--html", str(tmp_path / "r.html")],
                          capture_output=True, text=True, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert problems(json.loads((root / "trace.json").read_text())) == []
    assert "lacks: no flight-recorder dump" in done.stdout
    assert "no flight-recorder dump" in (tmp_path / "r.html").read_text()


def test_chrome_s_devtools_trace_engine_reads_the_trace(tmp_path, browser):
    from chromium_page import devtools_model

    root = write_dir(tmp_path / "R", ranks=3, stalls=[stall(1, 2, [0, 1], 1.0, 4.5)], dumps=steady_dumps(3, 30, gap=(10, 4.5)))
    model = devtools_model(browser, json.dumps(build_trace(read_material([root]))))
    assert sorted(model["processes"]) == [[1, "rank 0 on node-a"], [2, "rank 1 on node-a"], [3, "rank 2 on node-a"]]
    stalls = {t["pid"]: t["entries"] for t in model["threads"] if t["name"] == "stalls"}
    assert [e[0] for e in stalls[3]] == ["late 4.5 s at train.py:14 (job.E002)"]
    assert sum(len(t["entries"]) for t in model["threads"] if t["name"] == "collectives") == 90
    assert sorted(tuple(tuple(end[:2]) for end in flow) for flow in model["flows"]) == [((3, 1), (1, 1)), ((3, 1), (2, 1))]


def test_explain_reads_a_report_directory_the_same_with_its_pictures_beside_it(tmp_path):
    from distdoctor.timeline.html_run import run_page
    from distdoctor.explain import explain_files
    from distdoctor.timeline.job_report import job_report

    root = write_dir(tmp_path / "R", ranks=2, stalls=[stall(1, 1, [0], 1.0, 2.0, title="NCCL error: unhandled system error")],
                     dumps=steady_dumps(2, 20))
    before = [(f.id, f.title) for f in explain_files([str(root)]).findings]
    material = read_material([root])
    (root / "trace.json").write_text(json.dumps(build_trace(material)))
    (root / "report.html").write_text(run_page(job_report(material)))
    write_end_collectives(root, 0, steady_dumps(1, 30)[0])
    after = explain_files([str(root)])
    assert [(f.id, f.title) for f in after.findings] == before
    kinds = {c["name"].rsplit("/", 1)[-1]: c.get("reason", "") for c in after.checks}
    assert "distdoctor timeline (not read)" in kinds["trace.json"] and "HTML report (not read)" in kinds["report.html"]
