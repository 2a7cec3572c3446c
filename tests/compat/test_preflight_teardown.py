"""preflight keeps its last collectives' CPU tensors referenced (torch 2.1-2.4's gloo teardown
deadlock: compat/matrix.py's preflight case runs the real job on 2.1.2), never a GPU's."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from distdoctor.embedded import preflight

torch = pytest.importorskip("torch")


def test_cpu_tensors_are_held_for_the_last_collectives_only(monkeypatch):
    monkeypatch.setattr(preflight, "_HELD", type(preflight._HELD)(maxlen=preflight._HELD.maxlen))
    tensors = [torch.zeros(1) for _ in range(6)]
    for t in tensors:
        preflight._hold(t, [t.clone(), t.clone()])
    held = list(preflight._HELD)
    assert len(held) == preflight._HELD.maxlen >= 2  # at least the last one per gloo worker (2)
    assert held[-1][0] is tensors[-1] and len(held[-1]) == 3


def test_gpu_tensors_are_never_kept(monkeypatch):
    monkeypatch.setattr(preflight, "_HELD", type(preflight._HELD)(maxlen=preflight._HELD.maxlen))
    on_gpu = SimpleNamespace(device=SimpleNamespace(type="cuda"))
    preflight._hold(on_gpu, [on_gpu])
    assert list(preflight._HELD) == []
