"""explain beyond its corpus: wording from torch's sources across versions, the reading of who
complained, who went quiet and who kept going, and the healthy twin of each (no alarm)."""

from __future__ import annotations

import pytest

from distdoctor.explain import explain_files, explain_text

TRACE = ('[rank1]: Traceback (most recent call last):\n[rank1]:   File "/w/train.py", line 30, in <module>\n'
         '[rank1]:     main()\n[rank1]:   File "/w/train.py", line 22, in main\n[rank1]:     dist.all_reduce(total)\n'
         '[rank1]:   File "/usr/lib/python3.10/site-packages/torch/distributed/distributed_c10d.py", line 2501, '
         'in all_reduce\n[rank1]:     work = group.allreduce([tensor], opts)\n')

# (line as a log shows it, the cause it means). Each is torch's, NCCL's or the launcher's own text,
# in the wording of the version named; the lines from users' logs are those of the corpus's threads.
WORDING = [
    # torch 2.4-2.6 Windows wheels (rendezvous.py -> TCPStore), and the wording of later versions.
    ("RuntimeError: use_libuv was requested but PyTorch was build without libuv support", "backend_unavailable"),
    ("torch.distributed.DistStoreError: use_libuv was requested but PyTorch was built without libuv support, run "
     "with USE_LIBUV=0 to disable it.", "backend_unavailable"),
    ("RuntimeError: No rendezvous handler for tcp://", "backend_unavailable"),               # rendezvous.py
    ("UserWarning: Attempted to get default timeout for nccl backend, but NCCL support is not compiled",
     "backend_unavailable"),                                                                   # distributed_c10d.py
    ("RuntimeError: Cannot use ReduceOp.AVG with Gloo", "backend_unavailable"),               # ProcessGroupGloo.cpp
    ("RuntimeError: ProcessGroupGloo does not support reduce_scatter", "backend_unavailable"),
    ("AttributeError: module 'torch.distributed' has no attribute 'init_process_group'", "backend_unavailable"),
    # A title typed by hand drops letters; a paste turns the apostrophe curly.
    ("RuntimeError: Distributed package doesn't have NCCL bulit in", "backend_unavailable"),
    ("RuntimeError: Distributed package doesn\u2019t have NCCL built in", "backend_unavailable"),
    ("ValueError: Error initializing torch.distributed using tcp:// rendezvous: port number missing", "env_missing"),
    ("ValueError: Port could not be cast to integer value as '<function get_open_port at 0x7f>'", "env_invalid"),
    ("ValueError: port must have value from 0 to 65535 but was 70000.", "env_invalid"),
    # torch < 1.1's ProcessGroupNCCL, and today's.
    ("RuntimeError: Only CUDA dense tensor is supported for NCCL collective operations", "cpu_tensor_on_nccl"),
    ("RuntimeError: Tensors must be CUDA and dense", "cpu_tensor_on_nccl"),
    ("ValueError: DistributedDataParallel device_ids and output_device arguments only work with single-device/"
     "multiple-device GPU modules or CPU modules, but got device_ids [0], output_device 0, and module parameters "
     "{device(type='cpu')}.", "device_mismatch"),
    ("ValueError: ProcessGroupNCCL is only supported with GPUs, no GPUs found!", "no_gpu_for_nccl"),
    # torchrun's agent: the session's hang-up, as torch < 2 (a number) and later (Signals.SIGHUP) print it.
    ("WARNING:torch.distributed.elastic.agent.server.api:Received 1 death signal, shutting down workers",
     "launcher_misuse"),
    ("torch.distributed.elastic.multiprocessing.api.SignalException: Process 792735 got signal: Signals.SIGHUP",
     "launcher_misuse"),
    # libuv's store (2.4+): the same bind error on Windows (-4091), and a port Windows reserved (EACCES).
    ("RuntimeError: The server socket has failed to listen on any local network address. port: 29500, useIpv6: 0, "
     "code: -4091, name: EADDRINUSE, message: address already in use", "port_in_use"),
    ("torch.distributed.DistNetworkError: The server socket has failed to listen on any local network address. "
     "port: 29500, useIpv6: false, code: -4092, name: EACCES, message: permission denied", "port_in_use"),
    ("ImportError: /opt/torch/lib/libtorch_cuda.so: undefined symbol: ncclCommRegister", "version_incompat"),
    # TORCH_DISTRIBUTED_DEBUG=DETAIL before 2.0 ("inconsistent", no sequence number), and a fingerprint
    # without tensors, which runs its fields together.
    ("RuntimeError: Detected mismatch between collectives on ranks. Rank 0 is running inconsistent collective: "
     "CollectiveFingerPrint(OpType=BROADCAST, TensorShape=[34112], TensorDtypes=Float, TensorDeviceTypes="
     "TensorOptions(dtype=float (default), device=cuda))", "collective_mismatch"),
    ("Detected mismatch between collectives on ranks. Rank 1 is running collective: CollectiveFingerPrint("
     "SequenceNumber=101, OpType=ALLGATHER, TensorShape=[1], TensorDtypes=Long), but Rank 7 is running collective: "
     "CollectiveFingerPrint(SequenceNumber=0OpType=REDUCE).Collectives differ in the following aspects:   Sequence "
     "number: 101vs 0  Op type: ALLGATHERvs REDUCE  Tensor Tensor shapes: 1vs   Tensor Tensor dtypes: Longvs ",
     "collective_mismatch"),
    ("torch.multiprocessing.spawn.ProcessExitedException: process 1 terminated with exit code 1",
     "worker_exception"),
    # torchelastic's ProcessFailure (errors/__init__.py) when a log shows the failure object, not the summary:
    # its message for a signal, f"Signal {-exitcode} ({signal_name}) received by PID {pid}", and its repr.
    ("The worker fails with {0: ProcessFailure(local_rank=0, pid=54, exitcode=-7, error_file='<N/A>', "
     "error_file_data={'message': '<NONE>'}, message='Signal 7 (SIGBUS) received by PID 54', timestamp=1711419181)}",
     "shm_too_small"),
    ("{1: ProcessFailure(local_rank=1, pid=8812, exitcode=-9, error_file='<N/A>', error_file_data={'message': "
     "'<NONE>'}, message='Signal 9 (SIGKILL) received by PID 8812', timestamp=1711419181)}", "oom_killed_rank"),
    ("torch.distributed.elastic.multiprocessing.api.SignalException: Process 81061 got signal: 1", "launcher_misuse"),
    # torch < 1.0's THD (General.cpp), before c10d's "environment variable RANK expected, but not set".
    ("RuntimeError: rank is not set but it is required for env:// init method at /opt/conda/conda-bld/pytorch/work/"
     "torch/lib/THD/process_group/General.cpp:17", "env_missing"),
    # The deprecated launcher's argument after a copy through a chat or word processor (an en dash).
    ("train.py: error: unrecognized arguments: \u2013local_rank=3", "launcher_misuse"),
    # A posted excerpt cut right after the variable's name.
    ("    raise KeyError(key) from None\nKeyError: 'RANK", "env_missing"),
    # NCCL's strongstream.cc when a collective is captured in a CUDA graph with an NCCL built on CUDA < 11.3.
    ("misc/strongstream.cc:53 NCCL WARN NCCL cannot be captured in a graph if either it wasn't built with CUDA runtime "
     ">= 11.3 or if the installed CUDA driver < R465.", "version_incompat"),
]


@pytest.mark.parametrize("line,cause", WORDING, ids=[f"{i}-{c}" for i, (_, c) in enumerate(WORDING)])
def test_wording_of_every_version_names_its_meaning(line, cause):
    assert explain_text(line + "\n").findings[0].cause == cause


WATCHDOG = ("[rank3]:[E1121 10:22:41.52 ProcessGroupNCCL.cpp:632] [Rank 3] Watchdog caught collective operation timeout: "
            "WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)={ms}) ran for {ran} milliseconds "
            "before timing out.\n")


def test_a_process_group_timeout_of_milliseconds_is_the_setting_first():
    ranked = explain_text(WATCHDOG.format(ms=1, ran=90)).findings[0].data["candidates"]
    assert ranked[0]["cause"] == "timeout_config", ranked
    assert any("under a minute" in reason for reason in ranked[0]["reordered_by"]), ranked[0]


def test_the_default_process_group_timeout_is_no_setting_fault():
    ranked = explain_text(WATCHDOG.format(ms=600000, ran=600013)).findings[0].data["candidates"]
    assert ranked[0]["cause"] != "timeout_config", ranked
    assert not any("under a minute" in reason for r in ranked for reason in r.get("reordered_by", [])), ranked


def test_the_old_spelling_of_the_nccl_id_exchange_is_read():
    # torch < 2.1 printed "retreiving".
    line = ("RuntimeError: [1] is setting up NCCL communicator and retreiving ncclUniqueId from [0] via c10d "
            "key-value store by key '0', but store->get('0') got error: Socket Timeout\n")
    top = explain_text(line).findings[0]
    assert top.data["signature"] == "nccl_unique_id_exchange" and top.confidence < 0.8


@pytest.mark.parametrize("joined", [False, True], ids=["one_line", "wrapped"])
def test_a_message_wrapped_by_a_terminal_reads_as_one(joined):
    message = ("RuntimeError: Timed out initializing process group in store based barrier on rank: 0, for key: "
               "store_based_barrier_key:1 (world_size=2, worker_count=1, timeout=0:30:00)")
    text = message[:120] + ("\n" if joined else "") + message[120:] + "\n"
    top = explain_text(text).findings[0]
    assert top.cause == "rank_missing" and "1 workers joined a world of 2" in top.title


def test_a_stopped_launcher_is_said_so_not_named_a_cause():
    top = explain_text("epoch 1 step 10 loss 0.3\nReceived Signals.SIGINT death signal, shutting down workers\n").findings[0]
    assert (top.id, top.cause) == ("log.W040", "unknown") and "SIGINT" in top.title


# -- meaning over frame ----------------------------------------------------------------------------

def test_a_recognised_exception_is_its_meaning_and_the_title_keeps_the_frame():
    top = explain_text(TRACE + "[rank1]: RuntimeError: No backend type associated with device type cpu\n").findings[0]
    assert top.cause == "cpu_tensor_on_nccl" and top.ranks == (1,)
    assert "rank 1 raised RuntimeError at /w/train.py:22" in top.title


def test_an_exception_that_means_nothing_distributed_is_worker_exception():
    top = explain_text(TRACE + "[rank1]: KeyError: 'labels'\n").findings[0]
    assert top.cause == "worker_exception" and "/w/train.py:22" in top.title


# -- who complained, who went quiet, who kept going ------------------------------------------------

def _watchdog(rank: int, stamp: str = "02:07:08") -> str:
    return (f"[rank{rank}]:[E321 {stamp}.408271257 ProcessGroupNCCL.cpp:607] [Rank {rank}] Watchdog caught "
            f"collective operation timeout: WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, NumelIn=466119168, "
            f"NumelOut=466119168, Timeout(ms)=600000) ran for 600060 milliseconds before timing out.\n")


BUSY = "Scanning labels /data/train.cache... 9120 images:  97%|█████████▋| 8846/9120 [10:12<00:19, 14.1it/s]\n"


def test_ranks_timing_out_while_rank_0s_progress_goes_on_is_the_straggler():
    """Ranks 1-3 time out in ALLREDUCE; rank 0, which prints without a prefix, goes on scanning."""
    text = BUSY.replace("97%", "12%") + _watchdog(1) + _watchdog(2) + _watchdog(3) + BUSY
    top = explain_text(text).findings[0]
    assert (top.cause, top.ranks) == ("straggler_rank", (0,)), (top.title, top.detail)
    assert "8846/9120" in top.detail          # the evidence line
    assert top.confidence < 0.8


def test_the_same_timeouts_with_rank_0_silent_before_them_do_not_name_a_straggler():
    text = BUSY.replace("97%", "12%") + _watchdog(1) + _watchdog(2) + _watchdog(3)
    top = explain_text(text).findings[0]
    assert top.cause != "straggler_rank" or top.confidence < 0.5
    assert top.confidence < 0.8


def test_a_rank_whose_own_lines_go_on_after_its_peers_timeout_is_the_straggler():
    text = "[rank0]: step 99 loss 0.1\n" + _watchdog(1) + "[rank0]: evaluating: 71%|███████   | 710/1000\n"
    top = explain_text(text).findings[0]
    assert (top.cause, top.ranks) == ("straggler_rank", (0,))


@pytest.mark.parametrize("later_s,busy", [(600, True), (30, False)], ids=["ten_minutes_later", "within_the_clock_margin"])
def test_per_rank_files_compare_by_time_with_a_margin_for_clocks_that_differ(tmp_path, later_s, busy):
    minutes, seconds = divmod(7 * 60 + 8 + later_s, 60)
    (tmp_path / "rank0.log").write_text("2024-03-21 02:00:00,000 INFO step 98 loss 0.2\n"
                                        f"2024-03-21 02:{minutes:02d}:{seconds:02d},000 INFO step 99 loss 0.1\n")
    (tmp_path / "rank1.log").write_text(_watchdog(1).replace("[rank1]:", ""))
    top = explain_files([str(tmp_path)]).findings[0]
    assert (top.cause == "straggler_rank" and top.ranks == (0,)) == busy, (top.cause, top.title)


def test_a_rank_past_its_loop_in_a_mismatch_is_uneven_inputs():
    """An iterable dataset with one batch less on rank 0: rank 0 all-reduces a metric after its loop
    while rank 1 still all-reduces gradients in backward; DETAIL calls it a shape mismatch."""
    def raised(rank: int, frames: str, mine: str, other: str) -> str:
        fp = ("CollectiveFingerPrint(SequenceNumber=9, OpType=ALLREDUCE, TensorShape=[{}], TensorDtypes=Float, "
              "TensorDeviceTypes=TensorOptions(dtype=float (default), device=cpu))")
        return (f"[rank{rank}]: Traceback (most recent call last):\n{frames}[rank{rank}]: RuntimeError: Detected "
                f"mismatch between collectives on ranks. Rank {rank} is running collective: {fp.format(mine)}, but "
                f"Rank {1 - rank} is running collective: {fp.format(other)}.\n")
    after_loop = ('[rank0]:   File "/w/train.py", line 40, in <module>\n[rank0]:     dist.all_reduce(total)\n'
                  '[rank0]:   File "/usr/lib/python3.10/site-packages/torch/distributed/distributed_c10d.py", '
                  'line 2501, in all_reduce\n[rank0]:     work = group.allreduce([tensor], opts)\n')
    backward = ('[rank1]:   File "/w/train.py", line 33, in <module>\n[rank1]:     loss.backward()\n'
                '[rank1]:   File "/usr/lib/python3.10/site-packages/torch/_tensor.py", line 581, in backward\n'
                '[rank1]:     torch.autograd.backward(\n')
    top = explain_text(raised(0, after_loop, "1", "18") + raised(1, backward, "18", "1")).findings[0]
    assert (top.cause, top.ranks) == ("uneven_inputs", (0,)), top.title
    assert [c["cause"] for c in top.data["candidates"]][:2] == ["uneven_inputs", "shape_mismatch"]
    assert top.confidence < 0.8


# -- bad input: a clear answer or a clear "cannot tell" ---------------------------------------------

def test_a_log_cut_inside_a_traceback_says_its_rank_raised_and_that_what_is_not_known():
    top = explain_text(TRACE).findings[0]
    assert top.ranks == (1,) and "the log ends inside this traceback" in top.title and top.confidence < 0.5


def test_two_ranks_raising_within_the_clock_margin_are_a_close_call(tmp_path):
    for rank, stamp, error in ((0, "10:00:40", "FileNotFoundError: ckpt.pt"), (1, "10:00:05", "ValueError: nan loss")):
        (tmp_path / f"rank{rank}.log").write_text(
            f"2024-05-01 {stamp},100 INFO step 10\nTraceback (most recent call last):\n"
            f'  File "/w/train.py", line {20 + rank}, in <module>\n    step()\n{error}\n')
    top = explain_files([str(tmp_path)]).findings[0]
    assert top.confidence <= 0.6 and "clocks that may differ cannot tell" in top.detail


def test_interleaved_tracebacks_without_rank_prefixes_give_an_answer_not_a_traceback():
    text = ("Traceback (most recent call last):\nTraceback (most recent call last):\n"
            '  File "train.py", line 9, in <module>\n  File "train.py", line 9, in <module>\n'
            "    torch.cuda.set_device(local_rank)\n    torch.cuda.set_device(local_rank)\n"
            "RuntimeError: CUDA error: invalid device ordinal\nRuntimeError: CUDA error: invalid device ordinal\n")
    assert explain_text(text).findings[0].cause == "invalid_device_ordinal"


def test_prefixes_a_viewer_or_ray_put_before_the_rank_are_read_through():
    numbered = "".join(f"[{100 + i}] {line}\n" for i, line in enumerate(
        (TRACE + "[rank1]: ValueError: bad batch\n").splitlines()))
    top = explain_text(numbered).findings[0]
    assert (top.cause, top.ranks) == ("worker_exception", (1,)) and "/w/train.py:22" in top.title
    ray = "".join(f"(RayTrainWorker pid=1979, ip=10.0.0.6) {line}\n" for line in
                  (TRACE + "[rank1]: ValueError: bad batch\n").splitlines())
    assert explain_text(ray).findings[0].ranks == (1,)


def test_the_reading_across_ranks_never_ends_in_a_traceback(monkeypatch):
    import distdoctor.explain as explain

    def broken(*args, **kwargs):
        raise RuntimeError("a bug")
    monkeypatch.setattr(explain, "job_findings", broken)
    report = explain_text(TRACE + "[rank1]: ValueError: bad batch\n")
    assert any(f.id == "core.W001" and "a bug" in f.detail for f in report.findings)


# -- the healthy twin: no alarm ---------------------------------------------------------------------

HEALTHY = """W0321 10:00:00.000000 123 torch/distributed/run.py:792] Setting OMP_NUM_THREADS environment variable for each process to be 1 in default
[W socket.cpp:601] [c10d] The IPv6 network addresses of (localhost, 29500) cannot be retrieved (gai error: -2 - Name or service not known).
[W socket.cpp:663] [c10d] The client socket has failed to connect to [localhost]:29500 (errno: 99 - Cannot assign requested address).
node1:124:130 [0] NCCL INFO Failed to open libibverbs.so[.1]
node1:124:130 [0] NCCL INFO NET/IB : No device found.
node1:124:130 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>
node1:124:130 [0] NCCL INFO comm 0x55d1 rank 0 nranks 2 cudaDev 0 busId 1000 commId 0x1 - Init COMPLETE
UserWarning: find_unused_parameters=True was specified in DDP constructor, but did not find any unused parameters in the forward pass.
[W Utils.hpp:164] Warning: Environment variable NCCL_ASYNC_ERROR_HANDLING is deprecated; use TORCH_NCCL_ASYNC_ERROR_HANDLING instead
INFO:torch.distributed.distributed_c10d:Rank 0: Completed store-based barrier for key:store_based_barrier_key:1 with 8 nodes.
epoch 0 step 100 loss 0.532
[rank0]:[W321 10:30:00.000000 124 ProcessGroupNCCL.cpp:1250] Warning: WARNING: process group has NOT been destroyed before we destruct ProcessGroupNCCL.
"""


def test_a_healthy_log_with_the_usual_warnings_raises_no_alarm():
    report = explain_text(HEALTHY)
    assert report.exit_code() == 0, [(f.id, f.title) for f in report.findings]
    assert "nothing failed" in report.findings[0].detail


@pytest.mark.parametrize("then", ["epoch 0 step 100 loss 0.53\n", ""], ids=["progress_after", "nothing_after"])
def test_a_host_without_ipv6_is_a_failure_only_if_the_job_did_not_go_on(then):
    warning = ("[W socket.cpp:601] [c10d] The IPv6 network addresses of (node-07, 29500) cannot be retrieved "
               "(gai error: -2 - Name or service not known).\n")
    report = explain_text(warning * 3 + then)
    assert (report.exit_code() == 0) == bool(then), [(f.id, f.title) for f in report.findings]


def test_a_real_nccl_log_from_a_gpu_machine_reads_right():
    """Two NCCL ranks on one GPU, recorded on an H100 (torch 2.11, NCCL 2.28.9) by tests/gpu."""
    from pathlib import Path

    recorded = Path(__file__).resolve().parents[1] / "gpu" / "recorded" / "nccl_two_ranks_one_gpu"
    if not recorded.is_dir():
        pytest.skip("tests/gpu/recorded is not in this checkout")
    top = explain_files([str(p) for p in sorted(recorded.glob("log-rank*.txt"))]).findings[0]
    assert top.cause == "duplicate_gpu" and set(top.ranks) == {0, 1} and top.confidence >= 0.8


# torch 1.9-1.13's DETAIL check (ProcessGroupWrapper.cpp): each rank raised with its own fingerprint only.
def _inconsistent(rank: int, fingerprint: str) -> str:
    return (f"[rank{rank}]: RuntimeError: Detected mismatch between collectives on ranks. Rank {rank} is running "
            f"inconsistent collective: CollectiveFingerPrint({fingerprint}\n")


SHAPED = "OpType=ALLGATHER, TensorShape=[{n}, 256], TensorDtypes=Float, TensorDeviceTypes=[CUDA]"


@pytest.mark.parametrize("fingerprints, cause", [
    ((SHAPED.format(n=41), SHAPED.format(n=40)), "shape_mismatch"),
    (("OpType=ALLREDUCE, TensorShape=[8], TensorDtypes=Float, TensorDeviceTypes=[CUDA]",
      "OpType=ALLREDUCE, TensorShape=[8], TensorDtypes=Half, TensorDeviceTypes=[CUDA]"), "dtype_mismatch"),
    (("OpType=BARRIER", "OpType=ALLREDUCE, TensorShape=[8], TensorDtypes=Float, TensorDeviceTypes=[CUDA]"),
     "collective_mismatch"),
], ids=["shape", "dtype", "op"])
def test_two_ranks_own_fingerprints_compared_name_what_differs(fingerprints, cause):
    top = explain_text(_inconsistent(0, fingerprints[0]) + _inconsistent(1, fingerprints[1])).findings[0]
    assert top.cause == cause and top.confidence >= 0.8 and sorted(top.ranks) == [0, 1], (top.title, top.confidence)


def test_a_fingerprint_wrapped_by_a_terminal_is_read_across_the_wrap():
    wrapped = "".join(_inconsistent(r, SHAPED.format(n=41 - r)).replace("TensorShape=", "TensorShape\n=") for r in (0, 1))
    assert explain_text(wrapped).findings[0].cause == "shape_mismatch"


def test_one_ranks_own_fingerprint_cannot_tell_which_aspect_differs():
    top = explain_text(_inconsistent(1, SHAPED.format(n=40))).findings[0]
    causes = [c["cause"] for c in top.data["candidates"]]
    assert top.confidence < 0.8 and {"collective_mismatch", "shape_mismatch", "dtype_mismatch"} <= set(causes), causes


def test_the_same_fingerprint_on_both_ranks_names_no_difference():
    # Each rank's line alike (a third rank's differed, its log not given): no aspect is claimed.
    top = explain_text(_inconsistent(0, SHAPED.format(n=40)) + _inconsistent(1, SHAPED.format(n=40))).findings[0]
    assert top.confidence < 0.8 and top.data["signature"] == "detail_fingerprint_of_rank", top.title


# Lightning's announcement (lightning/fabric/strategies/ddp.py: "Initializing distributed: GLOBAL_RANK:
# {global_rank}, MEMBER: {global_rank + 1}/{world_size}"), as two nodes that both started as node 0 print it.
def _announce(ranks, world, old=False):
    word = "initializing ddp" if old else "Initializing distributed"
    return "".join(f"{word}: GLOBAL_RANK: {r}, MEMBER: {r + 1}/{world}\n" for r in ranks)


STUCK_AFTER = ("Traceback (most recent call last):\n  File \"/w/fit.py\", line 9, in <module>\n    trainer.fit(model)\n"
               "torch.distributed.DistBackendError: [Rank 0] Watchdog caught collective operation timeout: "
               "WorkNCCL(SeqNum=1, OpType=BROADCAST, NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran for 1800043 "
               "milliseconds before timing out.\n")


@pytest.mark.parametrize("old", [False, True], ids=["1.6+", "before-1.6"])
def test_ranks_announced_twice_by_two_nodes_started_as_node_0_are_the_cause(old):
    text = "GPU available: True, used: True\n" + _announce([0, 0, 1, 1, 2, 2, 3, 3], 8, old) + STUCK_AFTER
    first = explain_text(text).findings[0]
    assert (first.cause, first.ranks, first.confidence) == ("rank_config_error", (0, 1, 2, 3), 0.8), first
    assert "ranks 4-7 of 8 never" in first.title
    # The one-line-alone reading is gone: what failed after it is listed after it.
    assert explain_text(text).findings[1].cause != "rank_config_error"


def test_every_rank_announced_once_is_no_claim():
    text = _announce([1, 0, 3, 2], 4) + STUCK_AFTER
    assert all(f.cause != "rank_config_error" for f in explain_text(text).findings)


def test_every_rank_announced_twice_and_none_missing_is_no_claim():
    # Two handlers printing each line, or two runs appended to one file: every rank twice, the world complete.
    text = _announce([0, 0, 1, 1, 2, 2, 3, 3], 4) + STUCK_AFTER
    assert all(f.cause != "rank_config_error" for f in explain_text(text).findings)


def test_a_restart_announcing_every_rank_again_after_a_failure_is_no_claim():
    # (two ranks of a world of 4 in this log: without the failure between, ranks 2-3 missing would make it 0.8)
    text = _announce([0, 1], 4) + STUCK_AFTER + "Restarting the job\n" + _announce([0, 1], 4) + STUCK_AFTER
    assert all(f.cause != "rank_config_error" for f in explain_text(text).findings)


def test_a_rank_announced_twice_with_the_whole_world_present_is_named_less_surely():
    text = _announce([0, 1, 1], 2) + STUCK_AFTER
    first = explain_text(text).findings[0]
    assert (first.cause, first.ranks, first.confidence) == ("rank_config_error", (1,), 0.6), first
