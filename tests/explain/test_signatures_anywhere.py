"""Every distributed signature has ranked candidates wherever it is in a log (issue 45): the watchdog's
status and teardown lines and a WorkNCCL wrapped over lines, among a framework's own lines; NCCL's WARN
lines without a Python error; a rank's exit code or signal alone (torchrun's, a shell's, a container's,
faulthandler's); a rendezvous that began and never completed; a ChildFailedError without its child's
error. Confidence is earned (an interface's name decides Gloo's "Unable to find address"), a job on one
host never blames the network between hosts, and a log with no cause says what to collect next."""

from __future__ import annotations

import pytest

from distdoctor.explain import explain_text

FRAMEWORK = "2024-06-01 10:00:0{n} | INFO | trainer:step:120 - step 12{n}0 loss 2.3{n}\n"


def _around(line: str) -> str:
    """The line between a framework's own log lines (loguru-style), as a training script's log holds it."""
    return FRAMEWORK.format(n=1) + FRAMEWORK.format(n=2) + line + FRAMEWORK.format(n=3)


def _ranked(text: str) -> tuple:
    top = explain_text(text).findings[0]
    return top, [c["cause"] for c in top.data.get("candidates", [])]


# Texts as torch's ProcessGroupNCCL.cpp prints them (2.2-2.13: "Timeout at NCCL work", the teardown line;
# 2.0-2.3 "Exception (either an error or timeout) detected by watchdog at work").
WATCHDOG_WITHOUT_ITS_MESSAGE = {
    "status_line": "[rank2]:[E ProcessGroupNCCL.cpp:1537] [PG 0 Rank 2] Timeout at NCCL work: 4711, last enqueued "
                   "NCCL work: 4711, last completed NCCL work: 4710.\n",
    "teardown_line": "[E ProcessGroupNCCL.cpp:414] Some NCCL operations have failed or timed out. Due to the "
                     "asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete "
                     "data. To avoid this inconsistency, we are taking the entire process down.\n",
    "old_status_line": "[E ProcessGroupNCCL.cpp:1484] [Rank 1] Exception (either an error or timeout) detected by "
                       "watchdog at work: 88, last enqueued NCCL work: 88, last completed NCCL work: 87.\n",
    "wrapped_worknccl": "[E609 18:02:05.884692033 ProcessGroupNCCL.cpp:1834] Timeout at NCCL work: 95252\n"
                        "WorkNCCL(SeqNum=95252, OpType=ALLREDUCE, NumelIn=563310, NumelOut=563310, Timeout(ms)=600000)\n"
                        "ran for 600004 milliseconds before timing out.\n",
}


@pytest.mark.parametrize("name", sorted(WATCHDOG_WITHOUT_ITS_MESSAGE))
def test_the_watchdog_known_by_any_of_its_lines_ranks_the_watchdogs_causes(name):
    top, ranked = _ranked(_around(WATCHDOG_WITHOUT_ITS_MESSAGE[name]))
    assert top.data["family"] if "family" in top.data else True
    # The watchdog's family: a rank late, gone or out of step, never the catch-all's CPU tensor.
    assert {"straggler_rank", "rank_missing", "collective_mismatch"} & set(ranked[:3]), ranked
    assert "cpu_tensor_on_nccl" not in ranked[:3] and top.confidence < 0.8, (ranked, top.confidence)


def test_the_watchdogs_lines_of_one_failure_are_one_finding():
    text = _around(WATCHDOG_WITHOUT_ITS_MESSAGE["status_line"] + WATCHDOG_WITHOUT_ITS_MESSAGE["teardown_line"]
                   + "[rank2]:[E ProcessGroupNCCL.cpp:607] [Rank 2] Watchdog caught collective operation timeout: "
                   "WorkNCCL(SeqNum=4711, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for "
                   "600081 milliseconds before timing out.\n")
    report = explain_text(text)
    assert len([f for f in report.findings if f.severity >= report.findings[0].severity]) == 1
    top = report.findings[0]
    assert top.data["signature"] == "nccl_watchdog_timeout"
    assert {"nccl_watchdog_status_timeout", "nccl_async_teardown"} <= {c["signature"] for c in top.data["consequences"]}


@pytest.mark.parametrize("line, signal", [
    ("E1127 10:00:00.000 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: -11) local_rank: 1 "
     "(pid: 4243) of binary: /usr/bin/python3\n", "SIGSEGV"),
    ("  exitcode  : -6 (pid: 4243)\n", "SIGABRT"),
    ("Segmentation fault (core dumped)\n", "SIGSEGV"),
    ("train.sh: line 3: 4242 Aborted (core dumped) python train.py\n", "SIGABRT"),
    ("Fatal Python error: Segmentation fault\n", "SIGSEGV"),
    ("Process finished with exit code 139 (interrupted by signal 11: SIGSEGV)\n", "SIGSEGV"),
    ("trainer-0 exited with code 134\n", "SIGABRT"),
    ("subprocess.CalledProcessError: Command '['python', 'train.py']' died with <Signals.SIGSEGV: 11>.\n", "SIGSEGV"),
])
def test_an_exit_code_or_signal_alone_gets_ranked_causes_never_unknown(line, signal):
    top, ranked = _ranked(line)
    assert top.cause != "unknown" and "unknown" not in ranked and len(set(ranked)) >= 3, (top.title, ranked)
    assert signal in top.title or signal in top.detail, top.title
    assert top.confidence < 0.8


@pytest.mark.parametrize("line", [
    "  exitcode  : -7 (pid: 4243)\n", "Bus error (core dumped)\n", "worker-3 exited with code 135\n",
    "torch.multiprocessing.spawn.ProcessExitedException: process 1 terminated with signal SIGBUS\n",
])
def test_sigbus_alone_is_shared_memory_first_and_never_unknown(line):
    top, ranked = _ranked(line)
    assert ranked[0] == "shm_too_small" and "unknown" not in ranked, ranked


def test_the_abort_of_a_collective_ranks_the_hang_higher_for_sigabrt_than_for_sigsegv():
    _, abort = _ranked("Aborted (core dumped)\n")
    _, segv = _ranked("Segmentation fault (core dumped)\n")
    assert abort.index("collective_timeout_hang") < segv.index("collective_timeout_hang"), (abort, segv)


def test_sigkill_from_a_container_stays_the_oom_killer():
    top, _ = _ranked("Pod trainer-1 exited with code 137 (OOMKilled)\n")
    assert top.cause == "oom_killed_rank"


NCCL_WARN_ONLY = ("node1:1234:1300 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>\n"
                  "node1:1234:1300 [0] transport/net.cc:1000 NCCL WARN [Proxy Service 3] Failed to execute operation "
                  "Connect from rank 3, retcode 3\n")


def test_ncclS_own_warn_lines_without_a_python_error_get_candidates():
    top, ranked = _ranked(NCCL_WARN_ONLY)
    assert top.id != "log.W030" and len(set(ranked)) >= 3 and top.confidence < 0.8, (top.id, ranked)
    assert "Failed to execute operation" in top.title


def test_an_nccl_warn_the_job_went_on_past_is_no_failure():
    report = explain_text(NCCL_WARN_ONLY + "".join(f"epoch 1 step {i} loss 0.{i}\n" for i in range(5)))
    assert report.findings[0].id == "log.W030" and report.exit_code() == 0


def test_an_nccl_warn_beside_another_reading_is_its_consequence():
    text = NCCL_WARN_ONLY + "RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, " \
                            "unhandled system error, NCCL version 2.14.3\n"
    report = explain_text(text)
    assert report.findings[0].data["signature"] == "nccl_unhandled_system_error" and len(report.findings) == 1
    assert "nccl_warn_unnamed" in {c["signature"] for c in report.findings[0].data["consequences"]}


# torchrun 2.x with LOGLEVEL=INFO: the launch configs and the agent's rendezvous (launcher/api.py, agent/server/api.py).
RDZV_START = ("INFO:torch.distributed.launcher.api:Starting elastic_operator with launch configs:\n"
              "  entrypoint       : train.py\n  min_nodes        : 2\n  max_nodes        : 2\n"
              "  rdzv_endpoint    : 10.1.1.1:29500\n  rdzv_configs     : {'rank': 0, 'timeout': 900}\n\n"
              "INFO:torch.distributed.elastic.agent.server.api:[default] starting workers for entrypoint: python\n"
              "INFO:torch.distributed.elastic.agent.server.api:[default] Rendezvous'ing worker group\n")
RDZV_DONE = ("INFO:torch.distributed.elastic.agent.server.api:[default] Rendezvous complete for workers. Result:\n"
             "  restart_count=0\n  master_addr=10.1.1.1\n  group_rank=0\n  group_world_size=2\n"
             "INFO:torch.distributed.elastic.agent.server.api:[default] Starting worker group\n")


def test_a_rendezvous_that_began_and_never_completed_is_a_hang_with_candidates():
    top, ranked = _ranked(RDZV_START)
    assert top.data["signature"] == "rendezvous_no_end" and top.confidence < 0.8
    assert {"rank_missing", "master_unreachable", "rank_config_error"} <= set(ranked[:4]), ranked


def test_a_rendezvous_that_completed_is_no_failure():
    report = explain_text(RDZV_START + RDZV_DONE)
    assert report.findings[0].id == "log.W030" and report.exit_code() == 0


SUMMARY_NO_CHILD_ERROR = (
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
    "============================================================\ntrain.py FAILED\n")


def test_a_child_failed_error_without_its_childs_error_offers_the_oom_killer():
    top, ranked = _ranked(SUMMARY_NO_CHILD_ERROR)
    assert "oom_killed_rank" in ranked and "worker_exception" in ranked[:3], ranked


def test_a_summarys_exit_code_without_the_workers_output_offers_the_oom_killer_too():
    text = SUMMARY_NO_CHILD_ERROR + ("Root Cause (first observed failure):\n[0]:\n  time      : 2026-11-27_10:00:00\n"
                                     "  host      : node-1\n  rank      : 0 (local_rank: 0)\n"
                                     "  exitcode  : 1 (pid: 4243)\n  error_file: <N/A>\n")
    top, ranked = _ranked(text)
    assert top.cause == "worker_exception" and "oom_killed_rank" in ranked, ranked


@pytest.mark.parametrize("name, cause, confident", [
    ("eth0", "wrong_interface", True), ("ib9", "wrong_interface", True), ("enp5s0f1", "wrong_interface", True),
    ("gpu-node-17.cluster.local", "hostname_unresolvable", False), ("ubuntu-server", "hostname_unresolvable", False),
])
def test_gloo_unable_to_find_address_is_the_interface_only_for_an_interfaces_name(name, cause, confident):
    # gloo/transport/tcp/device.cc: the same words for GLOO_SOCKET_IFNAME's interface and for the host's name.
    top, ranked = _ranked("RuntimeError: [../third_party/gloo/gloo/transport/tcp/device.cc:208] rp != nullptr. "
                          f"Unable to find address for: {name}\n")
    assert top.cause == cause and (top.confidence >= 0.8) is confident, (top.cause, top.confidence)
    if not confident:
        assert "wrong_interface" in ranked[:2], ranked


def test_a_name_the_resolver_could_not_be_asked_about_is_not_a_confident_answer():
    top, ranked = _ranked("[W socket.cpp:697] [c10d] The IPv4 network addresses of (node-0, 29500) cannot be retrieved "
                          "(gai error: -3 - Temporary failure in name resolution).\n")
    assert top.cause == "hostname_unresolvable" and top.confidence < 0.8 and "wrong_interface" in ranked, ranked
    top, _ = _ranked("[W socket.cpp:697] [c10d] The IPv4 network addresses of (node-0, 29500) cannot be retrieved "
                     "(gai error: -2 - Name or service not known).\n")
    assert top.cause == "hostname_unresolvable" and top.confidence >= 0.8


REFUSED = ("[E1128 21:10:32.450 ProcessGroupGloo.cpp:67] Gloo connectFullMesh failed with [../third_party/gloo/gloo/"
           "transport/tcp/pair.cc:152] timed out connecting: SO_ERROR: Connection refused, remote=[127.0.0.1]:18312$1\n")


@pytest.mark.parametrize("one_host", [
    "I1128 21:10:20.000 torch/distributed/run.py:1000] --rdzv-backend=c10d --rdzv-endpoint=localhost:0 --rdzv-id=x\n",
    "  master_addr=127.0.0.1\n",
    "  group_world_size=1\n",
])
def test_a_refused_connection_on_one_host_never_blames_the_network_between_hosts(one_host):
    top, ranked = _ranked(one_host + REFUSED)
    assert top.cause == "rank_missing", ranked
    floor = {c["cause"]: c["confidence"] for c in top.data["candidates"]}
    assert floor.get("wrong_interface", 0) <= 0.02 and floor.get("firewall", 0) <= 0.02, floor


def test_the_same_refusal_without_proof_of_one_host_keeps_the_interface():
    # One node's console of a multi-host job whose ranks published loopback looks the same: nothing assumed.
    _, ranked = _ranked(REFUSED)
    assert ranked[0] == "wrong_interface", ranked


def test_a_log_with_no_cause_says_what_was_looked_for_and_what_to_collect():
    hang = explain_text("[rank0]: using nccl backend\n[rank0]: epoch 1 step 10 loss 2.3\n").findings[0]
    assert hang.id == "log.W030" and hang.data["looked_for"] and hang.data["collect_next"]
    assert "distdoctor guard" in hang.data["collect_next"][0] and any("other ranks" in s for s in hang.data["collect_next"])
    assert any("NCCL_DEBUG=INFO" in s for s in hang.data["collect_next"])
    elsewhere = explain_text("hello\nsomething failed here\n").findings[0]
    assert "nothing of torch.distributed" in elsewhere.data["collect_next"][0]
    assert "What to collect next:" in elsewhere.detail and elsewhere.remediation.startswith("Collect ")


def test_progress_before_a_failure_does_not_make_it_no_failure():
    text = "epoch 1 step 10 loss 2.3\n[rank0]: torch.distributed.DistBackendError: something broke in c10d\n"
    assert explain_text(text).findings[0].id != "log.W030"


def test_a_log_of_two_jobs_reads_the_failing_one():
    # Job A's lines, then job B's watchdog timeout: B's failure is read, as a guess (rank 0's lines stopped
    # before rank 1 timed out: which job they were, the log does not say).
    failing = ("[rank1]:[E1127 10:00:00.0 ProcessGroupNCCL.cpp:607] [Rank 1] Watchdog caught collective operation "
               "timeout: WorkNCCL(SeqNum=812, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran for "
               "1800083 milliseconds before timing out.\n")
    healthy = "".join(f"[rank{r}]: job A epoch 1 step {i} loss 0.{i}\n" for i in range(3) for r in (0, 1))
    top = explain_text(healthy + failing).findings[0]
    assert top.id != "log.W030" and top.confidence < 0.8 and top.data.get("candidates"), (top.id, top.confidence)


# A stack taken while a job hung, as py-spy dump (innermost frame first) and faulthandler print it; no error line.
PY_SPY_DUMP = """Process 4242: python train.py --epochs 10
Python v3.10.12 (/usr/bin/python3.10)

Thread 4242 (idle): "MainThread"
    all_reduce (torch/distributed/distributed_c10d.py:2501)
    wrapper (torch/distributed/c10d_logger.py:83)
    train_step (train.py:88)
    <module> (train.py:131)
Thread 4301 (idle): "Thread-1 (_pin_memory_loop)"
    select (selectors.py:416)
"""
FAULTHANDLER_DUMP = """Thread 0x00007f3a2c7fe700 (most recent call first):
  File "/usr/lib/python3.10/threading.py", line 324 in wait
Current thread 0x00007f3a9b8a4740 (most recent call first):
  File "/opt/conda/lib/python3.10/site-packages/torch/distributed/distributed_c10d.py", line 4166 in barrier
  File "/opt/conda/lib/python3.10/site-packages/torch/distributed/c10d_logger.py", line 83 in wrapper
  File "/work/train.py", line 140 in save_checkpoint
  File "/work/train.py", line 201 in <module>
"""


@pytest.mark.parametrize("dump", [PY_SPY_DUMP, FAULTHANDLER_DUMP], ids=["py-spy", "faulthandler"])
def test_a_stack_that_stops_in_a_collective_with_no_error_is_a_hang_with_the_watchdogs_causes(dump):
    top, ranked = _ranked(dump)
    assert top.data["signature"] == "stopped_in_collective", top.title
    assert top.data["operation"] in {"all_reduce", "barrier"} and top.data["operation"] in top.title
    assert {"straggler_rank", "collective_mismatch", "rank_missing"} & set(ranked[:3]), ranked
    assert top.confidence <= 0.5 and len(ranked) >= 3


def test_the_same_frames_with_the_job_going_on_after_them_are_no_hang():
    went_on = PY_SPY_DUMP + "".join(f"epoch 3 step {n}/500 loss 1.2{n}\n" for n in range(5))
    assert all(f.data.get("signature") != "stopped_in_collective" for f in explain_text(went_on).findings)


def test_a_traceback_through_a_collective_that_raised_keeps_its_errors_reading():
    raised = ('Traceback (most recent call last):\n  File "train.py", line 88, in <module>\n    dist.barrier()\n'
              '  File "/opt/conda/lib/python3.10/site-packages/torch/distributed/distributed_c10d.py", line 3696, in barrier\n'
              "    work = default_pg.barrier(opts=opts)\n"
              "torch.distributed.DistStoreError: Socket Timeout\n")
    top = explain_text(raised).findings[0]
    assert top.data.get("signature") != "stopped_in_collective", top.title


# NCCL_DEBUG=INFO's start-up (NCCL 2.7-2.21 wording) and nccl-tests' header, then nothing.
NCCL_START = """node1:2101:2101 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.11<0>
node1:2101:2101 [0] NCCL INFO NET/Plugin : No plugin found (libnccl-net.so), using internal implementation
node1:2101:2101 [0] misc/ibvwrap.cc:63 NCCL WARN Failed to open libibverbs.so[.1]
node1:2101:2101 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.11<0>
node1:2101:2190 [0] NCCL INFO Channel 00/02 :    0   1
node1:2101:2190 [0] NCCL INFO Connected all rings
node1:2101:2190 [0] NCCL INFO comm 0x55d0c4a0 rank 0 nranks 2 cudaDev 0 busId 1000 - Init COMPLETE
"""
NCCL_TESTS_HEADER = """# nThread 1 nGpus 2 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid   4411 on     node1 device  0 [0x1a] NVIDIA A100-SXM4-80GB
#  Rank  1 Group  0 Pid   4411 on     node1 device  1 [0x1b] NVIDIA A100-SXM4-80GB
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
"""


@pytest.mark.parametrize("text", [NCCL_START, NCCL_TESTS_HEADER], ids=["nccl-info", "nccl-tests"])
def test_nccl_started_and_nothing_after_is_a_hang_with_the_transport_first(text):
    top, ranked = _ranked(text)
    assert top.data["signature"] == "stopped_after_nccl_init", top.title
    assert "p2p_blocked" in ranked[:3] and top.confidence <= 0.4, (ranked, top.confidence)


def test_nccl_tests_that_print_their_results_are_no_hang():
    done = NCCL_TESTS_HEADER + ("           8             2     float     sum      -1    18.11    0.00    0.00      0    17.95"
                                "    0.00    0.00      0\n# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 41.2\n")
    assert all(f.data.get("signature") != "stopped_after_nccl_init" for f in explain_text(done).findings)


def test_nccl_started_and_the_job_training_after_it_is_no_hang():
    training = NCCL_START + "".join(f"epoch 0 step {n}/100 loss 2.{n}\n" for n in range(5))
    found = explain_text(training).findings
    assert all(f.data.get("signature") != "stopped_after_nccl_init" and f.cause != "shm_too_small" for f in found)
