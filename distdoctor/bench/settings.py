"""What one `distdoctor bench` run was asked to do (validated at the CLI, the same on every rank)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from distdoctor.core.findings import Severity

DEFAULT_TIMEOUT_S = 120.0
DEFAULT_ITERS, DEFAULT_WARMUP = 20, 5
# Point-to-point message of the link matrix: large enough that bandwidth, not latency, dominates
# on Ethernet, small enough that a link throttled to a few MB/s still finishes a round trip.
CPU_LINK_BYTES, GPU_LINK_BYTES = 2**20, 4 * 2**20
BACKENDS = ("gloo", "nccl")


@dataclass(frozen=True)
class BenchSettings:
    ops: tuple[str, ...]
    sizes: tuple[int, ...] | None = None  # None: the default for the device the world runs on
    iters: int = DEFAULT_ITERS
    warmup: int = DEFAULT_WARMUP
    timeout: float = DEFAULT_TIMEOUT_S
    backend: str | None = None  # None: nccl when every rank has its GPU, else gloo
    link_bytes: int | None = None
    links: bool = True
    nproc: int | None = None
    baseline: Any = None  # the figures of --compare FILE, loaded at the CLI
    tolerance: float = 0.2
    progress: bool = False
    # What the self-test supervisor reads from any run's settings.
    silence: tuple[str, ...] = ()
    fail_level: Severity = Severity.ERROR

    def plan(self) -> dict[str, Any]:
        """The JSON-able part rank 0 publishes, so every rank runs rank 0's plan."""
        return {"ops": list(self.ops), "sizes": list(self.sizes) if self.sizes else None, "iters": self.iters,
                "warmup": self.warmup, "link_bytes": self.link_bytes, "links": self.links}
