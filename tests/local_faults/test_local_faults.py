"""Each fault of issue 3's "done when", produced for real on this machine."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys

import pytest

from tests.conftest import free_port, recent_startup_s

from .conftest import base_env, check_local, engine_local, run

pytestmark = pytest.mark.timeout(120)

WORKER = dict(RANK="1", WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")


def torchrun_worker_env(port: int, **extra: str) -> dict[str, str]:
    """What torchrun's agent gives a worker when it shares its own store (torch >= 2.1)."""
    return base_env(
        TORCHELASTIC_RUN_ID="fault-test", TORCHELASTIC_RESTART_COUNT="0", TORCHELASTIC_USE_AGENT_STORE="True",
        GROUP_RANK="0", ROLE_RANK="1", RANK="1", WORLD_SIZE="2", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2",
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), **extra,
    )


def test_master_addr_does_not_resolve():
    out = check_local(base_env(MASTER_ADDR="no-such-host.invalid", MASTER_PORT="29500", **WORKER))
    finding = out.one("hostname_unresolvable")
    assert finding["id"] == "net.C001" and finding["severity"] == "critical"
    assert "no-such-host.invalid" in finding["title"]
    assert "MASTER_ADDR" in finding["remediation"]
    assert out.returncode == 1


def test_port_with_no_listener():
    port = free_port()
    out = check_local(torchrun_worker_env(port))
    finding = out.one("master_unreachable")
    assert finding["id"] == "net.E011" and "refused" in finding["title"]
    assert "--rdzv-endpoint" in finding["remediation"]


def test_port_held_by_another_process_names_the_pid(spawn):
    port = free_port()
    holder = spawn([sys.executable, "-c",
                    f"import socket,time; s=socket.socket(); s.bind(('0.0.0.0',{port})); s.listen(); time.sleep(120)"],
                   ready_port=port)
    out = check_local(base_env(RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)))
    finding = out.one("port_in_use")
    assert finding["id"] == "net.E013"
    assert f"PID {holder.pid}" in finding["title"]
    assert f"kill {holder.pid}" in finding["remediation"] and "MASTER_PORT" in finding["remediation"]


def test_port_held_by_a_plain_http_server(spawn, tmp_path):
    port = free_port()
    server = spawn([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(tmp_path)],
                   ready_port=port)
    out = check_local(base_env(RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)))
    finding = out.one("foreign_service_on_port")
    assert finding["id"] == "net.E014" and "HTTP" in finding["title"]
    assert str(server.pid) in finding["title"]
    assert "MASTER_PORT" in finding["remediation"]
    port_check = next(c for c in out.report["checks"] if c["name"] == "network.rendezvous_port")
    assert port_check["duration_s"] < 3.0 + recent_startup_s()  # a loaded machine is slower


def test_http_server_seen_from_a_worker_is_foreign(spawn, tmp_path):
    port = free_port()
    spawn([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(tmp_path)], ready_port=port)
    out = check_local(torchrun_worker_env(port))
    assert out.one("foreign_service_on_port")["id"] == "net.E014"


STORE = """
import datetime, sys, time
from torch.distributed import TCPStore
store = TCPStore('127.0.0.1', int(sys.argv[1]), 1, True, timeout=datetime.timedelta(seconds=30), wait_for_workers=False)
time.sleep(120)
"""


def test_torchrun_agent_store_on_master_port_is_not_a_fault(spawn):
    port = free_port()
    spawn([sys.executable, "-c", STORE, str(port)], ready_port=port)
    out = check_local(torchrun_worker_env(port))
    causes = {f["cause"] for f in out.report["findings"]}
    assert not causes & {"port_in_use", "foreign_service_on_port", "master_unreachable"}, out.report["findings"]


def test_leftover_store_from_an_earlier_run_is_port_in_use(spawn):
    port = free_port()
    proc = spawn([sys.executable, "-c", STORE, str(port)], ready_port=port)
    out = check_local(base_env(RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)))
    finding = out.one("port_in_use")
    assert str(proc.pid) in finding["title"] and "c10d store" in finding["detail"]


def test_socket_ifname_that_does_not_exist():
    port = free_port()
    out = check_local(base_env(GLOO_SOCKET_IFNAME="nosuch0", NCCL_SOCKET_IFNAME="=nosuch1",
                               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1",
                               LOCAL_RANK="0", LOCAL_WORLD_SIZE="1"))
    found = out.findings("wrong_interface", "net.E008")
    variables = {f["data"]["variable"] for f in found}
    assert variables == {"GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"}
    for finding in found:
        assert "does not exist" in finding["title"] or "matches no interface" in finding["title"]
        assert finding["data"]["variable"] + "=" in finding["remediation"]


def test_multi_host_world_with_master_addr_localhost():
    port = free_port()
    out = check_local(base_env(MASTER_ADDR="localhost", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="4",
                               LOCAL_RANK="0", LOCAL_WORLD_SIZE="2"))
    finding = out.one("wrong_interface")
    assert finding["id"] == "net.E005"
    suggested = finding["data"]["suggested_address"]
    assert suggested and not suggested.startswith("127.")
    assert suggested in finding["remediation"]


def test_nccl_on_this_gpu_less_machine():
    out = check_local(base_env(), "--backend", "nccl")
    finding = out.one("no_gpu_for_nccl")
    assert finding["id"] == "device.C001" and finding["severity"] == "critical"
    assert "gloo" in finding["remediation"]
    assert out.returncode == 1


def _can_unshare() -> str | None:
    if os.geteuid() != 0:
        return "needs root to mount a tmpfs"
    if not shutil.which("unshare"):
        return "unshare is not installed"
    probe = subprocess.run(["unshare", "--mount", "true"], capture_output=True)
    return None if probe.returncode == 0 else f"unshare --mount is not permitted: {probe.stderr.decode().strip()}"


@pytest.mark.skipif(_can_unshare() is not None, reason=str(_can_unshare()))
def test_tiny_dev_shm():
    # A private mount namespace: the 8 MiB tmpfs hides /dev/shm for this process tree only and
    # disappears with it, so nothing needs unmounting on the host.
    script = (
        "mount -t tmpfs -o size=8m tmpfs /dev/shm && "
        f"exec {sys.executable} -m distdoctor check --stage local --format json"
    )
    out = run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script], base_env())
    finding = out.one("shm_too_small")
    assert finding["id"] == "system.E001" and "8 MiB" in finding["title"]
    assert "--shm-size" in finding["remediation"]


def test_low_open_files_limit():
    def limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (200, 200))

    out = check_local(base_env(), preexec=limit)
    finding = out.one("resource_limit")
    assert finding["id"] == "system.E005" and "200" in finding["title"]
    assert "ulimit -n" in finding["remediation"]


def test_local_rank_beyond_the_gpus():
    port = free_port()
    out = engine_local(base_env(DISTDOCTOR_TEST_FAKE_GPUS="2", TORCHELASTIC_RUN_ID="x", TORCHELASTIC_RESTART_COUNT="0",
                                RANK="3", WORLD_SIZE="4", LOCAL_RANK="3", LOCAL_WORLD_SIZE="4",
                                MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)))
    finding = out.one("invalid_device_ordinal")
    assert finding["id"] == "device.C003" and "LOCAL_RANK=3" in finding["title"]
    assert "--nproc-per-node=2" in finding["remediation"]
    assert out.one("launcher_misuse")["id"] == "device.E005"


def test_deprecated_launcher_argv():
    port = free_port()
    out = engine_local(base_env(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)), "--local_rank=0")
    finding = out.one("launcher_misuse")
    assert finding["id"] == "launch.W003" and "--local_rank=0" in finding["title"]
    assert "torchrun --nproc-per-node" in finding["remediation"]


def test_real_torch_distributed_launch():
    # The real deprecated launcher running the real CLI: it runs the elastic agent and puts
    # --local-rank=0 right after `-m distdoctor`, before the command.
    env = base_env(PYTHONWARNINGS="ignore")
    cmd = [sys.executable, "-m", "torch.distributed.launch", "--nproc-per-node=1", "--master-port", str(free_port()),
           "-m", "distdoctor", "check", "--stage", "local", "--format", "json"]
    out = run(cmd, env)
    finding = out.one("launcher_misuse")
    assert finding["id"] == "launch.W003" and "--local-rank=0" in finding["title"]


def test_torchrun_inside_srun():
    port = free_port()
    env = base_env(
        SLURM_JOB_ID="4242", SLURM_STEP_ID="0", SLURM_PROCID="0", SLURM_LOCALID="0", SLURM_NODEID="0",
        SLURM_NTASKS="4", SLURM_NNODES="1", SLURM_NTASKS_PER_NODE="4", SLURM_JOB_NODELIST="node1",
        TORCHELASTIC_RUN_ID="4242", TORCHELASTIC_RESTART_COUNT="0", GROUP_RANK="0", ROLE_RANK="0",
        RANK="0", WORLD_SIZE="4", LOCAL_RANK="0", LOCAL_WORLD_SIZE="4", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
    )
    out = check_local(env)
    finding = out.one("launcher_misuse")
    assert finding["id"] == "launch.E004" and "4 tasks per node" in finding["title"]
    assert "--ntasks-per-node=1" in finding["remediation"]
