"""Fixtures that start real launchers: a throw-away single-node SLURM cluster, Open MPI's mpirun."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from slurm_cluster import running_cluster  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def child_env(base: dict[str, str] | None = None, **extra: str) -> dict[str, str]:
    """The environment for a launched `python -m distdoctor`: this checkout's code, no inherited world."""
    env = dict(os.environ if base is None else base)
    for key in list(env):
        if key.startswith(("SLURM_", "OMPI_", "PMI", "PMIX_", "TORCHELASTIC_", "DISTDOCTOR_")) or key in (
            "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "NODE_RANK",
        ):
            del env[key]
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH", "")])])
    env.update(extra)
    return env


@pytest.fixture(scope="session")
def slurm_cluster():
    yield from running_cluster("distdoctor-slurm-")


@pytest.fixture(scope="session")
def mpirun():
    path = shutil.which("mpirun")
    if path is None:
        pytest.skip("Open MPI not installed (mpirun missing): apt-get install openmpi-bin")
    version = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    if "Open MPI" not in version:
        pytest.skip(f"mpirun is not Open MPI: {version.splitlines()[:1]}")
    return path

