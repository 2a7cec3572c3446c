"""Every finding ID of the local checks, produced with a fake context (no real machine)."""

from __future__ import annotations

import json

import pytest

from distdoctor.checks import backend, device, launch, network, system, timeouts
from distdoctor.core.config import load_config
from distdoctor.fakes import FakeProbes, fake_context, fake_gpus
from distdoctor.machine.service_identity import C10D_STORE, FOREIGN, SILENT, PortIdentity
from distdoctor.machine.probes import GPU, Interface, Unknown
from distdoctor.core.registry import REGISTRY

AREAS = ("launch", "net", "backend", "device", "system", "timeouts")
MiB, GiB = 2**20, 2**30

WORKER = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "10.0.0.9", "MASTER_PORT": "29500"}
MASTER = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
MULTI = {"RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", "MASTER_PORT": "29500"}
TORCHRUN = {"TORCHELASTIC_RUN_ID": "r", "TORCHELASTIC_RESTART_COUNT": "0", "GROUP_RANK": "0", "ROLE_RANK": "0"}
AGENT_WORKER = {**TORCHRUN, **WORKER, "TORCHELASTIC_USE_AGENT_STORE": "True"}
SLURM = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}
NCCL_BUILT = {"torch": "2.13.0", "cuda": "12.6", "distributed": True, "nccl": "2.27.3",
              "backends": {"gloo": True, "nccl": True, "mpi": False, "ucc": False, "xccl": False}}
CPU_TORCH = {"torch": "2.13.0+cpu", "cuda": None, "distributed": True, "nccl": None,
             "backends": {"gloo": True, "nccl": False, "mpi": False, "ucc": False, "xccl": False}}
NICS = {
    "lo": Interface("lo", True, ("127.0.0.1",), ("::1",), True),
    "docker0": Interface("docker0", True, ("172.17.0.1",)),
    "veth9": Interface("veth9", True, ("169.254.3.3",)),
    "eth0": Interface("eth0", True, ("10.0.0.1",)),
    "eth1": Interface("eth1", False, ("10.1.0.1",)),
}
HTTP = PortIdentity(FOREIGN, "answers HTTP", "HTTP/1.0 200 OK", "http")


def findings(check, env=None, argv=("script.py",), backend_=None, **probe_fields):
    env = env or {}
    # DISTDOCTOR_* variables in the env configure the run, as they do for real.
    config = load_config({"backend": backend_}, env=env, use_pyproject=False)
    ctx = fake_context(env=env, probes=FakeProbes(**probe_fields), config=config, argv=argv)
    return list(check(ctx) or ())


# (expected ID, check, env, extra: argv / backend / probe fields)
SCENARIOS = [
    ("launch.C001", launch.rendezvous_env, {"RANK": "0"}, {}),
    ("launch.C002", launch.rendezvous_env, {**MASTER, "MASTER_PORT": "70000"}, {}),
    ("launch.W003", launch.deprecated_launcher, {"RANK": "0", "WORLD_SIZE": "1"}, {"argv": ("train.py", "--local_rank=0")}),
    ("launch.W003", launch.deprecated_launcher, {**TORCHRUN, **MASTER}, {"argv": ("train.py", "--local-rank=0")}),
    ("launch.E004", launch.scheduler_consistency, {**SLURM, **TORCHRUN, **MASTER, "SLURM_NTASKS": "8", "SLURM_NNODES": "2", "SLURM_NTASKS_PER_NODE": "4"}, {}),
    ("launch.I011", launch.derived_world, {**SLURM, "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "node-a"}, {}),
    ("launch.I013", launch.launch_line, {}, {"launch_line": ["torchrun", "--nnodes", "2", "--rdzv-endpoint", "node-a:29400", "x.py"]}),
    ("launch.E014", launch.accelerate_single_process, {"ACCELERATE_USE_CPU": "True", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}, {}),
    ("launch.C012", launch.derived_world, {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, {}),
    ("launch.E004", launch.scheduler_consistency, {**SLURM, **TORCHRUN, **MASTER, "SLURM_NTASKS": "4", "SLURM_NNODES": "2"}, {}),
    ("launch.E005", launch.scheduler_consistency, {**SLURM, **MASTER, "SLURM_NTASKS": "3"}, {}),
    ("launch.E005", launch.scheduler_consistency, {**SLURM, **MASTER, "SLURM_NTASKS": "2", "SLURM_PROCID": "1"}, {}),
    ("launch.W006", launch.elastic_restarts, {**TORCHRUN, **WORKER, "TORCHELASTIC_RESTART_COUNT": "2",
                                              "TORCHELASTIC_ERROR_FILE": "/logs/r/attempt_2/0/error.json"},
     {"files": {"/logs/r/attempt_1/0/error.json": json.dumps({"message": {"message": "RuntimeError: CUDA out of memory", "extraInfo": {"timestamp": "1700000000"}}})}}),
    ("launch.C007", launch.init_method, {**MASTER, "DISTDOCTOR_INIT_METHOD": "tcp://host"}, {}),
    ("launch.C007", launch.init_method, {**MASTER, "DISTDOCTOR_INIT_METHOD": "mpi://"}, {}),
    ("launch.C007", launch.init_method, {**MASTER, "DISTDOCTOR_INIT_METHOD": "file:///nowhere/rdzv"}, {}),
    ("launch.E008", launch.init_method, {**MASTER, "DISTDOCTOR_INIT_METHOD": "file:///shared/rdzv"}, {"files": {"/shared": "", "/shared/rdzv": "stale keys"}}),
    ("launch.E009", launch.init_method, {**MULTI, "MASTER_ADDR": "10.0.0.1", "DISTDOCTOR_INIT_METHOD": "file:///tmp/rdzv"}, {"files": {"/tmp": ""}, "fs_types": {"/": "ext4", "/tmp": "tmpfs"}}),
    ("launch.I010", launch.init_method, {**MULTI, "MASTER_ADDR": "10.0.0.1", "DISTDOCTOR_INIT_METHOD": "file:///mnt/x/rdzv"}, {"files": {"/mnt/x": ""}}),
    ("net.C001", network.master_resolves, {**WORKER, "MASTER_ADDR": "nowhere.invalid"}, {}),
    ("net.I002", network.master_resolves, {**WORKER, "MASTER_ADDR": "slow-dns"}, {"_resolve_unknown": True}),
    ("net.W003", network.own_hostname_resolves, {**MASTER, "LOCAL_WORLD_SIZE": "2"}, {"host": "ghost"}),
    ("net.E004", network.own_hostname_resolves, {**MULTI, "MASTER_ADDR": "10.0.0.1"}, {"host": "ghost"}),
    ("net.E005", network.loopback_in_multi_host, {**MULTI, "MASTER_ADDR": "localhost"}, {}),
    ("net.E006", network.loopback_in_multi_host, {**MULTI, "MASTER_ADDR": "10.0.0.1"}, {"dns": {"node-a": ["127.0.1.1"]}, "backend_": "gloo"}),
    ("net.W007", network.loopback_in_multi_host, {**MULTI, "MASTER_ADDR": "10.0.0.1"}, {"dns": {"node-a": ["127.0.1.1"]}, "backend_": "nccl"}),
    ("net.E008", network.socket_ifname, {**MASTER, "GLOO_SOCKET_IFNAME": "eth9"}, {"nics": NICS}),
    ("net.E008", network.socket_ifname, {**MASTER, "GLOO_SOCKET_IFNAME": "eth1"}, {"nics": NICS}),  # down
    ("net.E008", network.socket_ifname, {**MASTER, "NCCL_SOCKET_IFNAME": "^=eth0,eth1,docker0,veth9,lo"}, {"nics": NICS}),
    ("net.E008", network.socket_ifname, {**MULTI, "MASTER_ADDR": "10.0.0.1", "NCCL_SOCKET_IFNAME": "lo"}, {"nics": NICS}),
    ("net.W009", network.socket_ifname, {**MASTER, "NCCL_SOCKET_IFNAME": "eth0,,eth0"}, {"nics": NICS}),
    ("net.W010", network.socket_ifname, {**MULTI, "MASTER_ADDR": "10.0.0.1"}, {"nics": {k: NICS[k] for k in ("lo", "docker0", "veth9", "eth0")}, "backend_": "nccl"}),
    ("net.W010", network.socket_ifname, {**MULTI, "MASTER_ADDR": "10.0.0.1", "GLOO_SOCKET_IFNAME": "veth9"}, {"nics": NICS}),
    ("net.E011", network.rendezvous_port, AGENT_WORKER, {"dns": {"node-b": ["10.0.0.2"]}}),
    ("net.E011", network.rendezvous_port, WORKER, {"ports": {("10.0.0.9", 29500): "no_route"}}),
    ("net.E012", network.rendezvous_port, WORKER, {"ports": {("10.0.0.9", 29500): "timeout"}}),
    # A timeout where nobody answers ARP for the address is a host that is not there, not a firewall.
    ("net.E011", network.rendezvous_port, WORKER, {"ports": {("10.0.0.9", 29500): "timeout"}, "arp_silent": frozenset({"10.0.0.9"})}),
    ("net.E013", network.rendezvous_port, MASTER, {"bound_ports": {29500: "Address already in use"},
                                                  "port_listeners": {29500: [{"pid": 4242, "cmdline": "python old_train.py", "address": "0.0.0.0"}]}}),
    ("net.E014", network.rendezvous_port, MASTER, {"bound_ports": {29500: "Address already in use"}, "port_identities": {("10.0.0.1", 29500): HTTP}}),
    ("net.E014", network.rendezvous_port, AGENT_WORKER, {"ports": {("10.0.0.9", 29500): "open"}, "port_identities": {("10.0.0.9", 29500): HTTP}}),
    ("net.I015", network.rendezvous_port, AGENT_WORKER, {"ports": {("10.0.0.9", 29500): "open"}}),
    ("net.W016", network.address_family, {**WORKER, "MASTER_ADDR": "master6"}, {"dns": {"master6": ["2001:db8::1"]}}),
    ("net.W016", network.address_family, {**WORKER, "MASTER_ADDR": "fe80::1"}, {}),
    ("net.I017", network.socket_ifname, {**MASTER, "GLOO_SOCKET_IFNAME": "eth0"}, {"nics": Unknown("netifaces missing")}),
    ("backend.C001", backend.backend_available, MASTER, {"torch": {**CPU_TORCH, "distributed": False}}),
    ("backend.C002", backend.backend_available, MASTER, {"torch": CPU_TORCH, "backend_": "nccl"}),
    ("backend.C002", backend.backend_available, MASTER, {"torch": CPU_TORCH, "backend_": "mpi"}),
    ("backend.C006", backend.backend_available, MASTER, {"torch": Unknown("ImportError: libcudart.so.12")}),
    ("backend.C006", backend.backend_available, MASTER, {"torch": Unknown("torch cannot be imported: the child process importing it was ended by SIGSEGV")}),
    ("backend.I003", backend.backend_available, MASTER, {"torch": Unknown("the child process that imports torch printed no facts")}),
    ("backend.I004", backend.backend_available, MASTER, {"torch": NCCL_BUILT, "backend_": "nccl"}),
    ("backend.W005", backend.mpi_backend_launcher, MASTER, {"backend_": "mpi"}),
    ("backend.E007", backend.torch_supported, MASTER, {"torch": {**CPU_TORCH, "torch": "2.0.1+cu118"}}),
    ("backend.E008", backend.numpy_bridge, MASTER, {"torch": {**CPU_TORCH, "numpy": {"version": "2.4.6", "works": False, "error": "RuntimeError: Numpy is not available"}}}),
    ("backend.W009", backend.torchvision_matches, MASTER, {"torch": {**CPU_TORCH, "torchvision": {"version": "0.29.1", "requires": "torch>=2.14.0", "satisfied": False}}}),
    ("device.C001", device.gpu_for_nccl, MASTER, {"torch": CPU_TORCH, "backend_": "nccl"}),
    ("device.C001", device.gpu_for_nccl, {**MASTER, "CUDA_VISIBLE_DEVICES": ""}, {"torch": NCCL_BUILT, "backend_": "nccl"}),
    ("device.I002", device.gpu_for_nccl, MASTER, {"gpu_list": Unknown("driver error"), "backend_": "nccl"}),
    ("device.C003", device.local_rank_fits_gpus, {**TORCHRUN, **MASTER, "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4", "WORLD_SIZE": "4", "RANK": "3"}, {"gpu_list": fake_gpus(2), "backend_": "nccl"}),
    ("device.W004", device.local_rank_fits_gpus, {**MASTER, "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "4", "WORLD_SIZE": "4"}, {"gpu_list": fake_gpus(2), "backend_": "gloo"}),
    ("device.E005", device.local_rank_fits_gpus, {**MASTER, "LOCAL_WORLD_SIZE": "8", "WORLD_SIZE": "8"}, {"gpu_list": fake_gpus(4), "backend_": "nccl"}),
    ("device.W006", device.cuda_visible_devices, {**MASTER, "CUDA_VISIBLE_DEVICES": "0,1,,2"}, {"gpu_list": fake_gpus(2)}),
    ("device.W006", device.cuda_visible_devices, {**MASTER, "CUDA_VISIBLE_DEVICES": "0,1,2,3"}, {"gpu_list": fake_gpus(2)}),
    ("device.E007", device.cuda_visible_devices, {**MASTER, "CUDA_VISIBLE_DEVICES": "1,1"}, {}),
    ("device.W008", device.gpu_already_busy, MASTER, {"gpu_list": [GPU(0, "H100", "GPU-x", 80 * GiB, 20 * GiB, (777,))]}),
    ("system.E001", system.shared_memory, {**MASTER, "LOCAL_WORLD_SIZE": "8", "WORLD_SIZE": "8"}, {"disks": {"/dev/shm": (64 * MiB, 64 * MiB, 4096)}}),
    ("system.W002", system.shared_memory, MASTER, {"disks": {"/dev/shm": (32 * GiB, 100 * MiB, 4096)}}),
    ("system.E003", system.shared_memory, MASTER, {"writable_paths": {"/dev/shm": False}}),
    ("system.E003", system.shared_memory, MASTER, {"disks": {"/dev/shm": Unknown("FileNotFoundError: [Errno 2] No such file or directory: '/dev/shm'")}}),
    ("system.I004", system.shared_memory, MASTER, {"disks": {"/dev/shm": Unknown("PermissionError: denied")}}),
    ("system.E005", system.resource_limits, MASTER, {"limits": {"RLIMIT_NOFILE": (256, 4096)}}),
    ("system.W006", system.resource_limits, {**MASTER, "WORLD_SIZE": "1024"}, {"limits": {"RLIMIT_NOFILE": (1024, 1024)}}),
    ("system.W007", system.resource_limits, MASTER, {"rdma": ["mlx5_0"], "limits": {"RLIMIT_MEMLOCK": (64 * 1024, 64 * 1024)}}),
    ("system.W008", system.resource_limits, {**MASTER, "LOCAL_WORLD_SIZE": "8", "WORLD_SIZE": "8"}, {"limits": {"RLIMIT_NPROC": (1024, 1024)}}),
    ("system.W009", system.cpu_and_memory, {**MASTER, "LOCAL_WORLD_SIZE": "4", "WORLD_SIZE": "4"}, {"cpus": 8}),
    ("system.W010", system.cpu_and_memory, {**MASTER, "LOCAL_WORLD_SIZE": "8", "WORLD_SIZE": "8", "OMP_NUM_THREADS": "1"}, {"memory": 8 * GiB}),
    ("system.I011", system.resource_limits, MASTER, {"limits": {"RLIMIT_NOFILE": Unknown("no resource module")}}),
    ("timeouts.W001", timeouts.process_group_timeout, {**MASTER, "DISTDOCTOR_PG_TIMEOUT": "14400"}, {}),
    ("timeouts.W002", timeouts.process_group_timeout, {**MASTER, "DISTDOCTOR_PG_TIMEOUT": "20"}, {}),
    ("timeouts.W003", timeouts.nccl_error_handling, {**MASTER, "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}, {"backend_": "nccl"}),
    ("timeouts.W003", timeouts.nccl_error_handling, {**MASTER, "NCCL_ASYNC_ERROR_HANDLING": "0"}, {"backend_": "nccl"}),
    ("timeouts.W004", timeouts.nccl_error_handling, {**MASTER, "TORCH_NCCL_ENABLE_MONITORING": "false"}, {"backend_": "nccl"}),
    ("timeouts.W004", timeouts.nccl_error_handling, {**MASTER, "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "86400"}, {"backend_": "nccl"}),
    ("timeouts.W005", timeouts.nccl_error_handling, {**MASTER, "TORCH_NCCL_TRACE_BUFFER_SIZE": "0", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}, {"backend_": "nccl"}),
    ("timeouts.W005", timeouts.nccl_error_handling, {**MASTER, "TORCH_NCCL_DUMP_ON_TIMEOUT": "0"}, {"backend_": "nccl"}),
    ("timeouts.E006", timeouts.nccl_error_handling, {**MASTER, "TORCH_NCCL_BLOCKING_WAIT": "maybe"}, {"backend_": "nccl"}),
]


class SlowDnsProbes(FakeProbes):
    def resolve(self, host, timeout=3.0):
        return Unknown(f"DNS lookup of {host} did not answer within {timeout:g}s")


def _run(check, env, extra):
    extra = dict(extra)
    argv = extra.pop("argv", ("script.py",))
    backend_ = extra.pop("backend_", None)
    launch_line = extra.pop("launch_line", ())
    if launch_line:
        return list(check(fake_context(env=env, probes=FakeProbes(**extra), argv=argv, launch_line=launch_line)) or ())
    if extra.pop("_resolve_unknown", False):
        ctx = fake_context(env=env, probes=SlowDnsProbes(**extra), argv=argv)
        return list(check(ctx) or ())
    return findings(check, env, argv, backend_, **extra)


@pytest.mark.parametrize("expected, check, env, extra", SCENARIOS, ids=[f"{s[0]}-{i}" for i, s in enumerate(SCENARIOS)])
def test_scenario_gives_the_finding(expected, check, env, extra):
    found = _run(check, env, extra)
    ids = [f.id for f in found]
    assert expected in ids, [(f.id, f.title) for f in found]
    finding = found[ids.index(expected)]
    kind = REGISTRY.kinds[expected]
    assert finding.cause == kind.cause and finding.remediation and finding.title
    # Info findings say what could not be told, except those that state a fact the user must
    # see (the versions in use; the world derived from the launcher's variables).
    if expected.split(".")[1].startswith("I") and "versions" not in kind.title and expected not in ("launch.I011", "launch.I013"):
        assert finding.title.startswith("Could not tell"), finding.title


def test_every_local_id_has_a_scenario():
    registered = {i for i in REGISTRY.kinds if i.split(".")[0] in AREAS}
    assert registered - {s[0] for s in SCENARIOS} == set()


# -- things that must NOT be reported ---------------------------------------------------------

def test_healthy_worker_refused_before_rank0_starts_is_not_a_fault():
    assert findings(network.rendezvous_port, WORKER) == []  # refused, no agent store: not up yet


def test_agent_store_answering_on_master_port_is_not_a_fault():
    identity = {("10.0.0.9", 29500): PortIdentity(C10D_STORE, "store")}
    assert findings(network.rendezvous_port, AGENT_WORKER, ports={("10.0.0.9", 29500): "open"}, port_identities=identity) == []


def test_master_with_free_port_is_silent():
    assert findings(network.rendezvous_port, MASTER) == []


def test_silent_holder_is_port_in_use_with_pid():
    found = findings(network.rendezvous_port, MASTER, bound_ports={29500: "Address already in use"},
                     port_listeners={29500: [{"pid": 99, "cmdline": "nc -l 29500", "address": "0.0.0.0"}]},
                     port_identities={("10.0.0.1", 29500): PortIdentity(SILENT, "silent")})
    assert [f.id for f in found] == ["net.E013"] and "PID 99" in found[0].title and "kill 99" in found[0].remediation


def test_single_host_loopback_master_is_fine():
    assert findings(network.loopback_in_multi_host, {**MASTER, "MASTER_ADDR": "127.0.0.1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}) == []


def test_plain_process_gets_no_launch_findings():
    for check in (launch.deprecated_launcher, launch.scheduler_consistency, launch.elastic_restarts, launch.init_method):
        assert findings(check, {}) == []


def test_one_task_per_node_torchrun_in_srun_is_fine():
    env = {**SLURM, **TORCHRUN, **MASTER, "SLURM_NTASKS": "2", "SLURM_NNODES": "2", "SLURM_NTASKS_PER_NODE": "1", "WORLD_SIZE": "16"}
    assert findings(launch.scheduler_consistency, env) == []


def test_defaults_give_no_timeout_findings():
    assert findings(timeouts.process_group_timeout, MASTER) == []
    assert findings(timeouts.nccl_error_handling, MASTER, backend_="nccl") == []


def test_restart_error_file_garbage_is_tolerated():
    env = {**TORCHRUN, **WORKER, "TORCHELASTIC_RESTART_COUNT": "1", "TORCHELASTIC_ERROR_FILE": "/l/attempt_1/0/error.json"}
    found = findings(launch.elastic_restarts, env, files={"/l/attempt_0/0/error.json": "\x00\xffnot json\nSegmentation fault"})
    assert "Segmentation fault" in found[0].detail


def test_restart_without_error_file_says_so():
    env = {**TORCHRUN, **WORKER, "TORCHELASTIC_RESTART_COUNT": "1", "TORCHELASTIC_ERROR_FILE": "/l/attempt_1/0/error.json"}
    assert "no readable error file" in findings(launch.elastic_restarts, env)[0].detail


def test_remediation_follows_the_launcher():
    slurm = findings(network.socket_ifname, {**SLURM, **MASTER, "SLURM_NTASKS": "2", "GLOO_SOCKET_IFNAME": "eth9"}, nics=NICS)
    assert "srun --export=ALL,GLOO_SOCKET_IFNAME=eth0" in slurm[0].remediation
    torchrun = findings(network.socket_ifname, {**TORCHRUN, **MASTER, "GLOO_SOCKET_IFNAME": "eth9"}, nics=NICS)
    assert "GLOO_SOCKET_IFNAME=eth0 torchrun" in torchrun[0].remediation
    docker = findings(system.shared_memory, MASTER, disks={"/dev/shm": (64 * MiB, 64 * MiB, 4096)}, files={"/.dockerenv": ""})
    assert "docker run --shm-size=" in docker[0].remediation


def test_self_test_layout_on_one_gpu_is_not_a_risk():
    """distdoctor's self-test runs 2 gloo ranks on a 1-GPU node: rank 1 is not warned about cuda:1."""
    env = {**MASTER, "RANK": "1", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "DISTDOCTOR_MP_SPAWN": "1"}
    assert findings(device.local_rank_fits_gpus, env, gpu_list=fake_gpus(1), backend_="gloo") == []
    user_job = {k: v for k, v in env.items() if k != "DISTDOCTOR_MP_SPAWN"}
    assert [f.id for f in findings(device.local_rank_fits_gpus, user_job, gpu_list=fake_gpus(1), backend_="gloo")] == ["device.W004"]


def test_rank_0_whose_master_addr_nobody_holds_is_told_its_own_address():
    env = {**MASTER, "MASTER_ADDR": "10.0.0.99"}
    (finding,) = findings(network.rendezvous_port, env, ports={("10.0.0.99", 29500): "timeout"},
                          arp_silent=frozenset({"10.0.0.99"}))
    assert finding.cause == "master_unreachable" and "ARP" in finding.title
    assert "not an address of this host" in finding.detail
    assert "10.0.0.1 on eth0" in finding.remediation


def test_oversubscription_with_one_thread_each_asks_for_fewer_ranks():
    env = {**MASTER, "LOCAL_WORLD_SIZE": "8", "OMP_NUM_THREADS": "1", "TORCHELASTIC_RUN_ID": "x"}
    (finding,) = [f for f in findings(system.cpu_and_memory, env, cpus=2) if f.id == "system.W009"]
    assert "OMP_NUM_THREADS" not in finding.remediation
    assert "--nproc-per-node <= 2" in finding.remediation
