"""CheckContext: one snapshot of env, argv, launcher and config, with the probes injected; WorldError."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, TypeVar

from distdoctor.core.config import Config
from distdoctor.core.findings import Finding

T = TypeVar("T")


@dataclass
class CheckContext:
    env: Mapping[str, str]
    argv: tuple[str, ...]
    config: Config
    # The launcher's view (distdoctor.machine.launchers.LaunchInfo) and the probes
    # (distdoctor.machine.probes.Probes); built by distdoctor.machine.host.build_context.
    launch: Any
    probes: Any
    # A live cross-rank world (distdoctor.world.store_exchange) for the rendezvous and collective stages;
    # None when no world is configured, and those stages are then skipped with that reason.
    world: Any = None
    # Findings of the stages already run on this rank, for checks that build on them.
    earlier_findings: list[Finding] = field(default_factory=list)
    _memo: dict[str, Any] = field(default_factory=dict, repr=False)
    _memo_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def memo(self, key: str, compute: Callable[[], T]) -> T:
        """Compute a fact once per run (a DNS answer, the interface list) and share it."""
        with self._memo_lock:
            if key in self._memo:
                return self._memo[key]
        value = compute()
        with self._memo_lock:
            return self._memo.setdefault(key, value)

    @property
    def rank(self) -> int | None:
        return self.launch.rank.value

    @property
    def world_size(self) -> int | None:
        return self.launch.world_size.value

    def torch_info(self) -> Any:
        return self.memo("torch_info", self.probes.torch_info)

    def gpus(self) -> Any:
        return self.memo("gpus", self.probes.gpus)

    @property
    def backend(self) -> str:
        """The backend the job will use: as configured, else nccl when GPUs are visible, else gloo."""
        if self.config.backend:
            return self.config.backend
        gpus = self.gpus()
        return "nccl" if gpus else "gloo"

    @property
    def backend_source(self) -> str:
        if self.config.backend:
            return self.config.sources.get("backend", "configuration")
        return "default (nccl with GPUs, else gloo)"


class WorldError(Exception):
    """The store could not be reached or used; ``cause`` is a vocabulary cause for the finding.

    ``reason`` says which failure it was, for the finding that names it: ``unreachable`` (no
    listener, no route, no host), ``dropped`` (connects time out: packets dropped), ``port_taken``
    (rank 0: EADDRINUSE and nothing answers), ``master_not_here`` (rank 0: MASTER_ADDR is not an
    address of this host and does not lead here), ``host_failed`` (rank 0: any other error).
    """

    def __init__(self, message: str, cause: str = "master_unreachable", reason: str = "unreachable",
                 data: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.cause = cause
        self.reason = reason
        self.data = dict(data or {})
