"""A snapshot of this process's distributed set-up: for `distdoctor env` and the rank exchange.

Every value goes through redaction; every probe may answer "could not tell".
"""

from __future__ import annotations

import os
import platform
import sys
from typing import Any

from distdoctor.core.context import CheckContext
from distdoctor.machine.launchers import RENDEZVOUS_VARS
from distdoctor.machine.probes import Unknown
from distdoctor.core.redact import redact_env, scrub, secret_values

# Variables that shape a distributed job, shown by name prefix.
ENV_PREFIXES = ("NCCL_", "TORCH_", "GLOO_", "TORCHELASTIC_", "CUDA_", "UCC_", "UCX_", "OMP_", "PET_",
                "SLURM_", "OMPI_", "PMI_", "PMIX_", "JSM_", "FI_", "MPI_", "DISTDOCTOR_")
ENV_NAMES = (*RENDEZVOUS_VARS, "GROUP_RANK", "ROLE_RANK", "NODE_RANK", "HOSTNAME")


def _plain(value: Any) -> Any:
    if isinstance(value, Unknown):
        return str(value)
    return value


def relevant_env(env: dict[str, str] | Any) -> dict[str, str]:
    chosen = {k: v for k, v in env.items() if k in ENV_NAMES or k.startswith(ENV_PREFIXES)}
    return dict(sorted(redact_env(chosen).items()))


def collect_snapshot(ctx: CheckContext) -> dict[str, Any]:
    interfaces = ctx.memo("interfaces", ctx.probes.interfaces)
    gpus = ctx.gpus()
    return {
        "host": _plain(ctx.memo("hostname", ctx.probes.hostname)),
        "pid": os.getpid(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "launcher": scrub(ctx.launch.summary(), secret_values(ctx.env)),  # MASTER_ADDR=user:pw@host
        "torch": _plain(ctx.torch_info()),
        "backend": ctx.backend,
        "env": relevant_env(ctx.env),
        "interfaces": _plain(interfaces) if isinstance(interfaces, Unknown) else {
            name: {"up": i.up, "ipv4": list(i.ipv4), "ipv6": list(i.ipv6)} for name, i in interfaces.items()
        },
        "gpus": _plain(gpus) if isinstance(gpus, Unknown) else [
            {"index": g.index, "name": g.name, "uuid": g.uuid, "total_memory": g.total_memory} for g in gpus
        ],
    }
