"""Torch's calls wrapped for the accounting: backward, DDP's and FSDP's forward (waits for peers), DataLoader next()."""

# DDP's gradient all-reduce runs in C++ during `loss.backward()` and its main thread waits for it at
# the end of backward (on a CPU process the autograd engine runs on the calling thread); a DDP
# forward broadcasts the module's buffers when it has any (broadcast_buffers); an FSDP forward
# waits for its all-gathers. So `torch.autograd.backward` (what `Tensor.backward` calls) and the
# `forward` of DistributedDataParallel and FullyShardedDataParallel are wrapped, and restored at
# the end. Every name is probed where it is used: a torch without one is simply not wrapped there
# (its waits are then seen by the profile's samples only). The forward wrappers also note whether
# the coming backward syncs gradients (`require_backward_grad_sync`, False under no_sync() and
# gradient accumulation): only such a backward ends a step. A DataLoader iterator's `__next__` is
# timed for the profile (pace.loader: its data lines are measured, not sampled).

from __future__ import annotations

import functools
import sys
import threading
from typing import Any, Callable

FSDP_MODULE = "torch.distributed.fsdp"
LOADER_ITER = "torch.utils.data.dataloader._BaseDataLoaderIter.__next__"


class Hooks:
    """The wrappers this process installed, to be undone."""

    def __init__(self, regions: Any, group_of: Callable[[Any], str], loader: Any = None) -> None:
        self.regions, self.group_of, self.loader = regions, group_of, loader
        self.undo: list[tuple[Any, str, Any]] = []
        self.fsdp_done = False
        self._syncs_buffers: dict[int, bool] = {}

    def install(self, torch: Any) -> list[str]:
        """Wrap what this torch has; the names it lacks, in words."""
        lacks = []
        autograd = getattr(torch, "autograd", None)
        if callable(getattr(autograd, "backward", None)):
            self._patch(autograd, "backward", self._backward(autograd.backward))
        else:
            lacks.append("torch.autograd.backward")
        ddp = getattr(getattr(getattr(torch, "nn", None), "parallel", None), "DistributedDataParallel", None)
        if ddp is not None and callable(getattr(ddp, "forward", None)):
            self._patch(ddp, "forward", self._forward(ddp.forward, ddp=True))
        else:
            lacks.append("torch.nn.parallel.DistributedDataParallel.forward")
        self.install_fsdp()
        if self.loader is not None:
            iterator = getattr(getattr(getattr(getattr(torch, "utils", None), "data", None), "dataloader", None),
                               "_BaseDataLoaderIter", None)
            if iterator is not None and callable(iterator.__dict__.get("__next__")):
                self._patch(iterator, "__next__", self._next(iterator.__dict__["__next__"]))
            else:
                lacks.append(LOADER_ITER)
        return lacks

    def install_fsdp(self) -> None:
        """FSDP once the job imported it (importing it here would cost the job seconds for nothing)."""
        if self.fsdp_done or FSDP_MODULE not in sys.modules:
            return
        self.fsdp_done = True
        fsdp = getattr(sys.modules[FSDP_MODULE], "FullyShardedDataParallel", None)
        if fsdp is not None and callable(getattr(fsdp, "forward", None)):
            self._patch(fsdp, "forward", self._forward(fsdp.forward, ddp=False))

    def uninstall(self) -> None:
        for owner, name, original in reversed(self.undo):
            setattr(owner, name, original)
        self.undo.clear()

    def _patch(self, owner: Any, name: str, wrapped: Callable[..., Any]) -> None:
        original = owner.__dict__.get(name, getattr(owner, name))
        self.undo.append((owner, name, original))
        setattr(owner, name, wrapped)

    def _backward(self, original: Callable[..., Any]) -> Callable[..., Any]:
        regions = self.regions

        main, ident = regions.ident, threading.get_ident

        @functools.wraps(original)
        def backward(*args: Any, **kwargs: Any) -> Any:
            if ident() != main:  # the accounting follows the main thread only
                return original(*args, **kwargs)
            token = regions.enter()
            try:
                return original(*args, **kwargs)
            finally:
                regions.leave_backward(token)

        backward.__distdoctor_original__ = original  # type: ignore[attr-defined]
        return backward

    def _next(self, original: Callable[..., Any]) -> Callable[..., Any]:
        loader = self.loader
        main, ident = loader.main, threading.get_ident

        @functools.wraps(original)
        def __next__(iterator: Any) -> Any:
            if ident() != main or not loader.enter():
                return original(iterator)
            try:
                return original(iterator)
            finally:
                loader.leave()

        __next__.__distdoctor_original__ = original  # type: ignore[attr-defined]
        return __next__

    def _forward(self, original: Callable[..., Any], *, ddp: bool) -> Callable[..., Any]:
        regions, group_of, syncs_buffers = self.regions, self.group_of, self._buffers_synced
        main, ident = regions.ident, threading.get_ident
        groups: dict[int, str] = {}

        @functools.wraps(original)
        def forward(module: Any, *args: Any, **kwargs: Any) -> Any:
            if ident() != main:
                return original(module, *args, **kwargs)
            group = groups.get(id(module))
            if group is None:  # once per model: a forward is on every step's path
                group = groups[id(module)] = group_of(getattr(module, "process_group", None))
            if getattr(module, "require_backward_grad_sync", True):
                regions.sync_group = group
            if ddp and not syncs_buffers(module):  # no collective in this forward: nothing to wait for
                return original(module, *args, **kwargs)
            token = regions.enter()
            try:
                return original(module, *args, **kwargs)
            finally:
                regions.leave(token, group, step=False)

        forward.__distdoctor_original__ = original  # type: ignore[attr-defined]
        return forward

    def _buffers_synced(self, module: Any) -> bool:
        """Whether a DDP module's forward broadcasts its buffers (asked once per module)."""
        known = self._syncs_buffers.get(id(module))
        if known is None:
            probe = getattr(module, "will_sync_module_buffers", None)
            try:
                known = bool(probe()) if callable(probe) else True
            except Exception:  # a private method of torch's: when in doubt, measure
                known = True
            self._syncs_buffers[id(module)] = known
        return known
