"""A snapshot of this process's distributed set-up: for `distdoctor env` and the rank exchange.

Every value goes through redaction; every probe may answer "could not tell".
"""

from __future__ import annotations

import os
import platform
import socket
import sys
from datetime import datetime, timezone
from typing import Any

from distdoctor.core.context import CheckContext
from distdoctor.machine.launchers import RENDEZVOUS_VARS
from distdoctor.machine import torch_facts
from distdoctor.machine.probes import Probes, Unknown
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


def utc_now() -> str:
    """The time in UTC, ISO 8601 to the second: 2026-11-22T22:20:05Z."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def distdoctor_version() -> str:
    # The package is loaded before any of its modules; read its version without an import of
    # the top level from this lower layer.
    return str(getattr(sys.modules.get("distdoctor"), "__version__", "unknown"))


def _loaded(name: str) -> bool:
    """Whether a module is in sys.modules and done importing: one still importing on another
    thread (a rank's watchdog firing while its main thread imports torch) would make a reader
    wait on the import lock until the import ends."""
    module = sys.modules.get(name)
    return module is not None and not getattr(getattr(module, "__spec__", None), "_initializing", False)


def report_facts() -> dict[str, Any]:
    """What a bug report needs next to the findings: versions, host, time (additive to the schema).

    torch, CUDA and NCCL are read only when torch is already loaded, or the child that reads
    torch's facts has answered (every `check` does one or the other; `explain` reads logs and does
    neither): those fields are null otherwise. Never waits.
    """
    facts: dict[str, Any] = {
        "distdoctor": distdoctor_version(),
        "python": sys.version.split()[0],
        "torch": None,
        "cuda": None,
        "nccl": None,
        "host": socket.gethostname(),
        "time_utc": utc_now(),
    }
    child = torch_facts.prefetched()
    info: Any = None
    if child is not None:
        info = (child.finished() or {}).get("torch_info")
    elif _loaded("torch") and _loaded("torch.distributed"):
        info = Probes().torch_info()
    if isinstance(info, dict):
        facts.update(torch=info.get("torch"), cuda=info.get("cuda"), nccl=info.get("nccl"))
    return facts


def collect_snapshot(ctx: CheckContext) -> dict[str, Any]:
    interfaces = ctx.memo("interfaces", ctx.probes.interfaces)
    gpus = ctx.gpus()
    return {
        "distdoctor": distdoctor_version(),
        "time_utc": utc_now(),
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
