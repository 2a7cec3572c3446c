"""The slow-rank judgment over per-rank window documents: who the job waits for, the cost, where, why; and the bad inputs."""

from __future__ import annotations

import random

import pytest
from pace_docs import BACKWARD, DATA_INNER, EVAL, EVAL_INNER, FORWARD, LOOP, MAIN, noisy, window

from distdoctor.diagnosis.pace import from_doc, fraction_below, merge, quantile_ms, to_doc
from distdoctor.diagnosis.pace_judge import judge
from distdoctor.diagnosis.pace_watch import MAX_LINES, Watcher
from distdoctor.diagnosis.pace_where import parting_frame
from distdoctor.diagnosis.snapshot import Frame

STEP = 22.0
FLOOR = 0.3


def paces(docs: dict[int, dict]) -> dict:
    return {rank: from_doc(doc) for rank, doc in docs.items()}


def straggler_job(slow: int = 2, world: int = 4, cost_ms: float = 3.0, **slow_kwargs) -> dict:
    """Every rank but `slow` waits cost_ms above the transfer floor per step; `slow` waits at the floor."""
    docs = {}
    for rank in range(world):
        if rank == slow:
            docs[rank] = window(rank, noisy(FLOOR, seed=rank), STEP, host="node-b", **slow_kwargs)
        else:
            docs[rank] = window(rank, noisy(FLOOR + cost_ms, seed=rank), STEP)
    return docs


def only(verdict, *ids):
    found = [f for f in verdict.findings if f.id in ids]
    assert len(found) == 1, [(f.id, f.title) for f in verdict.findings]
    return found[0]


def test_the_rank_the_others_wait_for_is_named_with_its_cost_the_what_if_the_call_and_why():
    extra = {(tuple(MAIN), tuple(LOOP), tuple(DATA_INNER)): 0.003}
    verdict = judge(paces(straggler_job(extra=extra, blocked_extra=0.003 * 400)), world=4)
    finding = only(verdict, "slow.W001")
    data = finding.data
    assert finding.ranks == (2,) and finding.hosts == ("node-b",) and finding.cause == "straggler_rank"
    assert data["cost_ms_per_step"] == pytest.approx(3.0, abs=0.3)
    # The others' waits are tight (3 ms +- 0.3): without rank 2 each of their steps would be the whole 3 ms shorter.
    assert data["saved_ms_per_step"] == pytest.approx(data["cost_ms_per_step"], rel=0.03)
    assert data["speedup"] == pytest.approx(STEP / (STEP - data["saved_ms_per_step"]), rel=0.001)
    assert data["last_share"] > 0.9
    row = data["rows"][0]
    assert row["frame"][:2] == LOOP[:2] and row["inner"][:2] == DATA_INNER[:2] and row["data"] > 0.3
    assert data["family"] == "data loading"
    assert "Rank 2 on node-b makes every step wait: the other 3 ranks wait 3.0 ms per step" in finding.title
    assert "`x, y = next(batches)` train.py:40" in finding.detail and "DataLoader" in finding.remediation


def jittery_pair(extra_ms: float, jitter_ms: float, seed: int = 7) -> dict:
    """Two ranks whose arrivals differ each step by rank 1's extra plus their own jitter (normal, jitter_ms): the
    one that arrives first waits the difference above the floor, the other the floor."""
    rng = random.Random(seed)
    lead = [extra_ms + rng.gauss(0.0, jitter_ms) for _ in range(400)]
    return {0: window(0, [FLOOR + max(d, 0.0) for d in lead], STEP),
            1: window(1, [FLOOR + max(-d, 0.0) for d in lead], STEP, host="node-b")}, lead


@pytest.mark.parametrize("jitter_ms", [0.2, 2.0, 4.0])
def test_the_what_if_is_the_step_saved_not_the_wait_when_the_ranks_own_jitter_is_large(jitter_ms):
    # Without rank 1's 4 ms, the ranks still wait for each other's jitter, which rank 1 hid by arriving last: the
    # step saved is E[min(max(lead, 0), 4 ms)], less than the 4 ms rank 0 waits more (the cost), by more as the
    # jitter grows; with little jitter the two agree.
    docs, lead = jittery_pair(4.0, jitter_ms)
    finding = only(judge(paces(docs), world=2), "slow.W001")
    data = finding.data
    saved = sum(min(max(d, 0.0), 4.0) for d in lead) / len(lead)
    assert finding.ranks == (1,) and data["cost_ms_per_step"] == pytest.approx(4.0, rel=0.1)
    assert data["saved_ms_per_step"] == pytest.approx(saved, rel=0.1)
    assert data["saved_ms_per_step"] <= data["cost_ms_per_step"]
    assert f"a step would take {data['saved_ms_per_step']:.1f} ms less" in finding.title


def extra_at_backward(slow_loader_s: float, peers_loader_s: float | None) -> dict:
    """Rank 2 blocked 3 ms a step longer, its samples putting the time at its backward; its batches timed at
    ``slow_loader_s`` a step, its peers' at ``peers_loader_s`` (None: not timed)."""
    docs = straggler_job(extra={(tuple(MAIN), tuple(BACKWARD)): 0.003}, blocked_extra=0.003 * 400,
                         loader_s=slow_loader_s)
    for rank in (0, 1, 3):
        docs[rank]["profile"]["loader"] = None if peers_loader_s is None else {"s": peers_loader_s * 400, "calls": 400}
    return only(judge(paces(docs), world=4), "slow.W001")


def test_a_slower_batch_timed_is_data_loading_even_where_the_samples_put_the_extra_elsewhere():
    # The samples' error over a window is a few percent of the step: here they put rank 2's extra time at its
    # backward. Its batches, timed inside DataLoader next() on every rank, take 3 ms longer: data loading.
    finding = extra_at_backward(0.018, 0.015)
    assert finding.data["family"] == "data loading" and "DataLoader" in finding.remediation
    assert "its batches (DataLoader next()) take +3.0 ms per step, timed" in finding.detail


def test_batches_timed_alike_on_every_rank_leave_the_family_to_the_profile():
    finding = extra_at_backward(0.015, 0.015)
    assert finding.data["family"] == "I/O or a wait outside collectives" and "its batches" not in finding.detail
    assert extra_at_backward(0.018, None).data["family"] == "I/O or a wait outside collectives"  # peers not timed


def test_a_balanced_job_says_nothing():
    docs = {rank: window(rank, noisy(FLOOR + 0.4, seed=rank, spread_ms=0.4), STEP) for rank in range(4)}
    assert judge(paces(docs)).findings == []


def test_ranks_that_take_turns_are_the_spread_and_no_rank_is_named():
    # Each rank is the late one at a quarter of the steps: it waits at the floor then, 6 ms the other times.
    docs = {rank: window(rank, [FLOOR if step % 4 == rank else 6.0 for step in range(400)], STEP) for rank in range(4)}
    finding = only(judge(paces(docs)), "slow.W003")
    assert finding.ranks == () and "no one rank is behind" in finding.title
    assert not [f for f in judge(paces(docs)).findings if f.id in ("slow.W001", "slow.W002")]


def test_every_rank_contending_for_cores_blames_no_one():
    # 4 ranks on 2 cores: every rank runnable but not running 40-50 % of the time, waits alike.
    docs = {rank: window(rank, noisy(2.0, seed=rank, spread_ms=1.5), STEP, runq=0.45 + rank * 0.02) for rank in range(4)}
    finding = only(judge(paces(docs)), "slow.W004")
    assert finding.ranks == () and finding.cause == "cpu_oversubscription"


def test_a_rank_on_a_contended_core_is_named_with_cpu_contention():
    verdict = judge(paces(straggler_job(slow=1, world=2, runq=0.6)))
    finding = only(verdict, "slow.W002")
    assert finding.ranks == (1,) and finding.data["family"] == "cpu contention"
    assert "CPU contention" in finding.detail and "pin each rank" in finding.remediation


def test_a_clock_two_seconds_ahead_changes_nothing():
    docs = straggler_job()
    skewed = dict(docs)
    skewed[1] = {**docs[1], "t0": docs[1]["t0"] + 2.0, "t1": docs[1]["t1"] + 2.0}
    assert [f.to_dict() for f in judge(paces(docs)).findings] == [f.to_dict() for f in judge(paces(skewed)).findings]


def test_pipeline_stages_are_compared_within_their_groups_and_said_as_stages():
    # Stage 0 (ranks 0-1) and stage 1 (ranks 2-3) run different work: each group is balanced in itself, stage 1
    # waits in point-to-point receives for stage 0 a third of its time. No rank is a straggler.
    docs = {0: window(0, noisy(0.5, seed=0), 20.0, group="s0"), 1: window(1, noisy(0.5, seed=1), 20.0, group="s0"),
            2: window(2, noisy(0.4, seed=2), 30.0, group="s1", p2p_s=0.33),
            3: window(3, noisy(0.4, seed=3), 30.0, group="s1", p2p_s=0.33)}
    verdict = judge(paces(docs))
    assert [f.id for f in verdict.findings] == ["slow.I005"]
    assert verdict.findings[0].ranks == (2, 3) and "stage" in verdict.findings[0].title
    assert {g["group"] for g in verdict.groups} == {"s0", "s1"}


def test_very_short_steps_are_judged_on_their_own_scale():
    docs = {0: window(0, noisy(0.25, spread_ms=0.02, seed=0), 0.8), 1: window(1, noisy(0.05, spread_ms=0.02, seed=1), 0.8)}
    finding = only(judge(paces(docs)), "slow.W001", "slow.W002")
    assert finding.ranks == (1,) and finding.data["cost_ms_per_step"] == pytest.approx(0.2, abs=0.03)
    tiny = {0: window(0, noisy(0.06, spread_ms=0.01, seed=0), 0.8), 1: window(1, noisy(0.05, spread_ms=0.01, seed=1), 0.8)}
    assert not [f for f in judge(paces(tiny)).findings if f.ranks]  # 0.01 ms: under what a step can tell


def test_a_rank_not_heard_from_is_never_named():
    # Rank 3 published nothing: the three others wait alike (for it, maybe), and nobody is named.
    docs = {rank: window(rank, noisy(4.0, seed=rank), STEP) for rank in range(3)}
    verdict = judge(paces(docs), world=4)
    assert not [f for f in verdict.findings if 3 in f.ranks or f.id in ("slow.W001", "slow.W002")]


def test_a_line_only_the_slow_rank_runs_is_the_call_where_the_stacks_part():
    extra = {(tuple(MAIN), tuple(EVAL), tuple(EVAL_INNER)): 0.003}
    finding = only(judge(paces(straggler_job(slow=0, extra=extra))), "slow.W001")
    row = finding.data["rows"][0]
    assert row["frame"][:2] == EVAL[:2] and row["only_here"] and row["inner"][:2] == EVAL_INNER[:2]
    assert finding.data["family"] == "a line only this rank runs"


def test_a_line_seen_in_a_few_samples_of_the_slow_rank_only_is_not_said_to_be_its_own():
    # 0.75 ms a step at the eval line over 400 steps: 6 samples of the slow rank there, none of its peers'. Had they
    # spent a third of that there, 2 samples would be expected: none says little, and the row keeps its measured
    # times without saying that only this rank runs it (its twin above, 24 samples, says so).
    extra = {(tuple(MAIN), tuple(EVAL), tuple(EVAL_INNER)): 0.00075}
    finding = only(judge(paces(straggler_job(slow=0, extra=extra))), "slow.W001")
    rows = [r for r in finding.data["rows"] if r["frame"][:2] == EVAL[:2]]
    assert rows and rows[0]["peers_ms"] == 0.0 and not rows[0]["only_here"]
    assert finding.data["family"] != "a line only this rank runs"


READ_INNER = ["data.py", 10, "__getitem__", "time.sleep(READ_S)"]


def waited_under(doc: dict, path: list[list], samples: int = 40) -> dict:
    """The document with its waits for peers sampled under ``path`` (frames, outermost first)."""
    profile = doc["profile"]
    ids = []
    for frame in path:
        if frame not in profile["frames"]:
            profile["frames"].append(list(frame))
        ids.append(profile["frames"].index(frame))
    profile["waits"] = [[ids, samples]]
    return doc


def reading_job(waits: bool) -> dict:
    """Every rank spends 94 % of its time outside its waits in `next(batches)` (a 33 ms read, the step's compute
    fast), rank 2 4 ms a step longer inside it; the waits, sampled, are under the backward (when ``waits``)."""
    docs = {}
    for rank in range(4):
        extra = {(tuple(MAIN), tuple(LOOP), tuple(READ_INNER)): 0.033}
        if rank == 2:
            extra[(tuple(MAIN), tuple(LOOP), tuple(DATA_INNER))] = 0.004
        doc = window(rank, noisy(FLOOR if rank == 2 else FLOOR + 4.0, seed=rank), 40.0, extra=extra,
                     blocked_extra=0.037 * 400 if rank == 2 else 0.033 * 400)
        docs[rank] = waited_under(doc, [MAIN, BACKWARD]) if waits else doc
    return docs


def test_a_call_that_holds_most_of_every_ranks_time_but_no_wait_is_named_not_opened():
    # A fast machine: the reads are 94 % of each rank's time outside its waits. The step's frames are those the waits
    # are under (main(), its backward): `next(batches)` holds none, so it is the call named, the slower line inside.
    row = only(judge(paces(reading_job(waits=True)), world=4), "slow.W001").data["rows"][0]
    assert row["frame"][:2] == LOOP[:2] and row["inner"][:2] == DATA_INNER[:2], row


def test_a_frame_the_waits_are_under_is_opened_however_its_time_splits():
    # The twin: main() holds the waits (and nearly all the time): opened, its call below is named.
    docs = straggler_job(extra={(tuple(MAIN), tuple(LOOP), tuple(DATA_INNER)): 0.003}, blocked_extra=0.003 * 400)
    docs = {rank: waited_under(doc, [MAIN, BACKWARD]) for rank, doc in docs.items()}
    row = only(judge(paces(docs), world=4), "slow.W001").data["rows"][0]
    assert row["frame"][:2] == LOOP[:2] and row["inner"][:2] == DATA_INNER[:2], row
    # The waits travel with the documents, merged.
    back = from_doc(to_doc(merge(from_doc(docs[0]), from_doc(docs[0]))))
    assert back.wait_paths == {tuple(tuple(f[:3]) for f in (MAIN, BACKWARD)): 80}


def test_pythons_gc_is_named_from_the_collections_timing():
    extra = {(tuple(MAIN), tuple(FORWARD)): 0.003}
    finding = only(judge(paces(straggler_job(extra=extra, gc_s=0.003, gc_full=1))), "slow.W001")
    assert finding.data["family"] == "gc" and "gc.freeze()" in finding.remediation


def test_what_cannot_be_measured_is_said_for_the_ranks_it_concerns():
    docs = {rank: window(rank, noisy(0.5, seed=rank), STEP, notes=["waits inside NCCL collectives are not measured"])
            for rank in range(2)}
    finding = only(judge(paces(docs)), "slow.I006")
    assert finding.ranks == (0, 1) and "NCCL" in finding.title


def test_the_verdict_reads_the_same_at_4096_ranks():
    docs = {rank: window(rank, noisy(FLOOR + 3.0, steps=50, seed=rank % 7), STEP) for rank in range(4096)}
    docs[1234] = window(1234, noisy(FLOOR, steps=50, seed=3), STEP, host="node-154")
    finding = only(judge(paces(docs), world=4096), "slow.W001")
    assert finding.ranks == (1234,) and "the other 4095 ranks wait" in finding.title
    assert "ranks 0-1233, 1235-4095" in finding.detail and len(finding.detail.splitlines()) <= 10


def test_the_parting_frame_is_the_outermost_user_frame_where_two_stacks_differ():
    torch_frame = Frame("/usr/lib/python3/site-packages/torch/nn/modules/module.py", 1500, "_call_impl")
    late = (Frame("train.py", 264, "<module>", "losses = estimate_loss()"), Frame("train.py", 216, "estimate_loss"),
            torch_frame, Frame("model.py", 89, "forward"))
    waiting = (Frame("train.py", 300, "<module>", "scaler.scale(loss).backward()"), torch_frame)
    assert parting_frame(late, waiting).line == 264
    inside_main = ((Frame("train.py", 99, "<module>"),) + tuple(Frame(f.file, f.line, "main") for f in late[:1]))
    assert parting_frame(inside_main, (Frame("train.py", 99, "<module>"), Frame("train.py", 300, "main"))).line == 264
    assert parting_frame((torch_frame,), waiting) is None


def test_windows_merge_and_travel_as_documents():
    first, second = from_doc(window(0, noisy(1.0), STEP, index=0)), from_doc(window(0, noisy(1.0), STEP, index=1))
    both = merge(first, second)
    assert both.windows == 2 and both.groups[("collective", "0")].steps == 800
    again = from_doc(to_doc(both))
    group, back = both.groups[("collective", "0")], again.groups[("collective", "0")]
    assert (back.hist, back.steps) == (group.hist, group.steps) and back.waited_s == pytest.approx(group.waited_s, abs=1e-5)
    assert again.paths.keys() == both.paths.keys() and again.loader_s is None
    timed = merge(from_doc(window(0, noisy(1.0), STEP, loader_s=0.01)), from_doc(window(0, noisy(1.0), STEP, loader_s=0.02)))
    assert timed.loader_s == pytest.approx(12.0) and timed.loader_n == 800
    assert from_doc(to_doc(timed)).loader_s == pytest.approx(12.0)
    half = merge(from_doc(window(0, noisy(1.0), STEP, loader_s=0.01)), second)  # one window not timed: not the span
    assert half.loader_s is None
    hist = both.groups[("collective", "0")].hist
    assert fraction_below(hist, 100.0) == 1.0 and 0.5 < quantile_ms(hist, 0.5) < 2.0


@pytest.mark.parametrize("bad", [None, 3, "text", [], {"schema": "other"}, {"schema": "distdoctor.pace/1"},
                                 {"schema": "distdoctor.pace/1", "rank": 1, "wall_s": "x", "waits": "no",
                                  "profile": {"frames": [1], "paths": [[["a"], 1]], "loader": {"s": "x"}}, "cpu": [],
                                  "gc": 7}])
def test_a_malformed_document_is_not_measured_and_never_raises(bad):
    pace = from_doc(bad)
    assert pace is None or (pace.rank == 1 and pace.groups == {} and pace.paths == {} and pace.run_s is None
                            and pace.loader_s is None)


def test_the_watcher_says_a_slow_rank_once_when_it_starts_and_once_when_it_ends():
    watcher = Watcher(world=2, window_s=5)
    lines = []
    for index in range(10):
        slow = 2 <= index < 6
        docs = {0: window(0, noisy(FLOOR + (3.0 if slow else 0.2), seed=index), STEP, index=index),
                1: window(1, noisy(FLOOR + (0.0 if slow else 0.2), seed=index + 50), STEP, index=index)}
        lines += watcher.feed(docs, float(index))
    assert len(lines) == 2, lines
    assert lines[0].startswith("slow rank: Rank 1 on node-a makes every step wait") and "no longer" in lines[1]
    assert watcher.episodes[0].ranks == [1] and watcher.episodes[0].ended_at is not None
    assert not watcher.feed({0: window(0, noisy(1.0), STEP, index=3)}, 11.0)  # an old window again: nothing new


def test_the_watcher_never_floods():
    watcher = Watcher(world=2)
    said = []
    for index in range(400):
        slow = (index // 4) % 2 == 0  # slow for 4 windows, fine for 4: a start and an end each time
        docs = {0: window(0, noisy(FLOOR + (3.0 if slow else 0.0), seed=index), STEP, index=index),
                1: window(1, noisy(FLOOR, seed=index + 7), STEP, index=index)}
        said += watcher.feed(docs, float(index))
    assert len(said) == MAX_LINES and "not said live" in said[-1]


def test_a_ranks_final_document_is_its_whole_run():
    watcher = Watcher(world=2)
    watcher.feed({0: window(0, noisy(3.0), STEP, index=0), 1: window(1, noisy(0.3), STEP, index=0)}, 0.0)
    total = merge(from_doc(window(1, noisy(0.3), STEP, index=0)), from_doc(window(1, noisy(0.3), STEP, index=1)))
    watcher.feed({1: {**to_doc(total), "final": True}}, 1.0)
    assert watcher.totals[1].windows == 2 and watcher.totals[1].groups[("collective", "0")].steps == 800
    document = watcher.document(watcher.final())
    assert document["schema"] == "distdoctor.slow_ranks/1" and document["heard_from"] == [0, 1]
