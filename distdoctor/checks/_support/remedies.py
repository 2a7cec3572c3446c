"""Remediations phrased for the launcher (and container) that started this process.

A fix is only useful when it can be pasted: "export X=1" does not reach the ranks of an srun
step started before the export, and a docker container's /dev/shm is set by `docker run`.
"""

from __future__ import annotations

from typing import Any

from distdoctor.machine.launchers import (
    DEPRECATED_LAUNCH,
    KUBEFLOW,
    LSF,
    MPICH,
    OPENMPI,
    PMIX,
    SLURM,
    TORCHRUN,
)


def container(ctx: Any) -> str | None:
    """'kubernetes', 'docker', 'podman' or None, from cheap evidence (env, marker files)."""

    def compute() -> str | None:
        if "KUBERNETES_SERVICE_HOST" in ctx.env:
            return "kubernetes"
        exists = getattr(ctx.probes, "exists", None)
        if exists is None:
            return None
        if exists("/run/.containerenv") is True:
            return "podman"
        if exists("/.dockerenv") is True:
            return "docker"
        return None

    return ctx.memo("container", compute)


def set_env(ctx: Any, name: str, value: str) -> str:
    """How to give every rank ``name=value`` under the detected launcher."""
    launcher = ctx.launch.launcher
    assignment = f"{name}={value}"
    if launcher == SLURM:
        how = f"export {assignment} in the sbatch script before srun (srun passes the environment), or srun --export=ALL,{assignment} ..."
    elif launcher == OPENMPI:
        how = f"mpirun -x {assignment} ..."
    elif launcher in (MPICH, PMIX):
        how = f"mpiexec -genv {name} {value} ..."
    elif launcher == LSF:
        how = f"export {assignment} before jsrun (or jsrun -E {assignment} ...)"
    elif launcher == KUBEFLOW:
        how = f"add {{name: {name}, value: \"{value}\"}} to the container's env in the PyTorchJob spec"
    elif launcher in (TORCHRUN, DEPRECATED_LAUNCH):
        how = f"{assignment} torchrun ... (torchrun hands its environment to every worker; set it on every node)"
    else:
        how = f"export {assignment} in the environment of every rank"
    kind = container(ctx)
    if kind in ("docker", "podman") and launcher not in (KUBEFLOW,):
        how += f"; in a container: {kind} run -e {assignment} ..."
    return how


def unset_env(ctx: Any, name: str) -> str:
    launcher = ctx.launch.launcher
    if launcher == OPENMPI:
        return f"drop -x {name} from mpirun and unset {name} in the job script"
    if launcher == KUBEFLOW:
        return f"remove {name} from the container's env in the PyTorchJob spec"
    return f"unset {name} in the job script (and in ~/.bashrc or modules that export it)"


def docker_option(ctx: Any, option: str, k8s: str | None = None) -> str:
    """A container-level fix: docker/podman run option, or its Kubernetes equivalent."""
    kind = container(ctx)
    if kind == "kubernetes" or ctx.launch.launcher == KUBEFLOW:
        return k8s or f"the pod spec equivalent of `docker run {option}`"
    runner = kind if kind in ("docker", "podman") else "docker"
    return f"{runner} run {option} ..."
