"""A report reads the same at 4 and at 4,096 ranks: ranks as ranges by state and place, the odd rank named,
a bounded number of lines in every renderer; the JSON keeps every rank."""

# Synthetic jobs (snapshots as the guard, `stacks` or `explain` build them: 8 ranks per host, one odd
# rank) go through the one diagnosis and the renderers every way in uses. The bounds are fixed
# numbers, the same for 1,024 and 4,096 ranks.

from __future__ import annotations

import io
import json

import pytest

from distdoctor.core import rank_groups
from distdoctor.core.render import check_rows, make_console, render_json, render_markdown, render_rich
from distdoctor.core.report import WorldSummary, build_report
from distdoctor.diagnosis import progress
from distdoctor.diagnosis.diagnose import diagnose
from distdoctor.diagnosis.snapshot import Frame, GroupProgress, PendingOp, RaisedError, RankSnapshot
from distdoctor.stacks.job import JobView, judge

BACKWARD = Frame("train.py", 55, "main", "loss.backward()")
SLEEP = Frame("train.py", 41, "main", "time.sleep(3600)")
ALL_REDUCE = Frame("torch/distributed/distributed_c10d.py", 2950, "all_reduce")
ODD = 32
RICH_LINES, MARKDOWN_LINES, LINE_CHARS, MARKDOWN_ROW_CHARS = 16, 24, 400, 800


def host(rank: int) -> str:
    return f"node-{rank // 8:03d}"


def waiting(rank: int, seq: int = 12, sizes=((4,),), time: float | None = None) -> RankSnapshot:
    op = PendingOp("all_reduce", seq, sizes, ("Float",), "scheduled", 10.0)
    return RankSnapshot(rank, host=host(rank), status="running", where=BACKWARD, time=time, proc_state="S",
                        stack=(Frame("train.py", 60, "<module>"), BACKWARD, ALL_REDUCE),
                        groups=(GroupProgress("0", (), seq, seq - 1, op),))


def idle(rank: int, time: float | None = None) -> RankSnapshot:
    return RankSnapshot(rank, host=host(rank), status="running", where=SLEEP, time=time, proc_state="S",
                        stack=(Frame("train.py", 60, "<module>"), SLEEP), groups=(GroupProgress("0", (), 11, 11),))


def job(case: str, size: int) -> list[RankSnapshot]:
    odd = {
        "straggler": idle(ODD),
        "missing": RankSnapshot(ODD, host=host(ODD), status="unreachable"),
        "left": RankSnapshot(ODD, host=host(ODD), status="finished", groups=(GroupProgress("0", (), 11, 11),)),
        "shape": waiting(ODD, sizes=((8,),)),
        "diverged": waiting(ODD, seq=13),
        "raised": RankSnapshot(ODD, host=host(ODD), status="raised", exit_code=1, time=100.0,
                               error=RaisedError("ValueError", "bad batch", SLEEP, 100.0)),
        "hang": waiting(ODD),
    }[case]
    if case == "raised":
        # Every peer's message names its own port: the same failure, but for numbers.
        return [odd if r == ODD else RankSnapshot(
            r, host=host(r), status="raised", exit_code=1, time=101.0,
            error=RaisedError("DistBackendError", f"Connection closed by peer [10.0.0.1]:{20000 + r}", None, 101.0,
                              consequence=True)) for r in range(size)]
    return [odd if r == ODD else waiting(r) for r in range(size)]


def rendered(report) -> tuple[str, str]:
    buffer = io.StringIO()
    render_rich(report, make_console(buffer))
    return buffer.getvalue(), render_markdown(report)


def assert_bounded(text: str, markdown: str) -> None:
    assert len(text.splitlines()) <= RICH_LINES, text
    assert len(markdown.splitlines()) <= MARKDOWN_LINES, markdown
    assert max(len(line) for line in text.splitlines()) <= LINE_CHARS
    # A Markdown table row holds a finding's title, where and fix on one line.
    assert max(len(line) for line in markdown.splitlines()) <= MARKDOWN_ROW_CHARS


CASES = ["straggler", "missing", "left", "shape", "diverged", "raised", "hang"]


@pytest.mark.parametrize("size, case", [(4096, c) for c in CASES] + [(1024, "straggler"), (1024, "raised")])
def test_a_stall_of_thousands_of_ranks_reads_like_a_small_one(size, case):
    findings = diagnose(job(case, size), world_size=size)
    assert len(findings) == 1
    finding = findings[0]
    report = build_report(findings, world=WorldSummary(size=size, launcher="stacks"))
    text, markdown = rendered(report)
    assert_bounded(text, markdown)
    if case == "hang":
        assert f"ranks 0-{size - 1} wait in all_reduce #12" in text and f"({size // 8} hosts)" in text
    else:
        assert finding.ranks == (ODD,) and f"ank {ODD}" in finding.title  # the odd rank, by name
        assert f"ranks 0-31, 33-{size - 1}" in text  # everyone else, as ranges
    # The JSON keeps every rank's state, compactly: ranges that cover the whole world.
    states = json.loads(render_json(report))["findings"][0]["data"]["states"]
    covered = sorted(r for pairs in states.values() for lo, hi in pairs for r in range(lo, hi + 1))
    assert covered == list(range(size))


def test_the_states_name_the_odd_rank_and_the_waiting_ranges():
    states = diagnose(job("straggler", 1024), world_size=1024)[0].data["states"]
    assert states["running, not in a collective at `time.sleep(3600)` at train.py:41"] == [[ODD, ODD]]
    waits = next(v for k, v in states.items() if k.startswith("waits in all_reduce #12"))
    assert waits == [[0, 31], [33, 1023]]


def looks(case: str, size: int) -> dict[int, list[RankSnapshot]]:
    """Three reads per rank over 1 s, as `stacks` makes them: a straggler, or every rank computing."""
    out = {}
    for rank in range(size):
        if case == "straggler":
            out[rank] = [(idle if rank == ODD else waiting)(rank, time=t) for t in (0.0, 0.5, 1.0)]
        else:
            line = Frame("train.py", 45 + (rank % 3), "main")
            out[rank] = [RankSnapshot(rank, host=host(rank), status="running", time=t, cpu_s=t * 0.9 + rank * 1e-4,
                                      proc_state="R", stack=(line,), where=line) for t in (0.0, 0.5, 1.0)]
    return out


@pytest.mark.parametrize("case", ["straggler", "running"])
def test_what_the_reads_prove_over_time_is_said_per_group_not_per_rank(case):
    judged = progress.judge(looks(case, 4096), world_size=4096)
    report = build_report(list(judged.findings), world=WorldSummary(size=4096, launcher="stacks"))
    text, markdown = rendered(report)
    assert_bounded(text, markdown)
    detail = judged.findings[0].detail
    assert len(detail.splitlines()) <= 12
    if case == "straggler":
        assert judged.outcome == progress.STALLED
        assert "ranks 0-31, 33-4095 stayed still in all_reduce #12" in detail
        assert f"rank {ODD} stayed still at train.py:41 across 3 reads" in detail
    else:
        assert judged.outcome == progress.RUNNING and "ranks 0-4095 moved between reads" in detail


def test_stacks_groups_at_scale_show_the_largest_and_the_odd_stacks():
    view = JobView("job", job("straggler", 4096), world_size=4096, whole=True)
    view.history = looks("straggler", 4096)
    found = judge(view)
    groups = next(f for f in found if f.id == "stacks.I002")
    assert groups.title == f"ranks 0-31, 33-4095 share one stack; rank {ODD} differs"
    assert len(groups.detail.splitlines()) <= 10
    assert [f.id for f in found] == ["job.E002", "stacks.I002"]
    text, markdown = rendered(build_report(found, world=WorldSummary(size=4096, launcher="stacks")))
    assert len(text.splitlines()) <= 2 * RICH_LINES and len(markdown.splitlines()) <= 2 * MARKDOWN_LINES


def test_many_ranges_are_cut_with_their_count_and_json_keeps_them_all():
    evens = list(range(0, 4096, 2))
    text = rank_groups.ranges_text(evens)
    assert text.startswith("0, 2, 4") and text.endswith("…, 4094 (2048 ranks)") and len(text) < 80
    assert rank_groups.as_ranges(evens) == [[r, r] for r in evens]
    assert rank_groups.ranges_text([0, 1, 2, 3, 5, 7, 8]) == "0-3, 5, 7-8"


def test_verbose_check_rows_fold_per_rank_reads_that_differ_only_in_numbers():
    checks = [{"name": f"read rank {r} (PID {1000 + r}) on {host(r)}, 3 times", "stage": "stacks", "status": "pass",
               "duration_s": 0.1} for r in range(4096)]
    checks.append({"name": "read rank 4096 (PID 9) on vm", "stage": "stacks", "status": "fail", "duration_s": 0.1,
                   "reason": "py-spy failed"})
    rows = check_rows(checks)
    assert [(c["status"], n) for c, n in rows] == [("pass", 4095), ("fail", 0)]
    assert check_rows(checks[:3]) == [(c, 0) for c in checks[:3]]  # a small job: one row per check


def test_a_finding_on_each_of_4096_ranks_is_folded_into_one_that_keeps_each_in_the_json():
    from distdoctor.checks.collective import WRONG_VALUES

    per_rank = [WRONG_VALUES(f"gloo all_reduce delivered wrong values on rank {r}", ranks=[r], hosts=[host(r)],
                             detail=f"sum of (rank+1) is [{r}], expected 8390656 everywhere", check="collective.all_reduce")
                for r in range(4096)]
    report = build_report(per_rank, world=WorldSummary(size=4096, launcher="mp_spawn"))
    (folded,) = report.findings
    assert folded.ranks == tuple(range(4096)) and "(and 4095 alike, on ranks 1-4095)" in folded.title
    assert len(folded.data["alike"]) == 4096 and folded.data["alike"][7]["ranks"] == [7]
    assert_bounded(*rendered(report))
    few = build_report(per_rank[:3], world=WorldSummary(size=3, launcher="mp_spawn"))
    assert len(few.findings) == 3  # a small world keeps one finding per rank


def test_a_list_over_its_budget_keeps_the_largest_group_and_the_odd_ones_and_counts_the_rest():
    groups = [(f"place {i}", [i]) for i in range(20)] + [("the many", list(range(20, 4096)))]
    said, rest = rank_groups.within_budget(groups, 8)
    assert ("the many", list(range(20, 4096))) in said and len(said) == 7
    assert len(rest) == 20 - 6
    lines = rank_groups.grouped_lines(groups, lambda key, ranks: f"{rank_groups.ranks_label(ranks)} at {key}")
    assert len(lines) == 8 and lines[-1].startswith("… and 14 more ranks (")


def test_texts_differing_only_in_numbers_are_one_group_only_when_many():
    say = lambda label, text, ranks: f"{label}: {text}"  # noqa: E731
    few = rank_groups.said_alike([(1, "+5.1s"), (3, "+7.2s")], say)
    assert few == ["rank 1: +5.1s", "rank 3: +7.2s"]  # a small list keeps each rank's own words
    many = rank_groups.said_alike([(r, f"+{r}.0s") for r in range(100)], say)
    assert many == ["ranks 0-99: +0.0s (rank 0's words; the others' differ only in numbers)"]
    assert rank_groups.where_text({"a": [0, 1], "b": [2]}) == "ranks 0-1 on a; rank 2 on b"
    assert rank_groups.where_text({f"n{i}": [i] for i in range(10)}) == "ranks 0-9 on 10 hosts (n0, n1, n2, …, n9)"
