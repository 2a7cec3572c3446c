"""distdoctor.init_process_group for real: processes on loopback, faults produced, not mocked."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import free_port, measured_startup_s, slack_s

pytestmark = pytest.mark.multiproc
SCRIPT = str(Path(__file__).with_name("init_script.py"))


def launch(ranks: list[int], world_size: int, port: int, rdzv_timeout: float, deadline_s: float = 60,
           extra: tuple[str, ...] = (), env_extra: dict[str, str] | None = None, head_start_s: float = 0) -> list[dict]:
    """Start one process per entry of ranks (the first head_start_s before the others); wait with a
    deadline; kill by PID whatever is left."""
    procs = []
    try:
        for i, rank in enumerate(ranks):
            if i == 1:
                time.sleep(head_start_s)
            env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size),
                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), **(env_extra or {})}
            procs.append(subprocess.Popen([sys.executable, SCRIPT, str(rdzv_timeout), *extra], env=env, text=True,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True))
        end = time.monotonic() + deadline_s
        outputs = []
        for proc in procs:
            out, err = proc.communicate(timeout=max(1, end - time.monotonic()))
            lines = [line for line in out.splitlines() if line.startswith("{")]
            assert lines, f"no result from pid {proc.pid}: rc={proc.returncode}\n{out}\n{err[-3000:]}"
            outputs.append(json.loads(lines[-1]))
        return outputs
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


def ids(result: dict) -> list[str]:
    return [f["id"] for f in result["findings"]]


def test_success_is_torchs_group():
    results = launch([0, 1], 2, free_port(), rdzv_timeout=30)
    for rank, result in enumerate(results):
        assert result["raised"] is False, result
        assert (result["sum"], result["backend"], result["world_size"], result["rank"]) == (2.0, "gloo", 2, rank)


def test_tcp_init_method_with_rank_arguments():
    results = launch([0, 1], 2, free_port(), rdzv_timeout=30, extra=("tcp", "no-local-checks"))
    assert [(r["raised"], r["sum"]) for r in results] == [(False, 2.0), (False, 2.0)], results


# extended: test_missing_rank_is_named_within_the_timeout covers init.E001 through the same open_store/check_in;
# tcp:// differs only in resolve_target, which test_tcp_init_method_with_rank_arguments keeps covered
@pytest.mark.extended
def test_missing_rank_over_tcp_init_method():
    (result,) = launch([0], 2, free_port(), rdzv_timeout=3, extra=("tcp", "no-local-checks"))
    assert ids(result) == ["init.E001"] and result["findings"][0]["ranks"] == [1]


def test_wrong_interface_is_caught_by_the_local_checks(monkeypatch):
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "nonexist0")
    (result,) = launch([0], 2, free_port(), rdzv_timeout=5)
    assert result["raised"] and [f["cause"] for f in result["findings"]] == ["wrong_interface"], result
    assert result["elapsed"] < 5 + slack_s(measured_startup_s())


def test_missing_rank_is_named_within_the_timeout():
    (result,) = launch([0], 2, free_port(), rdzv_timeout=4)
    assert result["raised"] and ids(result) == ["init.E001"]
    finding = result["findings"][0]
    assert finding["cause"] == "rank_missing" and finding["ranks"] == [1]
    assert "Rank 1 never checked in (1 of 2 ranks arrived)" in result["message"]
    # within its timeout: local checks (bounded on their own) + 4 s, not torch's 30 minutes
    assert result["elapsed"] < 4 + 10 + slack_s(measured_startup_s()), result["elapsed"]


def test_rank_0_missing_means_no_store_for_the_others():
    start = time.monotonic()
    (result,) = launch([1], 2, free_port(), rdzv_timeout=3)
    assert result["raised"] and ids(result) == ["init.E002"], result
    assert result["findings"][0]["cause"] == "master_unreachable"
    assert "nothing listens there" in result["findings"][0]["title"]
    assert time.monotonic() - start < 30 + slack_s(measured_startup_s())


@pytest.mark.parametrize("local_checks", [True, False], ids=["local-checks-first", "store-bind"])
def test_port_in_use_at_rank_0(local_checks):
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen(1)
        port = squatter.getsockname()[1]
        (result,) = launch([0], 2, port, rdzv_timeout=5, extra=() if local_checks else ("no-local-checks",))
    assert result["raised"], result
    # The local checks (whichever check it is) see it first; without them, the store's bind does.
    assert [f["cause"] for f in result["findings"]] == ["port_in_use"], result
    if not local_checks:
        assert ids(result) == ["init.E003"] and str(port) in result["findings"][0]["title"]


def test_two_processes_claiming_one_rank():
    # World of 3 where rank 2 never comes: rank 0 waits, so both rank-1 claims arrive before its
    # verdict. (A duplicate that arrives after rank 0 decided finds the group formed or gone.)
    results = launch([0, 1, 1], 3, free_port(), rdzv_timeout=8)
    assert all(r["raised"] for r in results), results
    assert all("init.E004" in ids(r) for r in results), results
    for r in results:
        duplicate = next(f for f in r["findings"] if f["id"] == "init.E004")
        assert duplicate["ranks"] == [1] and duplicate["cause"] == "rank_config_error"
    # rank 0 and the first rank 1 also name the rank that never came
    assert sum(ids(r) == ["init.E001", "init.E004"] for r in results) == 2, results


def test_world_size_larger_than_the_processes_is_a_missing_rank_not_an_interface():
    # WORLD_SIZE=3 with two processes and LOCAL_WORLD_SIZE=2 does not say "a second host":
    # the sizes do not add up, and the check-in names the rank that never came.
    results = launch([0, 1], 3, free_port(), rdzv_timeout=6, env_extra={"LOCAL_WORLD_SIZE": "2"})
    assert all(r["raised"] for r in results), results
    assert not any(f["cause"] == "wrong_interface" for r in results for f in r["findings"]), results
    missing = next(f for f in results[0]["findings"] if f["id"] == "init.E001")
    assert missing["cause"] == "rank_missing" and missing["ranks"] == [2], missing


def test_a_rank_whose_deadline_comes_before_rank_0s_names_the_missing_rank_too():
    # Each rank's deadline runs on its own clock. Rank 1 starts 3 s before rank 0, so it gives up
    # before rank 0 decides: its verdict is what the roster shows at that moment (rank 2 never
    # came), not "rank 0 is stuck", and rank 0 reports the same.
    results = launch([1, 0], 3, free_port(), rdzv_timeout=6, head_start_s=3)
    for result in results:
        missing = next(f for f in result["findings"] if f["id"] == "init.E001")
        assert missing["cause"] == "rank_missing" and missing["ranks"] == [2], result


def test_a_rank_started_long_before_rank_0_still_forms_the_world():
    # The healthy twin: the same head start, every rank there.
    results = launch([1, 0], 2, free_port(), rdzv_timeout=6, head_start_s=3)
    assert [(r["raised"], r["sum"]) for r in results] == [(False, 2.0), (False, 2.0)], results


@pytest.mark.parametrize("service", ["silent", "http"])
def test_a_foreign_service_on_master_port_is_bounded_on_every_rank(service):
    # The port's holder accepts connections: silent (like `nc -l`), or a web server answering
    # every request. torch's TCPStore client would wait on it for its whole timeout; each rank
    # must raise within its rendezvous timeout (+ the local checks, bounded on their own).
    import http.server
    import threading

    if service == "http":
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        port, close = server.server_address[1], server.shutdown
    else:
        squatter = socket.socket()
        squatter.bind(("127.0.0.1", 0))
        squatter.listen(64)
        port, close = squatter.getsockname()[1], squatter.close
    try:
        start = time.monotonic()
        results = launch([0, 1], 2, port, rdzv_timeout=5, extra=("no-local-checks",), deadline_s=40)
        took = time.monotonic() - start
    finally:
        close()
    assert all(r["raised"] for r in results), results
    assert ids(results[0]) == ["init.E003"], results[0]
    expected = "init.E009" if service == "http" else "init.E002"
    assert ids(results[1]) == [expected], results[1]
    # elapsed counts from before torch is imported (seconds on a loaded machine: 18 s once at load 10)
    assert max(r["elapsed"] for r in results) < 5 + 9 + slack_s(measured_startup_s()), results
    assert took < 30
