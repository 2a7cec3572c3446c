"""A job's inputs as they come: many files, interleaved ranks, broken files among good ones."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from distdoctor.cli import app
from distdoctor.explain import explain_files, explain_text

TRACEBACK = """Traceback (most recent call last):
  File "/work/train.py", line 40, in <module>
    main()
  File "/work/train.py", line 31, in main
    {code}
  File "/usr/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 3252, in all_reduce
    work.wait()
{error}
"""
RAISED = TRACEBACK.format(code="check(batch)", error="ValueError: bad batch on rank 1").replace(
    '  File "/usr/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 3252, in all_reduce\n    work.wait()\n', "")
PEER = TRACEBACK.format(code="dist.all_reduce(t)", error="RuntimeError: [../gloo/transport/tcp/pair.cc:553] Connection closed by peer [10.0.0.2]:4455")


def prefixed(rank: int, text: str) -> list[str]:
    return [f"[rank{rank}]: {line}" for line in text.splitlines()]


def test_two_ranks_tracebacks_interleaved_line_by_line_are_told_apart():
    zero, one = prefixed(0, PEER), prefixed(1, RAISED)
    lines = [line for pair in zip(zero, one + [""] * len(zero)) for line in pair if line]
    report = explain_text("\n".join(lines) + "\n[rank0]: a partial line with no end")
    top = report.findings[0]
    assert (top.cause, top.ranks) == ("worker_exception", (1,))
    assert "/work/train.py:31" in top.title and "bad batch on rank 1" in top.title
    assert "rank 0 failed with RuntimeError" in top.detail


def test_per_rank_files_in_a_directory_with_bad_files_among_them(tmp_path):
    folder = tmp_path / "logs"
    folder.mkdir()
    (folder / "rank0.log").write_text(PEER)
    (folder / "rank1.log").write_text("step 1\nstep 2\n" + RAISED)
    (folder / "core.bin").write_bytes(b"\x7fELF\x00\x00\x01" * 100)
    (folder / "rank2.log").write_bytes("Fehler: Größe\n".encode("latin-1"))
    report = explain_files([str(folder)])
    top = report.findings[0]
    assert (top.cause, top.ranks) == ("worker_exception", (1,))
    skipped = next(f for f in report.findings if f.id == "log.W036")
    assert "core.bin" in skipped.detail and "binary" in skipped.detail
    # A latin-1 file is read (its bytes that are not UTF-8 replaced), not skipped; its check says so.
    assert "rank2.log" not in skipped.detail
    assert any("rank2.log" in c["name"] and "not UTF-8" in c.get("reason", "") for c in report.checks), report.checks


def test_a_directory_of_thousands_of_files_is_read_in_bounded_time_and_exits_cleanly(tmp_path):
    folder = tmp_path / "many"
    folder.mkdir()
    for i in range(3000):
        (folder / f"worker-{i}.out").write_text(f"epoch 1 step {i}\n")
    (folder / "rank7.log").write_text(RAISED)
    result = CliRunner().invoke(app, ["explain", str(folder), "--format", "json"])
    assert result.exit_code == 1, result.output
    assert '"worker_exception"' in result.stdout and "Traceback" not in result.stderr


def test_a_huge_line_before_the_traceback_does_not_hide_it(tmp_path):
    log = tmp_path / "rank1.log"
    log.write_text("x" * (3 << 20) + "\n" + RAISED)
    top = explain_files([str(log)]).findings[0]
    assert (top.cause, top.ranks) == ("worker_exception", (1,))


def test_ranks_disagreeing_on_the_world_size_are_among_the_candidates():
    text = ("[rank1]: torch.distributed.DistStoreError: Timed out initializing process group in store based barrier "
            "on rank 1, for key: store_based_barrier_key:1 (world_size=4, num_workers_joined=2, timeout=0:30:00, "
            "error=Socket Timeout)\n")
    top = explain_text(text).findings[0]
    assert "rank_config_error" in [c["cause"] for c in top.data["candidates"]]


def test_of_two_ranks_that_raised_the_earlier_by_its_timestamps_is_the_cause():
    late = ["[rank0]: 2024-05-01 10:00:09,120 INFO step 40", *prefixed(0, RAISED.replace(
        "ValueError: bad batch on rank 1", "KeyError: 'x'"))]
    early = ["[rank1]: 2024-05-01 10:00:02,500 INFO step 38", *prefixed(1, RAISED)]
    top = explain_text("\n".join(late + early) + "\n").findings[0]
    assert (top.cause, top.ranks) == ("worker_exception", (1,)), top.title
    assert "rank 0 also raised with KeyError" in top.detail


def test_a_hang_reports_snapshots_join_the_job_without_a_second_copy_of_its_verdict(tmp_path):
    from distdoctor.core.report import build_report
    from distdoctor.diagnosis.diagnose import diagnose
    from distdoctor.diagnosis.snapshot import GroupProgress, PendingOp, RankSnapshot

    waiting = RankSnapshot(0, status="running", groups=(GroupProgress("0", (0, 1), 7, 6, PendingOp("all_reduce", 7)),))
    late = RankSnapshot(1, status="running", groups=(GroupProgress("0", (0, 1), 6, 6),))
    report = build_report(diagnose([waiting, late]), [])
    (tmp_path / "hang.json").write_text(json.dumps(report.to_dict()))
    found = explain_files([str(tmp_path / "hang.json")]).findings
    assert [f.id for f in found] == ["job.E002"] and found[0].ranks == (1,)
    # With rank 1's own log beside it, the job is read again: rank 1 raised while the others waited.
    (tmp_path / "rank1.log").write_text(RAISED)
    found = explain_files([str(tmp_path / "hang.json"), str(tmp_path / "rank1.log")]).findings
    assert found[0].cause == "worker_exception" and found[0].ranks == (1,)


def test_every_ranks_report_of_one_verdict_reads_as_one_finding(tmp_path):
    """The guard writes an exception report on the failing rank and on each peer whose call failed with
    it, all with the one verdict: one finding names the other reports; another verdict stays apart."""
    from distdoctor.core.report import build_report
    from distdoctor.diagnosis.diagnose import diagnose
    from distdoctor.diagnosis.snapshot import GroupProgress, PendingOp, RankSnapshot

    waiting = RankSnapshot(0, status="running", groups=(GroupProgress("0", (0, 1), 7, 6, PendingOp("all_reduce", 7)),))
    late = RankSnapshot(1, status="running", groups=(GroupProgress("0", (0, 1), 6, 6),))
    report = build_report(diagnose([waiting, late]), []).to_dict()
    for rank in range(6):
        (tmp_path / f"exception-rank{rank}.json").write_text(json.dumps(report))
    found = explain_files([str(tmp_path)]).findings
    assert [f.id for f in found] == ["job.E002"] and found[0].data["also_in"] == 5, [(f.id, f.title) for f in found]
    assert "The same finding is in 5 more reports" in found[0].detail and "and 2 more" in found[0].detail
    # A report of another verdict (rank 0 behind, rank 1 waiting) is not folded into it.
    other = build_report(diagnose([RankSnapshot(0, status="running", groups=(GroupProgress("0", (0, 1), 6, 6),)),
                                   RankSnapshot(1, status="running", groups=(GroupProgress("0", (0, 1), 7, 6, PendingOp("all_reduce", 7)),))]), [])
    (tmp_path / "other.json").write_text(json.dumps(other.to_dict()))
    found = explain_files([str(tmp_path)]).findings
    assert sorted(f.ranks for f in found if f.id == "job.E002") == [(0,), (1,)], [(f.id, f.title) for f in found]


def test_thousands_of_ranks_give_a_bounded_answer():
    text = "".join("\n".join(prefixed(r, PEER)) + "\n" for r in range(2000))
    top = explain_text(text).findings[0]
    assert top.cause != "collective_timeout_hang"  # they lost a peer none of these lines is from
    assert len(top.detail) < 20_000
    raising = "".join(f"[rank{r}]: ValueError: bad batch {r}\n" for r in range(5000))
    top = explain_text(raising).findings[0]
    assert (top.cause, top.ranks) == ("worker_exception", (0,)) and len(top.detail) < 20_000


WATCHDOG = ("[rank{r}]:[E710 18:00:32.426302794 ProcessGroupNCCL.cpp:688] [Rank {r}] Watchdog caught collective operation "
            "timeout: WorkNCCL(SeqNum=59958, OpType=ALLREDUCE, NumelIn=8388608, NumelOut=8388608, Timeout(ms)=1800000) "
            "ran for 1800077 milliseconds before timing out.\n"
            "[rank{r}]:[E710 18:00:32.426302794 ProcessGroupNCCL.cpp:2395] [PG ID 0 PG GUID 0(default_pg) Rank {r}]  "
            "failure detected by watchdog at work sequence id: 59958 PG status: last enqueued work: 59960, last "
            "completed work: 59957\n")


def test_nccl_watchdog_lines_place_each_rank_and_name_the_one_that_never_came(tmp_path):
    for r in range(3):
        (tmp_path / f"rank{r}.log").write_text(f"[rank{r}]: step 9000\n" + WATCHDOG.format(r=r))
    (tmp_path / "rank3.log").write_text("[rank3]: step 9000\n[rank3]: saving checkpoint to /ckpt/step9000\n")
    top = explain_files([str(p) for p in sorted(tmp_path.iterdir())]).findings[0]
    assert top.ranks == (3,) and top.id.startswith("job."), top.title
    causes = [c["cause"] for c in top.data["candidates"]]
    assert "straggler_rank" in causes[:2] and "rank_missing" in causes[:2]
    assert "allreduce #59958" in top.title and top.confidence < 0.8


def test_of_two_ranks_that_raised_in_one_log_without_a_clock_the_first_printed_is_the_cause():
    first = prefixed(3, RAISED.replace("ValueError: bad batch on rank 1", "ZeroDivisionError: division by zero"))
    later = prefixed(0, RAISED.replace("ValueError: bad batch on rank 1", "KeyError: 'x'"))
    top = explain_text("\n".join(first + later) + "\n").findings[0]
    assert (top.cause, top.ranks) == ("worker_exception", (3,)) and "ZeroDivisionError" in top.title


def test_an_exception_no_rank_claims_is_still_the_cause_of_the_peer_failures_after_it():
    text = RAISED.replace("ValueError: bad batch on rank 1", "KeyError: 'labels'") + PEER
    top = explain_text(text).findings[0]
    assert top.cause == "worker_exception" and "KeyError" in top.title and "/work/train.py:31" in top.title
    assert 0.5 <= top.confidence < 0.8  # which process raised it, no line says
    assert any(c["signature"] == "gloo_peer_lost" for c in top.data["consequences"])


def test_torch_multiprocessing_spawns_process_index_names_the_rank():
    text = "\n\n-- Process 2 terminated with the following error:\n" + RAISED
    top = explain_text(text).findings[0]
    assert (top.cause, top.ranks) == ("worker_exception", (2,)) and "/work/train.py:31" in top.title


def test_a_guard_report_directory_of_snapshots_and_dumps_is_one_job(tmp_path):
    """The layout the guard's --report-dir writes: snapshots/rank<R>.json, flight_recorder/..._rank_<R>."""
    from distdoctor.diagnosis.snapshot import Frame, GroupProgress, PendingOp, RankSnapshot

    (tmp_path / "snapshots").mkdir()
    waiting = RankSnapshot(0, status="running", where=Frame("train.py", 25, "main"), source="guard",
                           groups=(GroupProgress("0", (0, 1), 12, 11, PendingOp("all_reduce", 12)),))
    late = RankSnapshot(1, status="running", where=Frame("train.py", 18, "main", "time.sleep(120)"), source="guard",
                        groups=(GroupProgress("0", (0, 1), 11, 11),))
    for snap in (waiting, late):
        (tmp_path / "snapshots" / f"rank{snap.rank}.json").write_text(json.dumps(snap.to_dict()))
    top = explain_files([str(tmp_path)]).findings[0]
    assert (top.id, top.cause, top.ranks) == ("job.E002", "straggler_rank", (1,))
    assert "all_reduce #12" in top.title and "train.py:18" in top.title


def test_ranks_that_disagree_on_the_world_size_are_named_before_their_timeouts(tmp_path):
    timeout = ("[rank{r}]: torch.distributed.DistStoreError: Timed out initializing process group in store based "
               "barrier on rank {r}, for key: store_based_barrier_key:1 (world_size={w}, num_workers_joined=3, "
               "timeout=0:30:00, error=Socket Timeout)\n")
    (tmp_path / "node0.log").write_text("".join(f"[rank{r}]: WORLD_SIZE=4 RANK={r}\n" + timeout.format(r=r, w=4)
                                                for r in (0, 1)))
    (tmp_path / "node1.log").write_text("[rank2]: WORLD_SIZE=2 RANK=2\n" + timeout.format(r=2, w=2))
    report = explain_files([str(tmp_path / "node0.log"), str(tmp_path / "node1.log")])
    top = report.findings[0]
    assert (top.cause, top.ranks) == ("rank_config_error", (2,)) and top.confidence >= 0.8
    assert "world size 2" in top.title and "world size 4" in top.title
    # local_world_size is not the world size.
    same = explain_text("[rank0]: local_world_size=2 world_size=4\n[rank1]: world_size=4\n").findings[0]
    assert same.cause != "rank_config_error"


SUMMARY = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-25_09:00:00
  host      : node-a
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 101)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 101
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-25_09:00:00
  host      : node-a
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 102)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


def test_a_sigtermed_rank_whose_loop_was_over_left_the_job_and_one_still_working_is_late():
    """torchrun SIGTERMs every survivor; what the rank printed last tells a finished loop from a late one."""
    peer = "\n".join(f"[default1]:{line}" for line in prefixed(1, PEER)) + "\n"
    finished = "[default0]:step 5\n[default0]:rank 0 done\n" + peer + SUMMARY
    top = explain_text(finished).findings[0]
    assert (top.cause, top.ranks) == ("uneven_inputs", (0,)), top.title
    working = "[default0]:step 5\n[default0]:loading shard 7\n" + peer.replace(
        "Connection closed by peer [10.0.0.2]:4455", "Timed out waiting 5000ms for recv operation to complete") + SUMMARY
    top = explain_text(working).findings[0]
    assert (top.cause, top.ranks) == ("straggler_rank", (0,)), top.title


def test_an_exception_a_library_raised_for_the_users_line_is_less_certain_than_one_the_user_raised():
    inside = PEER.replace("RuntimeError: [../gloo/transport/tcp/pair.cc:553] Connection closed by peer [10.0.0.2]:4455",
                          "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
    library = explain_text("\n".join(prefixed(1, inside)) + "\n").findings[0]
    user = explain_text("\n".join(prefixed(1, RAISED)) + "\n").findings[0]
    assert (library.cause, library.ranks, user.cause) == ("worker_exception", (1,), "worker_exception")
    assert "/work/train.py:31" in library.title  # the user's line, not torch's
    assert library.confidence < 0.8 <= user.confidence


def test_a_ranks_stdout_flushed_between_its_traceback_header_and_frames_keeps_the_exception(tmp_path):
    # One console, two streams: rank 1's "Traceback" line (stderr) came before its step lines
    # (stdout), seen in a real srun -l log of the crash job on a loaded machine.
    log = tmp_path / "job.log"
    log.write_text("1: Traceback (most recent call last):\n1: rank 1 step 0 loss 8.0\n1: rank 1 step 1 loss 8.0\n"
                   "0: rank 0 step 0 loss 8.0\n"
                   '1:   File "/job/train.py", line 26, in main\n1:     raise ValueError(f"bad batch on rank {rank}")\n'
                   "1: ValueError: bad batch on rank 1\n"
                   "0: RuntimeError: [../gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:16805\n")
    finding = explain_files([str(log)]).findings[0]
    assert (finding.cause, finding.ranks) == ("worker_exception", (1,)) and "train.py:26" in finding.title
