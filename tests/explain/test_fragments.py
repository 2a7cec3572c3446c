"""No distributed failure without candidates: every signature of a torch.distributed failure, by its message
or by its frames alone when the message was cut off, yields ranked candidate causes, each with the test
that tells it apart; `unknown` is left for logs with nothing of torch.distributed in them."""

from __future__ import annotations

import pytest

from distdoctor.explain import explain_text

LIB = "/usr/local/lib/python3.10/dist-packages/torch"
# Texts as torch 2.x (c10d, ProcessGroupNCCL, Gloo, torchrun) and Python print them; the C++ frames are
# those of torch's sources (WorkNCCL::checkTimeout, watchdogHandler, ncclCommWatchdog).
FRAGMENTS = {
    "watchdog_by_frames": (
        "Exception raised from checkTimeout at ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:565 (most recent call first):\n"
        f"frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x57 (0x7f1 in {LIB}/lib/libc10.so)\n"
        "frame #1: c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(std::optional<std::chrono::duration<long, "
        f"std::ratio<1l, 1000l> > >) + 0x1d2 (0x7f2 in {LIB}/lib/libtorch_cuda.so)\n"
        f"frame #2: c10d::ProcessGroupNCCL::watchdogHandler() + 0x233 (0x7f3 in {LIB}/lib/libtorch_cuda.so)\n"
        f"frame #3: c10d::ProcessGroupNCCL::ncclCommWatchdog() + 0x10c (0x7f4 in {LIB}/lib/libtorch_cuda.so)\n"),
    "watchdog_thread_by_frames": (
        "terminate called after throwing an instance of 'c10::DistBackendError'\n"
        f"frame #4: c10d::ProcessGroupNCCL::WorkNCCL::isCompleted() + 0x58 (0x7e0 in {LIB}/lib/libtorch_cuda.so)\n"
        f"frame #5: c10d::ProcessGroupNCCL::watchdogHandler() + 0x1da (0x7e1 in {LIB}/lib/libtorch_cuda.so)\n"
        f"frame #6: c10d::ProcessGroupNCCL::ncclCommWatchdog() + 0x14d (0x7e2 in {LIB}/lib/libtorch_cuda.so)\n"),
    "store_construction_cut": (
        "Traceback (most recent call last):\n"
        '  File "/home/u/train.py", line 12, in <module>\n    dist.init_process_group("nccl")\n'
        f'  File "{LIB}/distributed/distributed_c10d.py", line 1525, in init_process_group\n'
        "    store, rank, world_size = next(rendezvous_iterator)\n"
        f'  File "{LIB}/distributed/rendezvous.py", line 269, in _env_rendezvous_handler\n'
        "    store = _create_c10d_store(master_addr, master_port, rank, world_size, timeout, use_libuv)\n"
        f'  File "{LIB}/distributed/rendezvous.py", line 189, in _create_c10d_store\n'
        "    return TCPStore(\n"),
    "errno_28": (
        "[rank2]: Traceback (most recent call last):\n"
        '[rank2]:   File "/home/u/train.py", line 88, in <module>\n[rank2]:     save_checkpoint(model, step)\n'
        '[rank2]:   File "/home/u/train.py", line 40, in save_checkpoint\n[rank2]:     torch.save(state, path)\n'
        "[rank2]: OSError: [Errno 28] No space left on device: '/scratch/ckpt/step_4000.pt'\n"),
    "errno_24": "[rank0]: OSError: [Errno 24] Too many open files: '/data/shard_0041.bin'\n",
    "nccl_system_error_alone": "RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, unhandled system error, NCCL version 2.14.3\n",
    "nccl_internal_error": "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, internal error - please report this issue to the NCCL developers, NCCL version 2.19.3\nncclInternalError: Internal check failed.\n",
    "nccl_remote_error": "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, remote process exited or there was a network error, NCCL version 2.19.3\nncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.\n",
    "launcher_lines_only": (
        "E1127 10:00:00.000000 4242 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) "
        "local_rank: 0 (pid: 4243) of binary: /usr/bin/python3\n"
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
        "============================================================\ntrain.py FAILED\n"
        "------------------------------------------------------------\nRoot Cause (first observed failure):\n[0]:\n"
        "  time      : 2026-11-27_10:00:00\n  host      : node-1\n  rank      : 0 (local_rank: 0)\n"
        "  exitcode  : 1 (pid: 4243)\n  error_file: <N/A>\n"
        "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html\n"
        "============================================================\n"),
    "store_wait": "torch.distributed.DistStoreError: wait timeout after 30000ms, keys: /default_pg/0//cuda//0/1\n",
    "store_connect": "torch.distributed.DistNetworkError: The client socket has timed out after 1800000ms while trying to connect to (10.0.0.1, 29500).\n",
    "socket_timeout": "RuntimeError: Socket Timeout\n",
    "gloo_recv_timeout": "RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 1800000ms for recv operation to complete\n",
    "watchdog_message": "[rank1]:[E1127 10:00:00.0 ProcessGroupNCCL.cpp:607] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=812, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran for 1800083 milliseconds before timing out.\n",
    "connection_reset": "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error [10.0.0.2]:43210: Connection reset by peer\n",
    "connection_closed": "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection closed by peer [10.0.0.2]:43210\n",
    "connection_refused": "RuntimeError: Gloo connectFullMesh failed with [../third_party/gloo/gloo/transport/tcp/pair.cc:144] connect [10.0.0.2]:47229: Connection refused\n",
    "sigkill": "torch.multiprocessing.spawn.ProcessExitedException: process 1 terminated with signal SIGKILL\n",
    "exitcode_9": "E1127 10:00:00.000000 4242 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: -9) local_rank: 1 (pid: 4244) of binary: /usr/bin/python3\n",
    "address_in_use": "RuntimeError: The server socket has failed to listen on any local network address. port: 29500, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use\n",
    "unrecognised": (
        "[rank0]: Traceback (most recent call last):\n"
        '[rank0]:   File "/home/u/train.py", line 30, in <module>\n[rank0]:     dist.all_gather_object(out, obj)\n'
        f'[rank0]:   File "{LIB}/distributed/distributed_c10d.py", line 2440, in all_gather_object\n'
        "[rank0]:     object_list[i] = _tensor_to_object(tensor, tensor_size, group)\n"
        "[rank0]: RuntimeError: [../torch/csrc/distributed/c10d/ProcessGroupWrapper.cpp:99] something the catalog never saw\n"),
}


@pytest.mark.parametrize("name", sorted(FRAGMENTS))
def test_a_distributed_failure_yields_ranked_candidates_each_with_its_tell(name):
    report = explain_text(FRAGMENTS[name])
    top = report.findings[0]
    candidates = top.data.get("candidates") or []
    assert top.cause != "unknown" and top.id != "log.W030", (name, top.id, top.title)
    assert len({c["cause"] for c in candidates}) >= 3, (name, top.title, candidates)
    assert all(c["tell"] for c in candidates), candidates
    assert [c["confidence"] for c in candidates] == sorted((c["confidence"] for c in candidates), reverse=True)
    assert top.cause == candidates[0]["cause"]


def test_fragments_known_by_their_frames_are_read_as_what_the_frames_show():
    watchdog = explain_text(FRAGMENTS["watchdog_by_frames"]).findings[0]
    assert watchdog.data["signature"] == "nccl_watchdog_frames"
    store = explain_text(FRAGMENTS["store_construction_cut"]).findings[0]
    assert store.data["signature"] == "store_construction_frames"
    disk = explain_text(FRAGMENTS["errno_28"]).findings[0]
    assert disk.cause == "resource_limit" and disk.ranks == (2,) and "train.py:40" in disk.title, disk.title


@pytest.mark.parametrize("text", [
    "Traceback (most recent call last):\n  File \"/home/u/prep.py\", line 3, in <module>\n    main()\n"
    "ValueError: bad config key 'lr'\n",
    "epoch 1 step 10 loss 2.31\nepoch 1 step 20 loss 2.05\nNCCL INFO Channel 00/02 : 0 1\nepoch 1 step 30 loss 1.98\n",
    "",
])
def test_logs_without_a_distributed_failure_get_no_invented_cause(text):
    report = explain_text(text)
    top = report.findings[0]
    assert top.data.get("signature") != "distributed_unrecognised"
    assert top.cause in ("unknown", "worker_exception") and not top.data.get("candidates"), (top.id, top.title)


def test_a_traceback_cut_inside_a_collective_without_its_exception_line_gets_candidates():
    cut = ('Traceback (most recent call last):\n  File "/home/u/train.py", line 30, in <module>\n    dist.all_reduce(t)\n'
           f'  File "{LIB}/distributed/distributed_c10d.py", line 3252, in all_reduce\n    work.wait()\n')
    top = explain_text(cut).findings[0]
    assert top.data["signature"] == "distributed_unrecognised" and len(top.data["candidates"]) >= 3
    assert top.confidence < 0.5
