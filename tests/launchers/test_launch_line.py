"""`distdoctor check -- <launch line>`: what torchrun / srun / mpirun would hang on, before they run."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
import time

import pytest

from conftest import child_env
from distdoctor.machine.launch_line import LaunchLineError, parse_launch_line
from distdoctor.machine.launchers import planned_launch

DEADLINE_S = 30


def check_line(*line: str, timeout: float = DEADLINE_S) -> tuple[subprocess.CompletedProcess, dict | None, float]:
    command = [sys.executable, "-m", "distdoctor", "check", "--format", "json", "--timeout", str(timeout), "--", *line]
    start = time.monotonic()
    result = subprocess.run(command, env=child_env(), capture_output=True, text=True, timeout=timeout + 30)
    elapsed = time.monotonic() - start
    report = json.loads(result.stdout) if result.stdout.strip().startswith("{") else None
    return result, report, elapsed


def ids(report: dict) -> set[str]:
    return {f["id"] for f in report["findings"]}


def no_rank_noise(report: dict) -> None:
    assert not ids(report) & {"launch.C001", "launch.C002"}, report["findings"]


# -- reading the line -----------------------------------------------------------------------------

def test_torchrun_line_both_spellings():
    plan = parse_launch_line("torchrun --nnodes=2 --nproc_per_node 8 --rdzv-endpoint node1:1234 --node-rank 1 train.py --lr 3".split())
    assert (plan.nnodes, plan.nproc_per_node, plan.node_rank, plan.master_addr, plan.master_port) == (2, 8, 1, "node1", 1234)
    launch = planned_launch(plan, {})
    assert (launch.world_size.value, launch.local_world_size.value, launch.rank.present) == (16, 8, False)


def test_module_form_ipv6_endpoint_and_elastic_range():
    plan = parse_launch_line([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2:4", "--rdzv-backend", "c10d",
                              "--rdzv-endpoint", "[fd00::2]", "train.py"])
    assert (plan.nnodes, plan.rdzv_backend, plan.master_addr, plan.master_port) == (2, "c10d", "fd00::2", 29400)


def test_single_node_torchrun_without_endpoint_has_no_fixed_port():
    plan = parse_launch_line(["torchrun", "--nproc-per-node", "2", "train.py"])
    assert plan.master_port == 0 and planned_launch(plan, {}).master_port.value is None


def test_srun_line_with_nested_torchrun_and_mpirun_hosts():
    plan = parse_launch_line("srun -N 2 --ntasks-per-node 4 torchrun --nproc-per-node 4 x.py".split())
    assert (plan.tasks, plan.tasks_per_node, plan.inner.nproc_per_node) == (8, 4, 4)
    plan = parse_launch_line("mpirun --allow-run-as-root -np 4 -H a:2,b:2 python x.py".split())
    assert (plan.tasks, plan.tasks_per_node, plan.hosts) == (4, 2, ("a", "b"))


@pytest.mark.parametrize("line", [
    "bash train.sh", "torchrun --nproc-per-node many x.py", "torchrun --rdzv-endpoint :1 x.py",
    "torchrun --nnodes 2 --rdzv-endpoint h:99999 x.py", "torchrun --nproc-per-node", "mpirun --hostfile hf python x.py",
])
def test_unreadable_lines_are_usage_errors(line):
    with pytest.raises(LaunchLineError):
        parse_launch_line(line.split())


def test_cli_unreadable_line_exits_2():
    result, report, _ = check_line("bash", "train.sh")
    assert result.returncode == 2 and report is None and "not a launcher" in result.stderr


# -- what the launcher would hang on --------------------------------------------------------------

def test_unresolvable_endpoint_is_named_without_rank_noise():
    result, report, elapsed = check_line("torchrun", "--nnodes", "2", "--nproc-per-node", "2", "--rdzv-endpoint",
                                         "no-such-host.invalid:29400", "train.py")
    assert result.returncode == 1 and "net.C001" in ids(report)
    no_rank_noise(report)
    assert report["world"]["size"] == 4 and elapsed < DEADLINE_S + 10


def test_unreachable_endpoint_is_named():
    # A network namespace of its own with only loopback: the endpoint's network has no route.
    if shutil.which("unshare") is None or shutil.which("ip") is None or os.geteuid() != 0:
        pytest.skip("needs root, unshare and ip (iproute2) for a network namespace")
    command = ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$@"', "sh",
               sys.executable, "-m", "distdoctor", "check", "--format", "json", "--timeout", str(DEADLINE_S), "--",
               "torchrun", "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-endpoint", "10.231.77.7:29400", "train.py"]
    result = subprocess.run(command, env=child_env(), capture_output=True, text=True, timeout=DEADLINE_S + 30)
    report = json.loads(result.stdout)
    (unreachable,) = [f for f in report["findings"] if f["id"] == "net.E011"]
    assert result.returncode == 1 and "No route" in unreachable["title"], report["findings"]
    no_rank_noise(report)


@pytest.fixture
def http_port():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_foreign_service_on_the_endpoint_is_named(http_port):
    result, report, _ = check_line("torchrun", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                                   f"127.0.0.1:{http_port}", "train.py")
    assert result.returncode == 1 and "net.E014" in ids(report), report["findings"]
    no_rank_noise(report)


def test_c10d_store_on_the_endpoint_is_fine_for_c10d_but_not_for_static():
    from datetime import timedelta

    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    endpoint = f"127.0.0.1:{store.port}"
    try:
        _, report, _ = check_line("torchrun", "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "train.py")
        assert not ids(report) & {"net.E013", "net.E014"}, report["findings"]
        _, report, _ = check_line("torchrun", "--rdzv-endpoint", endpoint, "train.py")
        (held,) = [f for f in report["findings"] if f["id"] == "net.E013"]
        assert held["data"]["is_c10d_store"] is True
    finally:
        del store


def test_torchrun_nested_in_a_multi_task_srun_line():
    _, report, _ = check_line("srun", "-n", "2", "torchrun", "--nproc-per-node", "2", "train.py")
    assert "launch.E004" in ids(report)
    no_rank_noise(report)


def test_more_local_ranks_than_gpus_in_the_line_is_named():
    # GPUs are mocked (this machine has none); the line and the check are real.
    from distdoctor.checks import device
    from distdoctor.fakes import FakeProbes, fake_context, fake_gpus

    line = ["torchrun", "--nnodes", "2", "--nproc-per-node", "8", "--rdzv-endpoint", "node-a:29400", "train.py"]
    ctx = fake_context({}, probes=FakeProbes(gpu_list=fake_gpus(4)), launch_line=line)
    found = {f.id: f for f in device.local_rank_fits_gpus(ctx)}
    assert "device.E005" in found and "8 ranks on this node but 4" in found["device.E005"].title
    ok = fake_context({}, probes=FakeProbes(gpu_list=fake_gpus(8)), launch_line=line)
    assert list(device.local_rank_fits_gpus(ok)) == []
