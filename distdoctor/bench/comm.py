"""The bench's handle on a live process group: device buffers, agreement between ranks, and timers.

gloo runs on CPU tensors and is timed with perf_counter (its collectives return when done);
NCCL runs on the rank's GPU and is timed with CUDA events recorded on the current stream,
read after the end event synchronised, as nccl-tests does.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Sequence


@dataclass
class Comm:
    dist: Any
    torch: Any
    group: Any
    device: Any
    rank: int
    size: int
    backend: str

    @property
    def on_gpu(self) -> bool:
        return getattr(self.device, "type", "cpu") == "cuda"

    def full(self, count: int, value: float) -> Any:
        return self.torch.full((count,), float(value), dtype=self.torch.float32, device=self.device)

    def agree_max(self, values: Sequence[float]) -> list[float]:
        """Every rank's values, maxed element-wise across ranks: one small all_reduce, which
        also keeps the ranks in step (every rank must call it at the same point)."""
        tensor = self.torch.tensor([float(v) for v in values], dtype=self.torch.float64 if not self.on_gpu
                                   else self.torch.float32, device=self.device)
        self.dist.all_reduce(tensor, op=self.dist.ReduceOp.MAX, group=self.group)
        return [float(v) for v in tensor.cpu().tolist()]

    def timer(self) -> "Timer":
        return CudaTimer(self.torch) if self.on_gpu else WallTimer()

    def sync(self) -> None:
        if self.on_gpu:
            self.torch.cuda.synchronize(self.device)


class Timer:
    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> float:
        """Seconds since start, after the device finished the work queued in between."""
        raise NotImplementedError


class WallTimer(Timer):
    def start(self) -> None:
        self._t0 = time.perf_counter()

    def stop(self) -> float:
        return time.perf_counter() - self._t0


class CudaTimer(Timer):
    def __init__(self, torch: Any) -> None:
        self._begin = torch.cuda.Event(enable_timing=True)
        self._end = torch.cuda.Event(enable_timing=True)

    def start(self) -> None:
        self._begin.record()

    def stop(self) -> float:
        self._end.record()
        self._end.synchronize()
        return self._begin.elapsed_time(self._end) / 1000.0
