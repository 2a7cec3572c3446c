"""CheckContext: one snapshot of env, argv, launcher and config, with the probes injected."""

from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, TypeVar

from distdoctor.config import Config
from distdoctor.findings import Finding
from distdoctor.launchers import LaunchInfo, detect
from distdoctor.probes import Probes

T = TypeVar("T")


@dataclass
class CheckContext:
    env: Mapping[str, str]
    argv: tuple[str, ...]
    config: Config
    launch: LaunchInfo
    probes: Probes
    # A live cross-rank world (distdoctor.world) for the rendezvous and collective stages;
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


def build_context(
    config: Config,
    env: Mapping[str, str] | None = None,
    argv: tuple[str, ...] | list[str] | None = None,
    probes: Probes | None = None,
    world: Any = None,
) -> CheckContext:
    env_snapshot = dict(os.environ if env is None else env)
    argv_snapshot = tuple(sys.argv if argv is None else argv)
    return CheckContext(
        env=env_snapshot,
        argv=argv_snapshot,
        config=config,
        launch=detect(env_snapshot, argv_snapshot),
        probes=probes or Probes(),
        world=world,
    )
