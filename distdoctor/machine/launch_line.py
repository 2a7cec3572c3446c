"""A launcher's command line (torchrun, python -m torch.distributed.run, srun, mpirun) read before
it runs: the world it will form on this node, so `distdoctor check -- <line>` can check what the
launcher itself would hang on, without RANK / WORLD_SIZE, which it has not set yet."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

TORCHRUN_NAMES = ("torchrun",)
TORCHRUN_MODULES = ("torch.distributed.run", "torch.distributed.launch")
C10D_DEFAULT_PORT = 29400  # torchrun's c10d rendezvous port when --rdzv-endpoint has none
STATIC_DEFAULT_PORT = 29500  # --master-port's default
NPROC_KEYWORDS = ("gpu", "cpu", "auto", "xpu")

# Options that take values, by how many (others are flags). Both spellings of torchrun's
# options are accepted: --nproc-per-node and --nproc_per_node.
_TORCHRUN_VALUED = dict.fromkeys((
    "nnodes", "nproc-per-node", "rdzv-backend", "rdzv-endpoint", "rdzv-id", "rdzv-conf", "max-restarts",
    "monitor-interval", "start-method", "role", "node-rank", "master-addr", "master-port", "local-addr",
    "log-dir", "redirects", "tee", "local-ranks-filter", "logs-specs", "event-log-handler", "numa-binding",
    "signals-to-handle", "r", "t",
), 1)
_SRUN_VALUED = dict.fromkeys((
    "n", "ntasks", "N", "nodes", "ntasks-per-node", "c", "cpus-per-task", "p", "partition", "J", "job-name",
    "t", "time", "mem", "gres", "gpus", "gpus-per-node", "export", "mpi", "cpu-bind", "distribution", "m", "w",
    "nodelist", "x", "exclude", "A", "account", "o", "e", "output", "error", "chdir", "D", "K", "kill-on-bad-exit",
), 1)
_MPIRUN_VALUED = {
    **dict.fromkeys(("np", "n", "c", "npernode", "N", "map-by", "H", "host", "hostfile", "machinefile", "f",
                     "bind-to", "x", "wdir", "rank-by", "output-filename"), 1),
    **dict.fromkeys(("mca", "gmca", "genv", "env"), 2),
}


class LaunchLineError(ValueError):
    """The launch line cannot be read (a usage error)."""


@dataclass(frozen=True)
class PlannedLaunch:
    """What the line will start on this node, as far as the line says."""

    launcher: str  # "torchrun", "slurm" or "openmpi"
    line: str
    nnodes: int = 1
    nproc_per_node: int | str | None = None  # an int or a torchrun keyword (gpu, cpu, auto)
    node_rank: int | None = None
    rdzv_backend: str = "static"
    master_addr: str | None = None
    master_port: int | None = None
    standalone: bool = False
    tasks: int | None = None  # srun/mpirun: the task count
    tasks_per_node: int | None = None
    inner: "PlannedLaunch | None" = None  # the torchrun an srun/mpirun line starts
    hosts: tuple[str, ...] = ()

    @property
    def command(self) -> str:
        return self.line.split()[0] if self.line else self.launcher


def _int(option: str, value: str, minimum: int = 0, maximum: int = 1 << 20) -> int:
    text = value.strip()
    if not (text.isascii() and text.isdigit()) or len(text) > 8 or not minimum <= int(text) <= maximum:
        raise LaunchLineError(f"{option} {value!r}: expected an integer from {minimum} to {maximum}")
    return int(text)


def _canonical(name: str, valued: Mapping[str, int]) -> str:
    return name if name in valued else name.replace("_", "-")


def _options(argv: Sequence[str], valued: Mapping[str, int]) -> tuple[dict[str, list[str]], list[str]]:
    """(option -> its values, the command from the first positional on). Accepts --opt=v,
    --opt v and -o v; an option not in ``valued`` is read as a flag."""
    found: dict[str, list[str]] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            return found, list(argv[i + 1:])
        if not arg.startswith("-") or arg == "-":
            return found, list(argv[i:])
        name, eq, value = arg.lstrip("-").partition("=")
        name = _canonical(name, valued)
        takes = valued.get(name, 0)
        if not eq and takes:
            if i + takes >= len(argv):
                raise LaunchLineError(f"{arg} needs a value")
            value = " ".join(argv[i + 1:i + 1 + takes])
            i += takes
        found.setdefault(name, []).append(value)
        i += 1
    return found, []


def _last(found: dict[str, list[str]], *names: str) -> str | None:
    for name in names:
        if name in found:
            return found[name][-1]
    return None


def _endpoint(option: str, text: str, default_port: int) -> tuple[str, int]:
    host, port = text, default_port
    if text.startswith("["):  # [::1]:29400
        host, _, rest = text[1:].partition("]")
        if rest.startswith(":"):
            port = _int(option, rest[1:], 0, 65535)
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
        port = _int(option, port_text, 0, 65535)
    if not host:
        raise LaunchLineError(f"{option} {text!r}: no host")
    return host, port


def _nnodes(text: str | None) -> int:
    """--nnodes N or MIN:MAX (elastic): the world forms once MIN nodes joined."""
    if text is None:
        return 1
    low = text.split(":", 1)[0]
    return _int("--nnodes", low, 1)


def parse_torchrun(argv: Sequence[str], line: str) -> PlannedLaunch:
    found, _rest = _options(argv, _TORCHRUN_VALUED)
    nproc_text = _last(found, "nproc-per-node")
    nproc: int | str | None = 1
    if nproc_text is not None:
        nproc = nproc_text if nproc_text in NPROC_KEYWORDS else _int("--nproc-per-node", nproc_text, 1)
    node_rank_text = _last(found, "node-rank")
    planned = PlannedLaunch(
        "torchrun", line, nnodes=_nnodes(_last(found, "nnodes")), nproc_per_node=nproc,
        node_rank=_int("--node-rank", node_rank_text) if node_rank_text is not None else None,
        standalone="standalone" in found,
    )
    endpoint = _last(found, "rdzv-endpoint")
    backend = _last(found, "rdzv-backend")
    if planned.standalone:
        return replace(planned, rdzv_backend="c10d", master_addr="localhost", master_port=0)
    if endpoint:
        host, port = _endpoint("--rdzv-endpoint", endpoint, C10D_DEFAULT_PORT)
        return replace(planned, rdzv_backend=backend or "static", master_addr=host, master_port=port)
    if planned.nnodes == 1 and _last(found, "master-addr", "master-port") is None:
        # torch 2.x: a single-node torchrun without an endpoint picks a free port on loopback.
        return replace(planned, rdzv_backend=backend or "static", master_addr="127.0.0.1", master_port=0)
    port_text = _last(found, "master-port")
    return replace(planned, rdzv_backend=backend or "static", master_addr=_last(found, "master-addr") or "127.0.0.1",
                   master_port=_int("--master-port", port_text, 0, 65535) if port_text else STATIC_DEFAULT_PORT)


def _inner(rest: Sequence[str]) -> PlannedLaunch | None:
    """The torchrun an srun / mpirun line starts, if it starts one."""
    if not rest:
        return None
    try:
        return parse_launch_line(rest)
    except LaunchLineError:
        return None


def parse_srun(argv: Sequence[str], line: str) -> PlannedLaunch:
    found, rest = _options(argv, _SRUN_VALUED)
    tasks = _last(found, "n", "ntasks")
    nodes = _last(found, "N", "nodes")
    per_node = _last(found, "ntasks-per-node")
    nodes_n = _int("--nodes", nodes.split("-", 1)[0], 1) if nodes else 1
    per_node_n = _int("--ntasks-per-node", per_node, 1) if per_node else None
    tasks_n = _int("--ntasks", tasks, 1) if tasks else (per_node_n * nodes_n if per_node_n else nodes_n)
    inner = _inner(rest)
    return PlannedLaunch("slurm", line, nnodes=nodes_n, tasks=tasks_n,
                         tasks_per_node=per_node_n or -(-tasks_n // nodes_n), inner=inner if inner and inner.launcher == "torchrun" else None)


def parse_mpirun(argv: Sequence[str], line: str) -> PlannedLaunch:
    found, rest = _options(argv, _MPIRUN_VALUED)
    tasks = _last(found, "np", "n", "c")
    per_node = _last(found, "npernode", "N")
    mapping = _last(found, "map-by") or ""
    if mapping.startswith("ppr:") and mapping.endswith(":node"):
        per_node = mapping.split(":")[1]
    hosts = tuple(h.split(":", 1)[0] for value in found.get("H", []) + found.get("host", []) for h in value.split(",") if h)
    if "hostfile" in found:
        raise LaunchLineError("mpirun --hostfile: distdoctor does not read host files; give the hosts with -H instead")
    distinct = tuple(dict.fromkeys(hosts))
    tasks_n = _int("-np", tasks, 1) if tasks else None
    per_node_n = _int("-npernode", per_node, 1) if per_node else None
    nodes = max(len(distinct), 1)
    if tasks_n is None:
        tasks_n = (per_node_n or 1) * nodes
    inner = _inner(rest)
    return PlannedLaunch("openmpi", line, nnodes=nodes, tasks=tasks_n, tasks_per_node=per_node_n or -(-tasks_n // nodes),
                         hosts=distinct, inner=inner if inner and inner.launcher == "torchrun" else None)


def parse_launch_line(argv: Sequence[str]) -> PlannedLaunch:
    """Read a launch line: torchrun ..., python -m torch.distributed.run ..., srun ..., mpirun ..."""
    if not argv:
        raise LaunchLineError("no launch line after --")
    line = " ".join(argv)
    program = os.path.basename(argv[0])
    if program in TORCHRUN_NAMES:
        return parse_torchrun(argv[1:], line)
    if program.startswith("python") and len(argv) > 2 and argv[1] == "-m" and argv[2] in TORCHRUN_MODULES:
        return parse_torchrun(argv[3:], line)
    if program == "srun":
        return parse_srun(argv[1:], line)
    if program in ("mpirun", "mpiexec", "orterun"):
        return parse_mpirun(argv[1:], line)
    raise LaunchLineError(
        f"{argv[0]!r} is not a launcher distdoctor can read: give torchrun, python -m torch.distributed.run, "
        "srun or mpirun (e.g. distdoctor check -- torchrun --nnodes 2 --nproc-per-node 8 --rdzv-endpoint HOST:PORT train.py)"
    )
