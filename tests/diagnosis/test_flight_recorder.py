"""The flight recorder's dump, read from real gloo worlds and from damaged input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from distdoctor.diagnosis.diagnose import diagnose
from distdoctor.diagnosis.flight_recorder import read_dump
from distdoctor.diagnosis.snapshot import RUNNING, RankSnapshot
from distdoctor.testing import run_distributed

FR_ENV = {"TORCH_FR_BUFFER_SIZE": "200"}
RANKS = str(Path(__file__).with_name("fr_ranks.py"))


def _dumps(body: str, out: Path) -> list:
    result = run_distributed(f"fr_ranks:{body}", world_size=2, module_file=RANKS, env=FR_ENV, timeout=120,
                             args=(str(out),))
    assert result.ok, result.failure_message()
    return [json.loads((out / f"dump-{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.multiproc
def test_a_dtype_mismatch_that_gloo_lets_through_is_named_from_the_dumps(tmp_path):
    dumps = _dumps("dump_after_mismatch", tmp_path)
    snaps = [RankSnapshot(rank=r, status=RUNNING, groups=read_dump(dumps[r])) for r in (0, 1)]
    assert snaps[0].groups[0].last_completed == 2
    [finding] = diagnose(snaps)
    assert finding.id == "job.E008" and finding.cause == "dtype_mismatch"
    assert "all_reduce #2" in finding.title and "Float" in finding.title and "Int" in finding.title


@pytest.mark.multiproc
def test_a_collective_in_flight_is_pending_with_its_age(tmp_path):
    [group] = read_dump(_dumps("dump_while_waiting", tmp_path)[0])
    assert group.waiting and group.pending is not None
    assert group.pending.op == "barrier" and group.pending.seq == group.last_enqueued
    assert group.pending.age_s is not None and group.pending.age_s >= 0.5


@pytest.mark.multiproc
def test_a_rank_that_sent_point_to_point_counts_collectives_as_its_peer_does(tmp_path):
    """gloo's pg_status numbers every op (a send too) while its entries number collectives: rank 0,
    which sent once, must read as at the same collective as rank 1, not one ahead and pending."""
    dumps = _dumps("dump_after_a_dropped_send", tmp_path)
    raw = [dumps[r]["pg_status"]["0"]["last_enqueued_collective"] for r in (0, 1)]
    [zero], [one] = (read_dump(d) for d in dumps)
    assert (zero.last_enqueued, zero.last_completed) == (one.last_enqueued, one.last_completed), (raw, zero, one)
    assert zero.last_enqueued == zero.recent[-1].seq and not zero.waiting and zero.pending is None
    if raw[0] == raw[1]:
        pytest.skip(f"this torch numbers pg_status by collective ({raw}): nothing to translate")


def _numbered(ops: list[tuple[int, int]], enqueued: int, completed: int, name: str = "gloo") -> dict:
    return {"pg_status": {"0": {"last_enqueued_collective": enqueued, "last_completed_collective": completed}},
            "entries": [{"collective_seq_id": seq, "op_id": op_id, "profiling_name": f"{name}:all_reduce",
                         "process_group": ["0", "default_pg"], "input_sizes": [[4]], "input_dtypes": ["Float"],
                         "state": "scheduled", "is_p2p": False} for op_id, seq in ops]}


def test_op_numbered_counts_are_read_as_collective_numbers():
    ops = [(1, 1), (2, 2), (4, 3), (5, 4)]  # op 3 was a send: no entry, no collective number
    [group] = read_dump(_numbered(ops, 5, 5))
    assert (group.last_enqueued, group.last_completed, group.pending) == (4, 4, None)
    [group] = read_dump(_numbered(ops, 5, 4))  # the last one not marked completed yet
    assert (group.last_enqueued, group.last_completed) == (4, 3) and group.pending.seq == 4
    [group] = read_dump(_numbered(ops, 6, 5))  # a send enqueued after the last collective
    assert (group.last_enqueued, group.last_completed, group.pending) == (4, 4, None)
    # collective numbering (op ids equal, or counts that already match the entries) is left alone
    assert read_dump(_numbered([(1, 1), (2, 2)], 2, 1))[0].last_completed == 1
    assert read_dump(_numbered(ops, 4, 4))[0].last_enqueued == 4


def test_counts_are_left_as_torch_said_when_the_newest_entries_were_not_read(monkeypatch):
    import distdoctor.diagnosis.flight_recorder as fr

    monkeypatch.setattr(fr, "_MAX_ENTRIES", 3)  # only the oldest three read: op 5 (seq 4) unseen
    [group] = read_dump(_numbered([(1, 1), (2, 2), (4, 3), (5, 4)], 5, 5))
    assert (group.last_enqueued, group.last_completed) == (5, 5)


@pytest.mark.parametrize("dump", [None, 3, "text", [], {"pg_status": 7}, {"entries": "x"},
                                  {"entries": [{"collective_seq_id": "x"}, 5, None], "pg_status": {}}])
def test_a_foreign_or_damaged_dump_is_no_dump_or_no_groups(dump):
    groups = read_dump(dump)
    assert groups is None or groups == ()


def test_text_counters_and_minus_one_are_read():
    dump = {"pg_status": {"0": {"last_enqueued_collective": "4", "last_completed_collective": "-1"}},
            "pg_config": {"0": {"ranks": "[0, 1]"}},
            "entries": [{"collective_seq_id": 4, "profiling_name": "nccl:all_reduce", "process_group": ["0", "default_pg"],
                         "input_sizes": [[2, 2]], "input_dtypes": ["Float"], "state": "started", "is_p2p": False}]}
    [group] = read_dump(dump)
    assert (group.last_enqueued, group.last_completed, group.ranks) == (4, None, (0, 1))
    assert group.pending.op == "all_reduce" and group.pending.sizes == ((2, 2),)
