"""The world a launcher describes in its own variables, as torch's RANK / WORLD_SIZE / ... / MASTER_*.

srun, mpirun, mpiexec, jsrun and a Kubeflow PyTorchJob start every rank themselves but set only
their own variables (SLURM_PROCID, OMPI_COMM_WORLD_RANK, PMI_RANK...). Lightning and accelerate
map them to torch's; this module does the same for `distdoctor check`, and records where each
value came from so the report can show it. A variable the process already has always wins.

The rendezvous endpoint: MASTER_ADDR when set; else the first host of the step's node list
(SLURM; task 0 runs there); else loopback when every rank runs on this node. MASTER_PORT when
set; else 15000 + the last four digits of the job ID (as Lightning's SLURMEnvironment does, so
every rank of a job computes the same port and concurrent jobs rarely meet), or of a CRC-32 of a
job ID that is not a number; else 29500, torch's default.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any, Mapping

from distdoctor.machine.env_values import MAX_WORLD, IntVar, read_int
from distdoctor.machine.hostlist import HostlistError, expand_hostlist

LOOPBACK = "127.0.0.1"
PORT_BASE = 15000
DEFAULT_PORT = 29500

# A job's identity, shared by all its ranks, per launcher (first present wins).
JOB_ID_VARS = {
    "slurm": ("SLURM_JOB_ID", "SLURM_JOBID"),
    "openmpi": ("OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE"),
    "mpich": ("PMI_KVSNAME", "PMIX_NAMESPACE", "SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID"),
    "pmix": ("PMIX_NAMESPACE", "SLURM_JOB_ID"),
    "lsf": ("LSB_JOBID",),
}
# (torch variable, attribute of the detectors' scheduler view)
_FROM_SCHEDULER = (
    ("RANK", "rank"),
    ("WORLD_SIZE", "size"),
    ("LOCAL_RANK", "local_rank"),
    ("LOCAL_WORLD_SIZE", "local_size"),
)
# Launchers that start the ranks themselves: their variables describe the world.
DERIVING = ("slurm", "openmpi", "mpich", "pmix", "lsf", "kubeflow")


@dataclass
class Derivation:
    """torch's variables filled in from the launcher's: values, and where each came from."""

    ints: dict[str, Any] = field(default_factory=dict)  # variable -> IntVar
    master_addr: str | None = None
    sources: tuple[tuple[str, str], ...] = ()
    endpoint_problem: str | None = None


def port_from_job_id(job_id: str) -> int:
    """15000 + the last four digits of a numeric job ID (Lightning's rule); a CRC-32 for others."""
    text = job_id.strip()
    digits = text if text.isascii() and text.isdigit() else str(zlib.crc32(text.encode("utf-8", "replace")))
    return PORT_BASE + int(digits[-4:])


def derive_port(launcher: str, env: Mapping[str, str]) -> tuple[int, str]:
    """(port, where it came from) for a world whose MASTER_PORT is unset."""
    for name in JOB_ID_VARS.get(launcher, ()):
        raw = env.get(name, "").strip()
        if raw:
            port = port_from_job_id(raw[:256])
            return port, f"{PORT_BASE} + last 4 digits of {'' if raw.isdigit() else 'CRC-32 of '}{name}={raw[:40]}"
    return DEFAULT_PORT, "torch's default 29500 (no job ID to derive a port from)"


def first_slurm_host(env: Mapping[str, str]) -> tuple[str | None, str]:
    """The first host of the step's node list (task 0 runs there), and where it came from or why not."""
    for name in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        raw = env.get(name)
        if raw is None:
            continue
        try:
            return expand_hostlist(raw)[0], f"first host of {name}={raw[:80]}"
        except HostlistError as exc:
            return None, f"{name} is not a host list SLURM writes: {exc}"
    return None, "no SLURM_STEP_NODELIST / SLURM_JOB_NODELIST is set"


def _single_node(ints: Mapping[str, Any], seen: Any) -> bool | None:
    if seen.nodes is not None and seen.nodes.value is not None:
        return seen.nodes.value == 1
    size, local = ints.get("WORLD_SIZE"), ints.get("LOCAL_WORLD_SIZE")
    if size is not None and local is not None and size.value is not None and local.value is not None:
        return size.value == local.value
    return None


def _derive_address(launcher: str, env: Mapping[str, str], ints: Mapping[str, Any], seen: Any) -> tuple[str | None, str]:
    if launcher == "kubeflow" and env.get("PET_MASTER_ADDR"):
        return env["PET_MASTER_ADDR"].strip(), f"PET_MASTER_ADDR={env['PET_MASTER_ADDR'][:80]}"
    why_not = ""
    if launcher == "slurm":
        host, why = first_slurm_host(env)
        if host:
            return host, why
        why_not = why + "; "
    if _single_node(ints, seen):
        return LOOPBACK, "loopback: every rank runs on this node"
    return None, why_not + f"the {launcher} variables do not say which host runs rank 0"


def _kubeflow_ints(env: Mapping[str, str], torch_vars: Mapping[str, Any]) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """A PyTorchJob pod run without torchrun: one rank per pod (PET_NPROC_PER_NODE=1) only."""
    per_node = read_int(env, "PET_NPROC_PER_NODE", minimum=1, maximum=MAX_WORLD)
    if per_node.value != 1 or "PET_NNODES" not in env:
        return {}, []  # torchrun must start the pod's ranks (torchrun reads PET_* itself)
    candidates = {
        "RANK": read_int(env, "PET_NODE_RANK", maximum=MAX_WORLD),
        "WORLD_SIZE": read_int(env, "PET_NNODES", minimum=1, maximum=MAX_WORLD),
        "LOCAL_RANK": IntVar("LOCAL_RANK", "0", 0),
        "LOCAL_WORLD_SIZE": per_node,
        "MASTER_PORT": read_int(env, "PET_MASTER_PORT", minimum=1, maximum=65535),
    }
    ints, sources = {}, []
    for var, value in candidates.items():
        if not torch_vars[var].present and value.present:
            ints[var] = value
            sources.append((var, "one rank per pod (PET_NPROC_PER_NODE=1)" if value.name == var else f"{value.name}={value.raw}"))
    return ints, sources


def derive_world(launcher: str, env: Mapping[str, str], seen: Any, torch_vars: Mapping[str, Any]) -> Derivation:
    """torch's variables this process lacks, from the launcher's; nothing for other launchers."""
    if launcher not in DERIVING:
        return Derivation()
    if launcher == "kubeflow":
        ints, sources = _kubeflow_ints(env, torch_vars)
    else:
        ints, sources = {}, []
        for var, attr in _FROM_SCHEDULER:
            value = getattr(seen, attr)
            if not torch_vars[var].present and value is not None and value.present:
                ints[var] = value
                sources.append((var, f"{value.name}={value.raw[:40]}"))
    if not ints and not sources:
        return Derivation()
    full = {var: ints.get(var, torch_vars[var]) for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    master_addr, problem = None, None
    if "MASTER_ADDR" not in env:
        master_addr, why = _derive_address(launcher, env, full, seen)
        if master_addr is None:
            problem = why
        else:
            sources.append(("MASTER_ADDR", why))
    if not torch_vars["MASTER_PORT"].present and "MASTER_PORT" not in ints:
        port, why = derive_port(launcher, env)
        ints["MASTER_PORT"] = IntVar("MASTER_PORT", str(port), port)
        sources.append(("MASTER_PORT", why))
    return Derivation(ints, master_addr, tuple(sources), problem)
