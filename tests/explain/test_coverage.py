"""Texts from the sources that the catalog must read right (issue 15), and distdoctor's own reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from distdoctor.explain import explain_files, explain_text

FIXTURES = Path(__file__).resolve().parent / "fixtures"

# text -> cause named first (each from the source that prints it; see docs/explain.md's coverage table)
FIRST = {
    # /dev/shm: permission vs size told apart
    "RuntimeError: unable to open shared memory object </torch_1234_567_0> in read-write mode: Permission denied (13)":
        "shm_permission",
    "node-a:77:77 [0] misc/shmutils.cc:61 NCCL WARN Error while creating shared memory segment /dev/shm/nccl-x1 "
    "(size 9637888), error: Permission denied (13)": "shm_permission",
    "RuntimeError: unable to write to file </torch_2222_1111_3>: No space left on device (28)": "shm_too_small",
    "node-a:77:77 [0] misc/shmutils.cc:87 NCCL WARN Error: failed to extend /dev/shm/nccl-WqDy1A to 9637892 bytes":
        "shm_too_small",
    # P2P
    "node-a:7:7 [1] transport/p2p.cc:275 NCCL WARN Cuda failure 'peer access is not supported between these two devices'":
        "p2p_blocked",
    # DDP's model mismatch texts
    "RuntimeError: [1]: params[0] in this process with sizes [96, 32] appears not to match sizes of the same param in "
    "process 0.": "shape_mismatch",
    "RuntimeError: DDP expects same model across all ranks, but Rank 1 has 12 params, while rank 0 has inconsistent 10 "
    "params.": "shape_mismatch",
    # A missing launcher, Python-level
    "KeyError: 'LOCAL_RANK'": "env_missing",
    # kills
    "[2024-01-01 10:00:00,000] [ERROR] [launch.py:321:sigkill_handler] ['python', 'train.py'] exits with return code = -9":
        "oom_killed_rank",
    "slurmstepd: error: Detected 1 oom-kill event(s) in StepId=123.0. Some of your processes may have been killed by "
    "the cgroup out-of-memory handler.": "oom_killed_rank",
    "Killed": "oom_killed_rank",
    # versions
    "NCCL WARN NCCL version mismatch with remote peer node-b (local: 21805, remote 21602)": "version_incompat",
    "RuntimeError: CUDA error: no kernel image is available for execution on the device": "version_incompat",
    # launchers and frameworks
    "RuntimeError: Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, you must use the "
    "'spawn' start method": "launcher_misuse",
    "RuntimeError: Lightning can't create new processes if CUDA is already initialized.": "launcher_misuse",
}


@pytest.mark.parametrize("text", FIRST, ids=lambda t: t[:50])
def test_source_text_names_its_cause_first(text):
    top = explain_text(text + "\n").findings[0]
    assert top.cause == FIRST[text], (top.id, top.cause, top.title)


def test_shm_permission_is_never_named_shm_too_small():
    text = ("ERROR: Unexpected bus error encountered in worker.\n"
            "RuntimeError: unable to open shared memory object </torch_1_2_3> in read-write mode: Permission denied (13)\n")
    causes = [f.cause for f in explain_text(text).findings]
    assert causes[0] == "shm_permission"
    assert all(f.confidence < 0.8 for f in explain_text(text).findings if f.cause == "shm_too_small")


def test_shape_title_keeps_both_shapes():
    # torch 2.13's DETAIL text for all_reduce of a [2, 3] tensor on rank 0 and a [3] tensor on rank 1.
    line = ("[rank1]: RuntimeError: Detected mismatch between collectives on ranks. Rank 1 is running collective: "
            "CollectiveFingerPrint(SequenceNumber=0, OpType=ALLREDUCE, TensorShape=[3], TensorDtypes=Float), but Rank "
            "0 is running collective: CollectiveFingerPrint(SequenceNumber=0, OpType=ALLREDUCE, TensorShape=[2, 3], "
            "TensorDtypes=Float).Collectives differ in the following aspects: \t Op type: ALLREDUCEvs SCATTER  Tensor "
            "Tensor shapes: 3vs   Tensor Tensor dtypes: Floatvs \n")
    top = explain_text(line).findings[0]
    assert top.cause == "shape_mismatch"
    assert "[3] vs [2, 3]" in top.title, top.title


def test_loopback_timeout_does_not_lead_with_a_firewall():
    text = ("torch.distributed.DistStoreError: The client socket has timed out after 3000ms while trying to connect to "
            "(127.0.0.1, 29500).\n")
    top = explain_text(text).findings[0]
    ranked = [c["cause"] for c in top.data["candidates"]]
    assert ranked[-1] == "firewall" and ranked[0] != "firewall"
    firewall = next(c for c in top.data["candidates"] if c["cause"] == "firewall")
    assert any("loopback" in r for r in firewall["reordered_by"])


def test_a_sigkill_line_reorders_a_lost_peer():
    lost = "[rank0]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [10.0.0.2]:41234: Connection reset by peer\n"
    alone = explain_text(lost).findings[0]
    killed = explain_text(lost + "  traceback : Signal 9 (SIGKILL) received by PID 4242\n").findings[0]
    assert alone.data["candidates"][0]["cause"] == "oom_killed_rank"  # the prior order
    first = killed.data["candidates"][0]
    assert first["cause"] == "oom_killed_rank" and first["confidence"] > alone.data["candidates"][0]["confidence"]
    assert any("OOM killer" in r for r in first["reordered_by"])
    assert len(explain_text(lost + "  traceback : Signal 9 (SIGKILL) received by PID 4242\n").findings) == 1


def test_a_kernel_oom_line_explains_the_watchdog_timeouts():
    text = ("[rank0]:[E1218 20:27:21.4 ProcessGroupNCCL.cpp:629] [Rank 0] Watchdog caught collective operation "
            "timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600081 "
            "milliseconds before timing out.\n"
            "[Mon Jan  1 10:00:00 2024] Out of memory: Killed process 4242 (python) total-vm:1234kB\n")
    report = explain_text(text)
    assert report.findings[0].cause == "oom_killed_rank" and len(report.findings) == 1
    assert report.findings[0].data["consequences"][0]["signature"] == "nccl_watchdog_timeout"


OLD_WORDINGS = {
    # torch 1.9/1.10 torchrun summary
    "Root Cause:\n[0]:\n  time: 2021-09-14_01:45:50\n  rank: 2 (local_rank: 2)\n  exitcode: -9 (pid: 36071)\n"
    "  error_file: <N/A>\n  msg: \"Signal 9 (SIGKILL) received by PID 36071\"\n": ("oom_killed_rank", (2,)),
    # torch 1.10 watchdog without SeqNum
    "[E ProcessGroupNCCL.cpp:587] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(OpType=ALLREDUCE, "
    "Timeout(ms)=1800000) ran for 1800380 milliseconds before timing out.\n": (None, (0,)),
    # torch 1.x TCPStore
    "RuntimeError: connect() timed out. Original timeout was 1800000 ms.\n": ("master_unreachable", ()),
}


@pytest.mark.parametrize("text", OLD_WORDINGS, ids=["summary-1.9", "watchdog-1.10", "tcpstore-1.x"])
def test_older_torch_wordings(text):
    cause, ranks = OLD_WORDINGS[text]
    top = explain_text(text).findings[0]
    assert top.cause != "unknown" and top.ranks == ranks, (top.cause, top.title, top.ranks)
    if cause:
        assert top.cause == cause


def test_an_nccl_info_line_naming_docker0_puts_wrong_interface_first():
    text = ("node-a:1:1 [0] NCCL INFO NET/Socket : Using [0]docker0:172.17.0.1<0>\n"
            "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error (run with NCCL_DEBUG=INFO "
            "for details), NCCL version 2.21.5\n")
    top = explain_text(text).findings[0]
    assert top.cause == "wrong_interface" and top.confidence < 0.8


def test_reads_distdoctors_own_report():
    path = FIXTURES / "reports" / "check_local_bad_port.json"
    original = json.loads(path.read_text())
    report = explain_files([str(path)])
    assert [(f.id, f.cause) for f in report.findings] == [(f["id"], f["cause"]) for f in original["findings"]] or \
        {f.id for f in report.findings} == {f["id"] for f in original["findings"]}
    assert all(f.data["from_report"] == str(path) for f in report.findings)


def test_reads_a_hang_report_and_a_log_together(tmp_path):
    hang = {"schema": "distdoctor.report/1", "status": "error", "world": {"size": 2},
            "findings": [{"id": "guard.E001", "severity": "error", "cause": "collective_timeout_hang",
                          "title": "Rank 1 stuck in all_reduce #12 for 300 s", "ranks": [1], "hosts": ["node-a"],
                          "check": "runtime_guard", "data": {"seq": 12, "op": "all_reduce"}}],
            "checks": []}
    (tmp_path / "hang.json").write_text(json.dumps(hang) + "\n" + json.dumps(hang))
    (tmp_path / "rank0.log").write_text("KeyError: 'MASTER_ADDR'\n")
    report = explain_files([str(tmp_path / "hang.json"), str(tmp_path / "rank0.log")])
    ids = [f.id for f in report.findings]
    assert "guard.E001" in ids and "log.E001" in ids
    guard = next(f for f in report.findings if f.id == "guard.E001")
    assert guard.ranks == (1,) and "hang report" in guard.detail


def test_a_json_file_that_is_not_a_report_is_read_as_a_log(tmp_path):
    (tmp_path / "x.json").write_text('{"msg": "RuntimeError: Socket Timeout"}\n')
    report = explain_files([str(tmp_path / "x.json")])
    assert report.findings[0].data["signature"] == "bare_socket_timeout"


def test_a_hang_right_after_init_over_p2p_raises_p2p_blocked():
    # The labelled threads put a straggler first behind a watchdog timeout (threads.toml); a hang in the
    # first collectives after init with NCCL's P2P transport in use moves blocked P2P up, and says why.
    text = ("node-a:1:9 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC\n"
            "[rank0]:[E1218 20:27:21.4 ProcessGroupNCCL.cpp:629] [Rank 0] Watchdog caught collective operation "
            "timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600081 "
            "milliseconds before timing out.\n")
    top = explain_text(text).findings[0]

    def p2p(finding):
        return next((i, c) for i, c in enumerate(finding.data["candidates"]) if c["cause"] == "p2p_blocked")

    place, candidate = p2p(top)
    assert place < 3 and top.confidence < 0.8, top.data["candidates"]
    assert "NCCL_P2P_DISABLE=1" in candidate["tell"]
    assert any("first collectives" in r for r in candidate["reordered_by"])
    mid_training = explain_text(text.replace("SeqNum=1,", "SeqNum=48211,")).findings[0]
    later, moved = p2p(mid_training)
    assert mid_training.cause != "p2p_blocked" and moved["confidence"] < candidate["confidence"] and later >= place
