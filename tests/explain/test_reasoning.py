"""Ambiguous texts give candidates, multi-rank logs name the first failure, nothing matched is unknown."""

from __future__ import annotations

from pathlib import Path

import pytest

from distdoctor.explain import explain_files, explain_text

FIXTURES = Path(__file__).resolve().parent / "fixtures"

AMBIGUOUS = {
    "socket timeout": "Traceback (most recent call last):\nRuntimeError: Socket Timeout\n",
    "unhandled system error": "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error "
    "(run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5\n",
    "connection reset": "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
    "[10.0.0.2]:41234: Connection reset by peer\n",
}


@pytest.mark.parametrize("text", AMBIGUOUS.values(), ids=AMBIGUOUS.keys())
def test_ambiguous_text_is_one_finding_with_ranked_alternatives(text):
    report = explain_text(text)
    # One finding (issue 12: candidates are alternatives, not more errors), one quote of the line.
    assert len(report.findings) == 1, [(f.cause, f.title) for f in report.findings]
    top = report.findings[0]
    candidates = top.data["candidates"]
    causes = [c["cause"] for c in candidates]
    assert len(set(causes)) >= 3 and top.cause == causes[0]
    assert all(c["confidence"] < 0.8 and c["tell"] for c in candidates)
    confidences = [c["confidence"] for c in candidates]
    assert confidences == sorted(confidences, reverse=True)
    assert "distdoctor check" in top.data["tell_apart"] or "NCCL_DEBUG=INFO" in top.data["tell_apart"]
    assert top.detail.count(text.strip().splitlines()[-1][:60]) == 1
    assert report.to_dict()["summary"]["errors"] == 1 if "summary" in report.to_dict() else True


def test_socket_timeout_says_which_stages_to_run():
    top = explain_text(AMBIGUOUS["socket timeout"]).findings[0]
    assert "distdoctor check --stage local --stage rendezvous" in top.data["tell_apart"]


def test_sigkilled_rank_is_the_cause_and_peer_resets_its_consequences():
    report = explain_files([str(FIXTURES / "torchrun_sigkill.log")])
    assert len(report.findings) == 1, [(f.cause, f.title) for f in report.findings]
    top = report.findings[0]
    assert top.cause == "oom_killed_rank" and top.ranks == (3,)
    assert "Rank 3" in top.title and top.data["signal"] == "SIGKILL"
    # Corroborated by the peers and torchrun's first-failure mark, but SIGKILL is not specific to the OOM killer.
    assert 0.5 <= top.confidence < 0.8
    consequences = top.data["consequences"]
    assert "gloo_peer_lost" in {c["signature"] for c in consequences}
    assert {c["signature"] for c in consequences} <= {"gloo_peer_lost", "child_failed_generic"}
    assert sorted(r for c in consequences for r in c["ranks"]) == [0, 1, 2]
    # SIGTERMs sent by torchrun to the survivors are not failures of their own.
    assert "SIGTERM" not in top.title


def test_per_rank_logs_name_the_rank_that_died_silently():
    files = sorted(str(p) for p in (FIXTURES / "per_rank_sigkill").glob("rank*.log"))
    report = explain_files(files)
    top = report.findings[0]
    assert top.cause == "oom_killed_rank" and top.ranks == (2,)
    assert top.confidence < 0.6  # inferred from silence, not from an exit code
    assert report.world.ranks_reported == (0, 1, 2)
    assert {r for c in top.data["consequences"] for r in c["ranks"]} == {0, 1}


def test_same_error_on_many_ranks_is_one_finding():
    text = "".join(
        f"[rank{r}]: torch.distributed.DistBackendError: ProcessGroupNCCL is only supported with GPUs, no GPUs found!\n"
        for r in range(8)
    )
    report = explain_text(text)
    assert len(report.findings) == 1
    assert report.findings[0].ranks == tuple(range(8))
    assert report.findings[0].data["occurrences"] == 8


def test_first_failure_in_time_wins_across_files(tmp_path):
    # rank 1 failed first (env missing); rank 0 then timed out waiting for it.
    (tmp_path / "rank0.log").write_text(
        "2024-05-01 10:00:09,000 ERROR Timed out after 5 seconds waiting for clients. 1/2 clients joined.\n"
        "[rank0]: RuntimeError: Socket Timeout\n"
    )
    (tmp_path / "rank1.log").write_text(
        "2024-05-01 10:00:01,000 ERROR ValueError: Error initializing torch.distributed using env:// rendezvous: "
        "environment variable MASTER_ADDR expected, but not set\n"
    )
    report = explain_files([str(tmp_path / "rank0.log"), str(tmp_path / "rank1.log")])
    top = report.findings[0]
    assert top.cause == "env_missing" and top.ranks == (1,) and top.data["variable"] == "MASTER_ADDR"
    # Rank 0's timeouts (the socket's and the store's wait for workers) both follow from it.
    assert {c["signature"] for c in top.data["consequences"]} == {"bare_socket_timeout", "store_wait_for_workers_timeout"}
    assert len(report.findings) == 1


def test_watchdog_timeouts_name_the_ranks_that_did_not_time_out(tmp_path):
    line = ("[rank{r}]:[E1218 20:27:21.426415540 ProcessGroupNCCL.cpp:629] [Rank {r}] Watchdog caught collective "
            "operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) "
            "ran for 600081 milliseconds before timing out.\n")
    for r in range(3):
        (tmp_path / f"rank{r}.log").write_text(line.format(r=r))
    (tmp_path / "rank3.log").write_text("step 100 loss 0.25\nloading shard 7\n")
    report = explain_files(sorted(str(p) for p in tmp_path.glob("*.log")))
    top = report.findings[0]
    # Rank 3 said nothing while the others timed out in ALLREDUCE #9: the answer names rank 3, "a rank
    # never came", with the late rank beside it; the three timeouts are folded under it.
    assert top.ranks == (3,) and top.cause == "rank_missing"
    assert [c["cause"] for c in top.data["candidates"]][:2] == ["rank_missing", "straggler_rank"]
    assert "allreduce #9" in top.title
    assert {r for c in top.data["consequences"] for r in c["ranks"]} == {0, 1, 2}
    assert len(report.findings) == 1


def test_an_exception_that_no_signature_reads_is_the_failure_named():
    text = "".join(f"step {i} loss 0.{i:04d}\n" for i in range(500))
    text += "Traceback (most recent call last):\n  File \"train.py\", line 3\nKeyError: 'labels'\n"
    text += "".join(f"step {i} loss 0.1\n" for i in range(10))
    report = explain_text(text)
    assert [f.id for f in report.findings] == ["job.E001"]
    top = report.findings[0]
    assert top.cause == "worker_exception" and top.confidence < 0.8  # no rank: which process, no line says
    assert "KeyError: 'labels'" in top.title and "train.py:3" in top.title
    # An exception line alone (no traceback, no rank) is named too, with less confidence.
    alone = explain_text("step 1\nKeyError: 'labels'\n").findings[0]
    assert (alone.id, alone.cause) == ("log.E037", "worker_exception") and alone.confidence <= 0.5


def test_nothing_matched_is_unknown_with_the_relevant_lines():
    text = "".join(f"step {i} loss 0.{i:04d}\n" for i in range(500))
    text += "warning: data loading slow, retrying\nfatal: giving up on the input pipeline\n"
    report = explain_text(text)
    assert [f.id for f in report.findings] == ["log.W030"]
    top = report.findings[0]
    assert top.cause == "unknown" and top.confidence == 0.0
    assert any("fatal: giving up" in e["text"] for e in top.data["evidence"])
    assert report.exit_code() == 0  # a warning: nothing at the default fail level


def test_json_contract(tmp_path):
    report = explain_files([str(FIXTURES / "port_in_use.log")])
    data = report.to_dict()
    assert data["schema"] == "distdoctor.report/1"
    assert data["world"]["launcher"] == "log"
    finding = data["findings"][0]
    assert {"id", "severity", "cause", "title", "detail", "remediation", "ranks", "hosts", "check", "confidence",
            "data"} <= set(finding)
    assert data["checks"][0]["name"].startswith("read ") and data["checks"][0]["lines"] > 0


# A user's own TimeoutError (what `requests` raises on a slow storage read) is that rank's failure,
# whatever its words; the gloo error its peer then prints is the consequence (judged by origin).
USER_TIMEOUT = """\
[rank1]: Traceback (most recent call last):
[rank1]:   File "/home/u/train.py", line 88, in <module>
[rank1]:     batch = fetch_shard(step)
[rank1]:   File "/home/u/train.py", line 41, in fetch_shard
[rank1]:     return requests.get(url, timeout=5).content
[rank1]:   File "/usr/lib/python3/dist-packages/requests/api.py", line 73, in get
[rank1]:     return request("get", url, params=params, **kwargs)
[rank1]:   File "/usr/lib/python3/dist-packages/requests/adapters.py", line 532, in send
[rank1]:     raise ReadTimeout(e, request=request)
[rank1]: requests.exceptions.ReadTimeout: HTTPSConnectionPool(host='store', port=443): Read timed out. (read timeout=5)
[rank0]: Traceback (most recent call last):
[rank0]:   File "/home/u/train.py", line 92, in <module>
[rank0]:     loss.backward()
[rank0]:   File "/opt/venv/lib/python3.11/site-packages/torch/_tensor.py", line 626, in backward
[rank0]:     torch.autograd.backward(
[rank0]:   File "/opt/venv/lib/python3.11/site-packages/torch/autograd/graph.py", line 823, in _engine_run_backward
[rank0]:     return Variable._execution_engine.run_backward(
[rank0]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:41953
"""


@pytest.mark.parametrize("error_type", ["requests.exceptions.ReadTimeout", "TimeoutError"])
def test_a_users_own_timeout_is_its_ranks_failure_and_the_peers_gloo_error_its_consequence(error_type):
    report = explain_text(USER_TIMEOUT.replace("requests.exceptions.ReadTimeout", error_type))
    top = report.findings[0]
    assert top.cause == "worker_exception" and top.ranks == (1,), [(f.cause, f.ranks, f.title) for f in report.findings]
    assert "train.py:41" in top.title + top.detail


# A user's own RuntimeError whose words sound like a peer's timeout, raised at their own line: the
# rank's own failure (by where it was raised, diagnosis.origin), not a consequence. Its twin: the
# same words without the user's `raise` (a native call on that line, no C++ location) are judged by
# whether torch.distributed prints them, which it does not: still the rank's own.
USER_RUNTIME = """\
[rank1]: Traceback (most recent call last):
[rank1]:   File "/home/u/train.py", line 88, in <module>
[rank1]:     batch = next_batch(step)
[rank1]:   File "/home/u/data.py", line 17, in next_batch
[rank1]:     raise RuntimeError("Timed out waiting for the dataset server")
[rank1]: RuntimeError: Timed out waiting for the dataset server
[rank0]: Traceback (most recent call last):
[rank0]:   File "/home/u/train.py", line 92, in <module>
[rank0]:     dist.all_reduce(t)
[rank0]:   File "/opt/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 3252, in all_reduce
[rank0]:     work.wait()
[rank0]: RuntimeError: Connection closed by peer
"""


def test_a_users_own_runtime_error_that_sounds_like_a_timeout_is_its_ranks_worker_exception():
    top = explain_text(USER_RUNTIME).findings[0]
    assert (top.cause, top.ranks) == ("worker_exception", (1,)), (top.cause, top.ranks, top.title)
    assert "data.py:17" in top.title and top.confidence >= 0.8
    # Rank 0's RuntimeError, raised out of torch.distributed's all_reduce (no C++ location: an older
    # build), is the consequence, folded under the cause.
    assert "rank 0" in top.detail and "Connection closed by peer" in top.detail


def test_origin_decides_by_where_an_exception_was_raised_never_by_its_words():
    from distdoctor.diagnosis.origin import DISTRIBUTED, OWN, UNKNOWN, origin_of

    user = ["/home/u/data.py"]
    assert origin_of(["RuntimeError"], "Timed out waiting for the dataset server", user, True,
                     'raise RuntimeError("Timed out waiting for the dataset server")') == OWN
    assert origin_of(["RuntimeError"], "Socket Timeout", user, True, "store.get('k')") == UNKNOWN
    assert origin_of(["RuntimeError"], "Connection closed by peer",
                     ["/x/torch/distributed/distributed_c10d.py"], True) == DISTRIBUTED
    assert origin_of(["RuntimeError"], "NCCL error in: /opt/torch/lib/c10d/ProcessGroupNCCL.cpp:825, unhandled "
                     "system error") == DISTRIBUTED
    assert origin_of(["ValueError"], "Default process group has not been initialized",
                     ["/x/torch/distributed/distributed_c10d.py"], True) == OWN
    assert origin_of(["TimeoutError"], "timed out", user, True) == OWN
    assert origin_of(["RuntimeError"], "Socket Timeout") == UNKNOWN
