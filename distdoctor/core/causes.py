"""The root-cause vocabulary every finding carries.

Documented for users in docs/causes.md (tests keep the two equal). Causes are never renamed or
reused: users script against them. Add one only when none fits.
"""

from __future__ import annotations

CAUSES: dict[str, str] = {
    'env_missing': (
        'a variable that the rendezvous needs (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK) is not set, typically a script started without its launcher'
    ),
    'env_invalid': (
        'such a variable is set but unusable: not an integer, out of range, RANK >= WORLD_SIZE, a port outside 1–65535, an empty address'
    ),
    'rank_config_error': (
        "ranks disagree about the job: two processes claim one rank, node ranks collide, WORLD_SIZE differs between ranks, the scheduler's task count disagrees with the launcher's"
    ),
    'world_size_mismatch': (
        'fewer (or more) processes exist than WORLD_SIZE says; the rendezvous can never complete'
    ),
    'rank_missing': (
        'named ranks never checked in before the deadline (crashed, not started, stuck before init)'
    ),
    'hostname_unresolvable': (
        "MASTER_ADDR or this host's own name does not resolve"
    ),
    'master_unreachable': (
        'no route or no listener at MASTER_ADDR:MASTER_PORT (wrong address, store not started, host down)'
    ),
    'firewall': (
        "packets to the store or to the backend's ports are dropped or filtered (connect times out rather than being refused)"
    ),
    'port_in_use': (
        'MASTER_PORT (or another port the job binds) is already taken on the master host'
    ),
    'foreign_service_on_port': (
        'something that is not a c10d store answers on MASTER_PORT'
    ),
    'wrong_interface': (
        'Gloo/NCCL will use an unusable interface or address: *_SOCKET_IFNAME names a missing/down interface, the host name resolves to loopback on a multi-host job, a docker bridge is picked'
    ),
    'p2p_blocked': (
        'direct GPU-to-GPU traffic (PCIe peer-to-peer, NVLink) is blocked or broken: IOMMU or PCIe ACS on, a VM without P2P; NCCL hangs right after init or fails in P2P transport (NCCL_P2P_DISABLE=1 works around it)'
    ),
    'ib_rdma_issue': (
        'the InfiniBand/RoCE path is missing, down or mis-set (NCCL_IB_*, memlock limits for RDMA)'
    ),
    'backend_unavailable': (
        'the requested backend (nccl, gloo, mpi, ucc, xccl) or torch.distributed itself is not built into this torch'
    ),
    'no_gpu_for_nccl': (
        'a GPU-only backend is requested but this process sees no GPU'
    ),
    'cpu_tensor_on_nccl': (
        'a CPU tensor is (or would be) handed to a GPU-only process group'
    ),
    'invalid_device_ordinal': (
        'LOCAL_RANK (or a hard-coded device) is >= the number of visible GPUs'
    ),
    'duplicate_gpu': (
        'two ranks are bound to the same physical GPU'
    ),
    'device_mismatch': (
        "tensors of one collective, or a model's parameters, sit on different devices / device types across or within ranks"
    ),
    'shape_mismatch': (
        'the same collective or the same model parameter has different shapes on different ranks'
    ),
    'dtype_mismatch': (
        'the same collective or the same model parameter has different dtypes on different ranks'
    ),
    'param_divergence': (
        'the same parameter has different values on different ranks at start (unsynchronised initialisation)'
    ),
    'collective_mismatch': (
        'ranks issue different collectives, or in a different order'
    ),
    'slow_link': (
        'a link between ranks or hosts is much slower (bandwidth or latency) than its peers — a NIC negotiated down, traffic over the wrong interface, IB fallen back to TCP — so every collective runs at its pace'
    ),
    'straggler_rank': (
        'a rank arrives at a collective far later than the others; the others wait or time out'
    ),
    'collective_timeout_hang': (
        'a collective or barrier does not complete within its deadline and no more specific cause is known'
    ),
    'uneven_inputs': (
        'ranks get different numbers of batches, so some stop joining collectives'
    ),
    'unused_parameters': (
        'DDP reducer error: some parameters got no gradient'
    ),
    'pg_not_initialized': (
        'a collective is used before init_process_group'
    ),
    'shm_too_small': (
        '/dev/shm is too small or full for NCCL or DataLoader workers'
    ),
    'shm_permission': (
        '/dev/shm is not writable by the job'
    ),
    'worker_exception': (
        "one rank's own code raised (an exception in the training loop, its data, its checkpointing) and that process exited; its peers then fail with \"Connection closed by peer\", a collective timeout or the launcher's SIGTERM — their errors are consequences, the first rank's exception is the cause"
    ),
    'oom_killed_rank': (
        "a rank was killed by the host's out-of-memory killer (exit code -9 / SIGKILL)"
    ),
    'cpu_oversubscription': (
        'threads × local ranks exceed the cores, or memory per rank is too low for the job'
    ),
    'resource_limit': (
        'an OS limit is too low: open files, memlock, processes'
    ),
    'version_incompat': (
        'torch / CUDA / NCCL versions differ across ranks, or a known-bad version combination is in use'
    ),
    'timeout_config': (
        'timeouts are set so that a fault will hang for very long, or so short that healthy jobs abort; error handling is off'
    ),
    'launcher_misuse': (
        'the launcher is misused: deprecated torch.distributed.launch without LOCAL_RANK env, torchrun inside srun spawning twice, nproc_per_node > GPUs'
    ),
    'unknown': (
        'no cause can be named from the evidence (a log diagnosis may list candidates instead)'
    ),
}


def is_cause(name: str) -> bool:
    return name in CAUSES
