"""A job torchelastic restarted: its attempts read apart (real consoles of tests/explain/jobs/wrapped_job.py)."""

from __future__ import annotations

from pathlib import Path

from distdoctor.explain import explain_files, explain_text
from distdoctor.explain.attempts import Marks

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def _segments(text: str, block: int = 1 << 20) -> list[tuple[int, int, int]]:
    marks = Marks()
    lines = text.splitlines(keepends=True)
    chunk, first = [], 1
    for number, line in enumerate(lines, 1):
        chunk.append(line)
        if sum(map(len, chunk)) >= block:
            marks.block("".join(chunk), first)
            chunk, first = [], number + 1
    if chunk:
        marks.block("".join(chunk), first)
    return marks.segments(len(lines))


def test_the_console_is_cut_where_the_agent_said_the_attempt_failed_and_workers_went_on():
    text = (FIXTURES / "elastic_restart.log").read_text()
    segments = _segments(text)
    assert [n for n, _, _ in segments] == [0, 1]
    lines = text.splitlines()
    end_of_first = segments[0][2]
    assert "failed (exitcode: " in lines[end_of_first - 1]
    # The last attempt's failed line is followed by torchrun's own traceback and summary: no third attempt.
    assert "connectFullMesh" in "\n".join(lines[segments[1][1] - 1:])
    # Cut into small blocks (a boundary's follower in the next block), the same attempts.
    assert _segments(text, block=512) == segments


def test_info_level_boundaries_restart_count_and_will_restart():
    text = (FIXTURES / "elastic_restart_info.log").read_text()
    segments = _segments(text)
    assert [n for n, _, _ in segments] == [0, 1]
    assert "restart_count=1" in "\n".join(text.splitlines()[segments[1][1] - 1:segments[1][1] + 2])


def test_the_jobs_end_is_its_last_attempt_and_the_earlier_attempt_is_listed_with_its_own_cause():
    for report in (explain_files([str(FIXTURES / "elastic_restart.log")]),
                   explain_text((FIXTURES / "elastic_restart.log").read_text())):  # stdin: read again from its copy
        top = report.findings[0]
        assert top.data["attempt"] == 1 and top.cause != "worker_exception", (top.cause, top.title)
        assert "connectFullMesh" in top.detail and "Gloo could not connect" in top.title and top.ranks, top.ranks
        earlier = next(f for f in report.findings if f.id == "log.I041")
        first = earlier.data["attempts"][0]
        assert (first["cause"], first["ranks"]) == ("worker_exception", [1])
        assert "loss became NaN at step 2 on rank 1" in first["title"]


def test_a_restart_refused_on_one_host_is_a_peer_not_listening_never_the_interface():
    # A new user's job (make_fixtures.py elastic_restart_stale): torchrun --standalone, attempt 0's rank 1
    # raises KeyError, the restart's connectFullMesh is refused on 127.0.0.1 (attempt 0's stale address).
    report = explain_files([str(FIXTURES / "elastic_restart_stale.log")])
    top = report.findings[0]
    ranked = [c["cause"] for c in top.data["candidates"]]
    assert top.data["attempt"] == 1 and top.cause == "rank_missing" and top.confidence < 0.8, (top.cause, ranked)
    floor = {c["cause"]: c for c in top.data["candidates"]}
    for cause in ("wrong_interface", "firewall"):
        if cause in floor:  # one host: no network between hosts to fail
            assert floor[cause]["confidence"] <= 0.02 and ranked.index(cause) >= 2, ranked
            assert any("one host" in reason for reason in floor[cause]["reordered_by"])
    first = next(f for f in report.findings if f.id == "log.I041").data["attempts"][0]
    assert (first["cause"], first["ranks"]) == ("worker_exception", [1]) and "KeyError" in first["title"]


def test_a_restart_that_recovered_is_no_failure_and_a_job_without_restarts_has_no_attempts():
    report = explain_files([str(FIXTURES / "elastic_recovered.log")])
    assert report.findings[0].id == "log.W030" and "shows no failure" in report.findings[0].detail
    assert report.exit_code() == 0
    single = explain_files([str(FIXTURES / "torchrun_sigkill.log")])
    assert "attempt" not in single.findings[0].data and all(f.id != "log.I041" for f in single.findings)


def test_a_ranks_output_flushed_after_the_agents_last_failed_line_is_not_a_restart():
    # --tee's output of a rank the agent SIGTERMed can come after the agent's failed line: no attempt
    # follows unless it ends with another failed line or the job ends without torchrun's failure summary.
    text = (FIXTURES / "torchrun_sigkill.log").read_text()
    cut = text.index("\n", text.index("failed (exitcode")) + 1
    late = text[:cut] + "[default0]:[rank0]: a line of rank 0 flushed late\n" + text[cut:]
    report = explain_text(late)
    assert "attempt" not in report.findings[0].data and all(f.id != "log.I041" for f in report.findings)
    assert report.findings[0].cause == "oom_killed_rank"
