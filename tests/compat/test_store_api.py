"""The store interfaces older torch releases lack, made from ones they have, on real torch stores."""

from __future__ import annotations

import os
import socket
import sys
import time
from datetime import timedelta

import pytest

from distdoctor.world import store_api
from distdoctor.world.checkin import CheckInProtocol, Prefixed

dist = pytest.importorskip("torch.distributed")


class WithoutCheck:
    """A real torch store seen as torch 2.1 and 2.2 bind it: every method but ``check``."""

    def __init__(self, store):
        self._store = store

    def __getattr__(self, name):
        if name == "check":
            raise AttributeError(f"'{type(self._store).__name__}' object has no attribute 'check'")
        return getattr(self._store, name)


def tcp_store():
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))


@pytest.mark.parametrize("make", [tcp_store, dist.HashStore], ids=["TCPStore", "HashStore"])
def test_presence_without_check_is_told_by_compare_set_and_writes_nothing(make):
    real = make()
    real.set("there", "value")
    old = WithoutCheck(real)
    assert store_api.has_check(real) and not store_api.has_check(old)
    keys_before = real.num_keys()
    assert store_api.keys_exist(old, ["there"]) is True
    assert store_api.keys_exist(old, ["missing"]) is False
    assert store_api.keys_exist(old, ["there", "missing"]) is False
    # Asking wrote nothing: the missing key is still missing, the present one unchanged.
    assert real.num_keys() == keys_before
    assert real.check(["missing"]) is False and real.get("there") == b"value"
    # The same answers as torch's own check where it has one.
    for keys in (["there"], ["missing"], ["there", "missing"]):
        assert store_api.keys_exist(real, keys) == real.check(keys)


def test_a_value_that_looks_like_the_probe_is_still_present():
    real = dist.HashStore()
    real.set("k", "distdoctor-absent-" + "0" * 32)  # not this process's token
    assert store_api.keys_exist(WithoutCheck(real), ["k"]) is True


def test_the_check_in_protocol_runs_on_a_store_without_check():
    """A 2-rank check-in as the world, the bounded init and preflight run it, on a torch-2.1-like store."""
    real = tcp_store()
    client = dist.TCPStore("127.0.0.1", real.port, is_master=False, timeout=timedelta(seconds=10))
    p0 = CheckInProtocol(Prefixed(WithoutCheck(real), "t/"), size=2)
    p1 = CheckInProtocol(Prefixed(WithoutCheck(client), "t/"), size=2)
    until = time.monotonic() + 5
    assert p0.check_in(0, {"pid": 1}, until) == (1, False)
    assert p1.check_in(1, {"pid": 2}, until) == (1, False)
    seen, _ = p0.wait_roster(2, time.monotonic() + 5)
    assert set(seen) == {(0, 1), (1, 1)} and not p0.malformed
    p0.set("results/0", {"ok": True})
    assert p1.read_many(["results/0", "results/1"]) == {"results/0": {"ok": True}, "results/1": None}
    assert p1.wait_for({"results/0": ({}, ())}, time.monotonic() + 2) == ("results/0", {"ok": True})


REAL_TCPSTORE = dist.TCPStore


def _inode(fd: str) -> int | None:
    try:
        return os.stat(f"/proc/self/fd/{fd}").st_ino
    except OSError:
        return None


class LibuvWithoutListenFd:
    """torch 2.4's TCPStore as far as a listen fd goes: its default (libuv) backend refuses one,
    logging the refusal in C++ on stderr first; ``use_libuv=False`` serves on it."""

    def __new__(cls, *args, **kwargs):
        if kwargs.get("master_listen_fd") is not None and kwargs.get("use_libuv", True):
            os.write(2, b"[E1126 TCPStore.cpp:301] [c10d] The libuv TCPStore backend does not support "
                        b"initialization with an listen fd. Please switch to the legacy TCPStore\n")
            raise NotImplementedError("The libuv TCPStore backend does not support initialization with an listen fd.")
        return REAL_TCPSTORE(*args, **kwargs)


def test_a_listen_fd_refused_by_the_default_backend_is_served_by_the_legacy_one(monkeypatch, capfd):
    monkeypatch.setattr(dist, "TCPStore", LibuvWithoutListenFd)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    inode = os.fstat(listener.fileno()).st_ino
    store = store_api.serve_on_listener("127.0.0.1", port, listener.fileno(), wait_for_workers=False,
                                        timeout=timedelta(seconds=10))
    listener.close()  # the store serves on its own copy
    # One descriptor of the listening socket is left, the store's: the refused copy was closed.
    assert sum(1 for fd in os.listdir("/proc/self/fd") if _inode(fd) == inode) == 1
    client = REAL_TCPSTORE("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))
    client.set("k", "v")
    assert store.get("k") == b"v"
    err = capfd.readouterr().err
    assert "listen fd" not in err  # torch's advice (USE_LIBUV=0) would mislead: held back


def test_other_errors_of_the_store_are_not_retried_and_stderr_comes_back(monkeypatch, capfd):
    def refuses(*args, **kwargs):
        os.write(2, b"[E] something else entirely\n")
        raise RuntimeError("The server socket has failed to listen on any local network address. EADDRINUSE")

    monkeypatch.setattr(dist, "TCPStore", refuses)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        with pytest.raises(RuntimeError, match="EADDRINUSE"):
            store_api.serve_on_listener("127.0.0.1", listener.getsockname()[1], listener.fileno())
    assert "something else entirely" in capfd.readouterr().err


def test_the_rendezvous_options_follow_what_this_torchs_rendezvous_has(monkeypatch):
    import importlib

    rendezvous = importlib.import_module("torch.distributed.rendezvous")
    options = store_api.rendezvous_store_options
    if hasattr(rendezvous, "_get_use_libuv_from_query_dict") and sys.platform != "win32":
        assert options("env", {}, {}) == {"use_libuv": True}
        assert options("env", {}, {"USE_LIBUV": "0"}) == {"use_libuv": False}
        assert options("tcp", {"use_libuv": "0"}, {"USE_LIBUV": "1"}) == {"use_libuv": False}
    monkeypatch.delattr(rendezvous, "_get_use_libuv_from_query_dict", raising=False)

    def create_2_3(hostname, port, rank, world_size, timeout, use_libuv=False):
        pass

    monkeypatch.setattr(rendezvous, "_create_c10d_store", create_2_3)
    # torch 2.2-2.3: legacy unless asked; env:// reads USE_LIBUV, tcp:// only its URL.
    assert options("env", {}, {}) == {"use_libuv": False}
    assert options("env", {}, {"USE_LIBUV": "1"}) == {"use_libuv": True}
    assert options("tcp", {}, {"USE_LIBUV": "1"}) == {"use_libuv": False}
    assert options("tcp", {"use_libuv": "1"}, {}) == {"use_libuv": True}

    def create_2_1(hostname, port, rank, world_size, timeout):
        pass

    monkeypatch.setattr(rendezvous, "_create_c10d_store", create_2_1)
    assert options("env", {}, {"USE_LIBUV": "1"}) == {}  # torch 2.1 passes no choice: neither do we


@pytest.mark.parametrize("exc, refused", [
    (NotImplementedError("The libuv TCPStore backend does not support initialization with an listen fd."), True),
    (RuntimeError("Libuv implementation missing"), True),
    (RuntimeError("use_libuv was requested but PyTorch was build without libuv support"), True),
    (TypeError("__init__(): incompatible constructor arguments. The following argument types are supported"), True),
    (RuntimeError("The server socket has failed to listen on any local network address. EADDRINUSE"), False),
    (RuntimeError("The client socket has timed out after 30s while trying to connect to (10.0.0.1, 29500)."), False),
])
def test_a_refusal_of_this_torch_build_is_told_from_a_network_error(exc, refused):
    assert bool(store_api.store_refusal(exc)) is refused
