"""Devices: GPUs for nccl, LOCAL_RANK vs visible GPUs, CUDA_VISIBLE_DEVICES, GPUs already in use.

GPUs come from ctx.gpus() (torch device properties and, when pynvml is there, NVML usage),
which never creates a CUDA context; GPU paths are unit-tested with fakes.
"""

from __future__ import annotations

import os

from distdoctor.checks._support import cuda_visible_devices as cuda_visible

from distdoctor.checks._support import remedies
from distdoctor.core.context import CheckContext
from distdoctor.machine.launchers import DEPRECATED_LAUNCH, KUBEFLOW, SELF_TEST_VAR, SLURM, TORCHRUN
from distdoctor.machine.probes import Unknown
from distdoctor.core.registry import check, finding_kind

NO_GPU = finding_kind(
    "device.C001", cause="no_gpu_for_nccl",
    title="nccl is requested but this process sees no GPU",
    hint="Run on a GPU node with CUDA_VISIBLE_DEVICES unset or correct, or use backend='gloo'",
)
GPUS_UNKNOWN = finding_kind(
    "device.I002", cause="no_gpu_for_nccl",
    title="Could not tell which GPUs this process sees",
    hint="Check nvidia-smi and torch.cuda.device_count() in the job's environment",
)
BAD_ORDINAL = finding_kind(
    "device.C003", cause="invalid_device_ordinal",
    title="LOCAL_RANK is beyond the visible GPUs",
    hint="Start at most as many ranks per node as there are visible GPUs",
)
BAD_ORDINAL_RISK = finding_kind(
    "device.W004", cause="invalid_device_ordinal",
    title="LOCAL_RANK is beyond the visible GPUs (a set_device(LOCAL_RANK) would fail)",
    hint="Start at most as many ranks per node as GPUs, or keep this job on the CPU",
)
TOO_MANY_LOCAL_RANKS = finding_kind(
    "device.E005", cause="launcher_misuse",
    title="More ranks per node than visible GPUs",
    hint="Set --nproc-per-node (or tasks per node) to the number of GPUs",
)
VISIBLE_DEVICES_GARBLED = finding_kind(
    "device.W006", cause="env_invalid",
    title="CUDA_VISIBLE_DEVICES is read differently from what it says",
    hint="Write CUDA_VISIBLE_DEVICES as plain indices (0,1) or full UUIDs, without blanks or junk",
)
VISIBLE_DEVICES_DUPLICATE = finding_kind(
    "device.E007", cause="duplicate_gpu",
    title="CUDA_VISIBLE_DEVICES lists a GPU twice, which hides every GPU",
    hint="List every GPU once",
)
GPU_BUSY = finding_kind(
    "device.W008", cause="duplicate_gpu",
    title="The GPU this rank will use is already busy with other processes",
    hint="End the leftover processes or pick idle GPUs",
)

# Memory another process may hold on "our" GPU before we call it busy (display servers, MPS).
BUSY_BYTES = 1 << 30


def _local_ranks(ctx: CheckContext) -> int | None:
    launch = ctx.launch
    if launch.local_world_size.value is not None:
        return launch.local_world_size.value
    if launch.scheduler_local_size is not None and launch.scheduler_local_size.value is not None:
        return launch.scheduler_local_size.value
    return None


def _nproc_fix(ctx: CheckContext, count: int) -> str:
    launcher = ctx.launch.launcher
    if launcher in (TORCHRUN, DEPRECATED_LAUNCH):
        return f"torchrun --nproc-per-node={count} ... (one rank per GPU)"
    if launcher == SLURM:
        return f"srun --ntasks-per-node={count} --gpus-per-task=1 ... (or #SBATCH --gres=gpu:{count})"
    if launcher == KUBEFLOW:
        return f"nprocPerNode: {count} and resources.limits nvidia.com/gpu: {count} in the PyTorchJob"
    return f"start {count} rank(s) per node, one per GPU"


def _visible(ctx: CheckContext) -> cuda_visible.VisibleDevices:
    return cuda_visible.parse(ctx.env.get("CUDA_VISIBLE_DEVICES"))


@check(stage="local", tags=("device", "gpu"), emits=(NO_GPU, GPUS_UNKNOWN))
def gpu_for_nccl(ctx: CheckContext):
    """nccl needs at least one visible GPU."""
    if ctx.backend != "nccl":
        return
    gpus = ctx.gpus()
    visible = _visible(ctx)
    if isinstance(gpus, Unknown):
        yield GPUS_UNKNOWN(
            f"Could not tell whether this process sees a GPU for nccl: {gpus.reason}",
            remediation="Run nvidia-smi and python -c 'import torch; print(torch.cuda.device_count())' in the job's environment",
            data={"reason": gpus.reason},
        )
        return
    if gpus:
        return
    info = ctx.torch_info()
    cuda = info.get("cuda") if isinstance(info, dict) else None
    reasons = []
    if isinstance(info, dict) and not cuda:
        reasons.append(f"this torch ({info.get('torch')}) is a CPU-only build")
    if visible.hides_all:
        reasons.append(f"CUDA_VISIBLE_DEVICES={visible.raw!r} hides every GPU" + (f" ({visible.problems[0]})" if visible.problems else ""))
    if not reasons:
        reasons.append("no NVIDIA driver/GPU is visible to this process (nvidia-smi on the node; in a container: --gpus all)")
    fix = "use backend='gloo' for CPU-only runs, or run on a GPU node"
    if visible.hides_all:
        fix = remedies.unset_env(ctx, "CUDA_VISIBLE_DEVICES") + " (or list the GPUs: 0,1,...); " + fix
    if remedies.container(ctx) in ("docker", "podman"):
        fix += f"; in a container: {remedies.docker_option(ctx, '--gpus all')}"
    yield NO_GPU(
        "nccl is requested but this process sees no GPU: " + "; ".join(reasons),
        detail=f"The backend comes from {ctx.backend_source}. NCCL only runs on CUDA devices: "
        "init_process_group or the first collective fails (\"ProcessGroupNCCL is only supported with GPUs, no GPUs found!\").",
        remediation=fix,
        data={"cuda_visible_devices": visible.raw, "torch_cuda": cuda, "reasons": reasons},
    )


@check(stage="local", tags=("device", "gpu"), emits=(BAD_ORDINAL, BAD_ORDINAL_RISK, TOO_MANY_LOCAL_RANKS))
def local_rank_fits_gpus(ctx: CheckContext):
    """LOCAL_RANK < visible GPUs; ranks per node <= GPUs."""
    gpus = ctx.gpus()
    if not isinstance(gpus, list) or not gpus:
        return  # no GPUs: gpu_for_nccl speaks for nccl, and CPU jobs have no device ordinal
    count = len(gpus)
    nccl = ctx.backend == "nccl"
    local = ctx.launch.local_rank.value
    local_ranks = _local_ranks(ctx)
    visible = _visible(ctx)
    cvd = f" (CUDA_VISIBLE_DEVICES={visible.raw!r})" if visible.restricted else ""
    # distdoctor's own self-test runs gloo when ranks outnumber GPUs and never touches GPU
    # LOCAL_RANK then: the layout is its choice, not the job's, so there is no risk to report.
    self_test_on_cpu = not nccl and SELF_TEST_VAR in ctx.env
    if local is not None and local >= count and not self_test_on_cpu:
        kind = BAD_ORDINAL if nccl else BAD_ORDINAL_RISK
        yield kind(
            f"LOCAL_RANK={local} but this process sees {count} GPU(s){cvd}",
            detail=f"torch.cuda.set_device({local}) fails with \"CUDA error: invalid device ordinal\""
            + (" and NCCL cannot pick a device for this rank." if nccl else "; this gloo job is safe only if it never moves work to GPU LOCAL_RANK."),
            remediation=_nproc_fix(ctx, count)
            + ("; with one GPU per process (srun --gpus-per-task=1, CUDA_VISIBLE_DEVICES per rank) use cuda:0, not cuda:LOCAL_RANK" if count == 1 else ""),
            data={"local_rank": local, "gpus": count, "cuda_visible_devices": visible.raw},
        )
    if nccl and local_ranks is not None and local_ranks > count:
        yield TOO_MANY_LOCAL_RANKS(
            f"{local_ranks} ranks on this node but {count} visible GPU(s){cvd}",
            detail="Either some ranks fail with an invalid device ordinal, or two ranks share a GPU and NCCL "
            "aborts with \"Duplicate GPU detected\".",
            remediation=_nproc_fix(ctx, count),
            data={"local_ranks": local_ranks, "gpus": count},
        )


@check(stage="local", tags=("device", "gpu", "env"), emits=(VISIBLE_DEVICES_GARBLED, VISIBLE_DEVICES_DUPLICATE))
def cuda_visible_devices(ctx: CheckContext):
    """CUDA_VISIBLE_DEVICES in every form: indices, UUIDs, MIG, empty, duplicates, garbage."""
    visible = _visible(ctx)
    if not visible.restricted:
        return
    gpus = ctx.gpus()
    seen = len(gpus) if isinstance(gpus, list) else None
    if visible.duplicates:
        yield VISIBLE_DEVICES_DUPLICATE(
            f"CUDA_VISIBLE_DEVICES={visible.raw!r} lists {visible.duplicates[0].strip()!r} twice: CUDA then shows no GPU at all",
            detail="A repeated entry makes CUDA (and torch.cuda) treat the whole list as empty; two ranks meant to "
            "get different GPUs get none.",
            remediation=remedies.set_env(ctx, "CUDA_VISIBLE_DEVICES", "<each GPU once, e.g. 0,1>"),
            data={"value": visible.raw, "duplicates": list(visible.duplicates)},
        )
        return
    problems = list(visible.problems)
    count = visible.count or 0
    if seen is not None and seen and visible.form == cuda_visible.INDICES and count > seen:
        problems.append(f"it lists {count} GPUs but only {seen} are visible: entries naming GPUs that do not exist are dropped")
    if problems:
        yield VISIBLE_DEVICES_GARBLED(
            f"CUDA_VISIBLE_DEVICES={visible.raw!r}: {problems[0]}",
            detail="; ".join(problems) + f". CUDA exposes: {', '.join(map(str, visible.devices)) or 'no GPU'}.",
            remediation=remedies.set_env(ctx, "CUDA_VISIBLE_DEVICES", ",".join(map(str, visible.devices)) or "0"),
            data={"value": visible.raw, "devices": [str(d) for d in visible.devices], "ignored": list(visible.ignored), "problems": problems},
        )


@check(stage="local", tags=("device", "gpu"), emits=(GPU_BUSY,))
def gpu_already_busy(ctx: CheckContext):
    """The GPU this rank will use already holds other processes' memory."""
    gpus = ctx.gpus()
    if not isinstance(gpus, list) or not gpus:
        return
    local = ctx.launch.local_rank.value
    mine = gpus if local is None else ([g for g in gpus if g.index == local] or (gpus if len(gpus) == 1 else []))
    me = os.getpid()
    for gpu in mine:
        others = [p for p in gpu.processes if p != me]
        used = gpu.used_memory or 0
        if not others and used < BUSY_BYTES:
            continue
        who = f"PIDs {', '.join(map(str, others))}" if others else "processes not visible from here (another container?)"
        yield GPU_BUSY(
            f"GPU {gpu.index} ({gpu.name}) already has {used / 2**20:.0f} MiB in use by {who}",
            detail="A leftover rank of an earlier run, or another job on the same GPU: this job gets less memory "
            "(CUDA out of memory), and two ranks on one GPU make NCCL abort with \"Duplicate GPU detected\".",
            remediation=(f"kill {' '.join(map(str, others))} (check with nvidia-smi first); " if others else "check nvidia-smi; ")
            + "or run on idle GPUs (" + remedies.set_env(ctx, "CUDA_VISIBLE_DEVICES", "<idle GPUs>") + ")",
            data={"gpu": gpu.index, "uuid": gpu.uuid, "used_bytes": used, "pids": others},
        )
