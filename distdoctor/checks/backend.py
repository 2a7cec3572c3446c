"""Backends: torch.distributed itself, which of nccl/gloo/mpi/ucc/xccl are built, versions."""

from __future__ import annotations

from distdoctor.core.context import CheckContext
from distdoctor.machine.launchers import LSF, MPICH, OPENMPI, PMIX, SLURM
from distdoctor.machine.probes import Unknown
from distdoctor.machine.torch_facts import CANNOT_IMPORT, import_failed
from distdoctor.machine.torch_support import OLDEST_TEXT, refusal
from distdoctor.core.registry import check, finding_kind

DISTRIBUTED_MISSING = finding_kind(
    "backend.C001", cause="backend_unavailable",
    title="torch.distributed is not available in this torch build",
    hint="Install a torch build with distributed support (the Linux wheels from pytorch.org have it)",
)
BACKEND_NOT_BUILT = finding_kind(
    "backend.C002", cause="backend_unavailable",
    title="The requested backend is not built into this torch",
    hint="Install a torch build that includes the backend, or request one that is built",
)
BACKENDS_UNKNOWN = finding_kind(
    "backend.I003", cause="backend_unavailable",
    title="Could not tell which backends this torch has",
    hint="Check that `python -c 'import torch.distributed'` works in the job's environment",
)
NCCL_VERSIONS = finding_kind(
    "backend.I004", cause="version_incompat",
    title="NCCL and CUDA versions in use",
    hint="Every rank must run the same torch, CUDA and NCCL versions",
)
TORCH_BROKEN = finding_kind(
    "backend.C006", cause="backend_unavailable",
    title="torch cannot be imported in this environment",
    hint="Reinstall torch in the job's environment; `python -c 'import torch'` shows the error",
)
# The commands that run torch refuse such a torch at start (one line, machine.torch_support), and
# the embedded API raises PreflightError with this finding; the check below says it wherever the
# checks run without that gate (the pytest plugin, a checks-only call).
TORCH_UNSUPPORTED = finding_kind(
    "backend.E007", cause="version_incompat",
    title="This torch is older than the oldest release distdoctor supports",
    hint="Install torch 2.1 or newer in the job's environment (docs/compatibility.md lists the tested releases)",
)
NUMPY_UNUSABLE = finding_kind(
    "backend.E008", cause="version_incompat",
    title="This torch cannot use the installed NumPy (built against another NumPy major version)",
    hint="pip install 'numpy<2' in the job's environment, or a torch release built for NumPy 2",
)
TORCHVISION_MISMATCH = finding_kind(
    "backend.W009", cause="version_incompat",
    title="torchvision was built for another torch release",
    hint="Install the torchvision release made for this torch, from the same index as torch (pip install torch==<this> torchvision)",
)
MPI_WITHOUT_MPIRUN = finding_kind(
    "backend.W005", cause="launcher_misuse",
    title="The mpi backend is requested but no MPI launcher started this process",
    hint="Start the job with mpirun/mpiexec (or srun --mpi=pmix)",
)

# How to get each backend, for the remediation.
_HOW_TO_GET = {
    "nccl": "install a CUDA build of torch (e.g. pip install torch --index-url https://download.pytorch.org/whl/cu126) "
    "on a machine with NVIDIA GPUs; on CPU-only machines use backend='gloo'",
    "gloo": "gloo ships with the Linux and macOS wheels; reinstall the official torch wheel",
    "mpi": "build torch from source against your MPI (USE_MPI=1, with mpicc on PATH); the pip wheels have no MPI backend",
    "ucc": "build torch from source with USE_UCC=1 and UCC installed",
    "xccl": "install an XPU build of torch (pip install torch --index-url https://download.pytorch.org/whl/xpu) on Intel GPUs",
}


def torch_backends(ctx: CheckContext):
    return ctx.torch_info()


@check(stage="local", tags=("backend",), emits=(DISTRIBUTED_MISSING, BACKEND_NOT_BUILT, BACKENDS_UNKNOWN, NCCL_VERSIONS, TORCH_BROKEN))
def backend_available(ctx: CheckContext):
    """torch imports, torch.distributed is available and the requested backend is built."""
    info = torch_backends(ctx)
    backend = ctx.backend
    if isinstance(info, Unknown) and import_failed(info.reason):
        yield TORCH_BROKEN(
            f"torch cannot be imported here: {info.reason.removeprefix(CANNOT_IMPORT + ': ')}",
            detail="Every rank imports torch first: with this environment (PYTHONPATH, LD_LIBRARY_PATH, the "
            "installed wheel) the job fails before any process group exists."
            + (" A crash (a signal) usually means a broken CUDA or system library under torch." if "ended by" in info.reason else ""),
            remediation="Run `python -c 'import torch'` in the job's environment and reinstall torch "
            "(pip install --force-reinstall torch==<version>), or fix the library path it names",
            data={"reason": info.reason},
        )
        return
    if isinstance(info, Unknown):
        yield BACKENDS_UNKNOWN(
            f"Could not tell whether backend {backend!r} is built: {info.reason}",
            detail="Reading torch's build (importing torch, or torch.distributed) did not give an answer.",
            remediation="Run `python -c 'import torch, torch.distributed as d; print(d.is_available())'` in the job's environment",
            data={"backend": backend, "reason": info.reason},
        )
        return
    version = info.get("torch")
    if not info.get("distributed"):
        yield DISTRIBUTED_MISSING(
            f"torch {version} is built without torch.distributed",
            detail="torch.distributed.is_available() is False: init_process_group does not exist in this build "
            "(typical of some macOS/Windows or custom builds).",
            remediation="Install the official Linux wheel from pytorch.org (pip install torch), which includes torch.distributed",
            data={"torch": version},
        )
        return
    built = sorted(b for b, ok in (info.get("backends") or {}).items() if ok)
    if not (info.get("backends") or {}).get(backend):
        yield BACKEND_NOT_BUILT(
            f"Backend {backend!r} is not built into torch {version} (built: {', '.join(built) or 'none'})",
            detail=f"The backend comes from {ctx.backend_source}. init_process_group(backend={backend!r}) raises "
            f"\"Distributed package doesn't have {backend.upper()} built in\"."
            + (" This torch has no CUDA support at all (torch.version.cuda is None)." if backend == "nccl" and not info.get("cuda") else ""),
            remediation=_HOW_TO_GET.get(backend, "install a torch build with this backend")
            + (f"; or choose a built backend: {', '.join(built)}" if built else ""),
            data={"backend": backend, "built": built, "torch": version, "cuda": info.get("cuda"), "source": ctx.backend_source},
        )
        return
    if backend == "nccl":
        yield NCCL_VERSIONS(
            f"NCCL {info.get('nccl') or '?'} with CUDA {info.get('cuda') or '?'} (torch {version})",
            detail="The rendezvous stage compares these across ranks: a mismatch between nodes makes NCCL fail or hang.",
            remediation="Install the same torch wheel (hence the same CUDA and NCCL) on every node; "
            "NCCL_DEBUG=INFO prints the NCCL version each rank loads",
            data={"torch": version, "cuda": info.get("cuda"), "nccl": info.get("nccl")},
        )


@check(stage="local", tags=("backend",), emits=(TORCH_UNSUPPORTED,))
def torch_supported(ctx: CheckContext):
    """This torch is within the releases distdoctor supports (2.1 and newer)."""
    info = torch_backends(ctx)
    version = info.get("torch") if isinstance(info, dict) else None
    line = refusal(str(version)) if version else None
    if line is None:
        return
    yield TORCH_UNSUPPORTED(
        f"torch {version} is older than the oldest release distdoctor supports ({OLDEST_TEXT})",
        detail=line, remediation=f"pip install 'torch>={OLDEST_TEXT}' in the job's environment",
        data={"torch": version, "oldest": OLDEST_TEXT},
    )


@check(stage="local", tags=("backend",), emits=(NUMPY_UNUSABLE,))
def numpy_bridge(ctx: CheckContext):
    """torch's bridge to NumPy works (a torch built for NumPy 1 fails on NumPy 2)."""
    info = torch_backends(ctx)
    bridge = info.get("numpy") if isinstance(info, dict) else None
    if not isinstance(bridge, dict) or bridge.get("works") is not False:
        return  # NumPy absent (torch runs without it), working, or not told
    yield NUMPY_UNUSABLE(
        f"torch {info.get('torch')} cannot use NumPy {bridge.get('version')}: {bridge.get('error')}",
        detail="torch.from_numpy fails here, so does everything built on it: tensor.numpy(), DataLoader batches of "
        "NumPy arrays, and (on torch 2.1) broadcast_object_list. The NumPy message printed when torch is imported "
        "(\"A module that was compiled using NumPy 1.x cannot be run in NumPy 2...\") says the same.",
        remediation="pip install 'numpy<2' in the job's environment (or a torch release built for NumPy 2)",
        data={"torch": info.get("torch"), "numpy": bridge.get("version"), "error": bridge.get("error")},
    )


@check(stage="local", tags=("backend",), emits=(TORCHVISION_MISMATCH,))
def torchvision_matches(ctx: CheckContext):
    """An installed torchvision was built for this torch (its wheel's requirement, read without importing it)."""
    info = torch_backends(ctx)
    vision = info.get("torchvision") if isinstance(info, dict) else None
    if not isinstance(vision, dict) or vision.get("satisfied") is not False:
        return  # not installed, matching, or not told
    yield TORCHVISION_MISMATCH(
        f"torchvision {vision.get('version')} requires {vision.get('requires')}; this is torch {info.get('torch')}",
        detail="A torchvision built for another torch fails when the job imports it (\"operator torchvision::nms "
        "does not exist\") or in its compiled operators. distdoctor itself does not use torchvision.",
        remediation=f"pip install the torchvision release made for torch {info.get('torch')} from the same index as "
        "torch (e.g. pip install 'torch==<this version>' torchvision, which resolves the matching one)",
        data={"torch": info.get("torch"), "torchvision": vision.get("version"), "requires": vision.get("requires")},
    )


@check(stage="local", tags=("backend", "mpi"), emits=(MPI_WITHOUT_MPIRUN,))
def mpi_backend_launcher(ctx: CheckContext):
    """backend='mpi' takes rank and size from MPI, so it needs an MPI launcher."""
    if ctx.backend != "mpi":
        return
    launchers = {ctx.launch.launcher, *ctx.launch.also_present}
    if launchers & {OPENMPI, MPICH, PMIX, LSF}:
        return
    if SLURM in launchers and any(k.startswith(("PMI_", "PMIX_")) for k in ctx.env):
        return  # srun --mpi=pmi2/pmix provides the MPI wire-up
    yield MPI_WITHOUT_MPIRUN(
        f"backend 'mpi' requested, but this process was started by {ctx.launch.title}",
        detail="With backend='mpi' torch ignores RANK/WORLD_SIZE and asks MPI: a process not started by an MPI "
        "launcher is a world of size 1 (or fails in MPI_Init).",
        remediation="mpirun -np N python script.py (Open MPI), mpiexec -n N python script.py (MPICH), or srun --mpi=pmix",
        data={"launcher": ctx.launch.launcher},
    )
