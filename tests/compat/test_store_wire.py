"""distdoctor's own store client (world.store_wire) against torch's real stores and emulated older ones: the
same keys as torch's clients, every request bounded, a failed request never read as the next one's answer."""

from __future__ import annotations

import select
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta

import pytest

from distdoctor.world.store_wire import PINGING, PRE_VALIDATION, VALIDATING, StoreClient, StoreWireError
from tests.conftest import measured_startup_s

from .test_store_identity import old_store

dist = pytest.importorskip("torch.distributed")


def real_store(libuv: bool) -> "dist.TCPStore":
    kwargs = {"use_libuv": libuv} if "use_libuv" in (dist.TCPStore.__init__.__doc__ or "") else {}
    if kwargs == {} and not libuv:
        pytest.skip("this torch's TCPStore has no use_libuv option")
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10),
                         **kwargs)


@pytest.mark.parametrize("libuv", [True, False], ids=["libuv", "legacy"])
def test_every_method_reads_and_writes_the_keys_torchs_own_clients_see(libuv):
    store = real_store(libuv)
    client = StoreClient("127.0.0.1", store.port, timeout_s=5)
    client.set("a", "1")
    store.set("b", b"\x00\xff")
    assert store.get("a") == b"1" and client.get("b") == b"\x00\xff"
    assert client.compare_set("missing", "token", "token") == b"token" and not client.check(["missing"])
    assert client.compare_set("a", "1", "2") == b"2" and store.get("a") == b"2"
    assert client.add("n", 3) == 3 and store.add("n", 1) == 4 and client.add("n", 0) == 4
    client.append("a", "9")
    assert store.get("a") == b"29"
    assert client.multi_get(["a", "b"]) == [b"29", b"\x00\xff"] and client.multi_get([]) == []
    assert client.check(["a", "b"]) and client.delete_key("b") and not client.check(["b"])
    assert client.generation == PINGING
    client.close()
    assert client.add("n", 0) == 4  # a closed client opens its connection again at the next request


@pytest.mark.parametrize("validating, generation", [(False, PRE_VALIDATION), (True, VALIDATING)],
                         ids=["torch-2.1", "torch-2.2-2.4"])
def test_a_store_without_the_ping_query_is_spoken_to_in_its_own_generation(validating, generation):
    # The emulated stores answer CHECK (numbered as their generation numbers it) and close on anything else.
    listener, stop = old_store(validating)
    try:
        client = StoreClient("127.0.0.1", listener.getsockname()[1], timeout_s=3)
        client.connect()
        assert client.generation == generation
        with pytest.raises(StoreWireError):
            client.add("n", 1)  # not a CHECK: the emulated store closes the connection
        assert client.check(["x"]) is False  # opened again, validated as this generation wants
    finally:
        stop.set()
        listener.close()


def silent_listener() -> tuple[socket.socket, list]:
    """A service that accepts connections and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    held: list = []
    threading.Thread(target=lambda: [held.append(listener.accept()) for _ in range(16)], daemon=True).start()
    return listener, held


def test_a_service_that_never_answers_costs_one_handshake_timeout_not_a_hang():
    listener, _ = silent_listener()
    started = time.monotonic()
    with pytest.raises(StoreWireError) as raised:
        StoreClient("127.0.0.1", listener.getsockname()[1], timeout_s=1.0, connect_timeout_s=1.5).connect()
    assert raised.value.timed_out and "did not answer a store's handshake within 1.5 s" in str(raised.value)
    assert not raised.value.gone  # slow, not gone
    assert time.monotonic() - started < 1.5 + 10  # one handshake's timeout, not one per generation (slack: load)


def test_a_request_that_times_out_closes_the_connection_so_its_late_answer_is_never_read_as_the_next():
    store = real_store(True)
    # A proxy that delays the answers of one request: the client gives up on it, then asks again.
    client = StoreClient("127.0.0.1", store.port, timeout_s=5)
    client.set("k", "first")
    slow = threading.Event()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)

    def pump(src: socket.socket, dst: socket.socket, delay: bool) -> None:
        try:
            while data := src.recv(65536):
                if delay and slow.is_set():
                    time.sleep(1.5)
                dst.sendall(data)
        except OSError:
            pass

    def proxy() -> None:
        while True:
            try:
                near, _ = listener.accept()
            except OSError:
                return
            far = socket.create_connection(("127.0.0.1", store.port))
            threading.Thread(target=pump, args=(near, far, False), daemon=True).start()
            threading.Thread(target=pump, args=(far, near, True), daemon=True).start()

    threading.Thread(target=proxy, daemon=True).start()
    try:
        via = StoreClient("127.0.0.1", listener.getsockname()[1], timeout_s=0.5)
        assert via.get("k") == b"first"
        slow.set()
        with pytest.raises(StoreWireError) as raised:
            via.compare_set("k", "first", "second")
        assert raised.value.timed_out
        slow.clear()
        time.sleep(2.0)  # the late answer reached the old connection, closed by now
        assert via.add("count", 5) == 5  # a new connection: the answer read is this request's own
    finally:
        listener.close()


# A store in a process of its own, so that "the store is gone" is a kill, not a garbage collection: a
# TCPStore dropped in this process still accepted 30 s later in the suite (its server thread outlived
# the last reference), and the client was never tested against a lost store.
_STORE_SCRIPT = """
import sys, time
from datetime import timedelta
import torch.distributed as dist
store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60))
print(store.port, flush=True)
time.sleep(600)
"""


def test_a_refused_connect_is_tried_again_within_its_budget_and_a_lost_store_fails_fast_after():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nothing listens here for now
    started = []
    threading.Timer(0.6, lambda: started.append(dist.TCPStore("127.0.0.1", port, is_master=True,
                                                                wait_for_workers=False,
                                                                timeout=timedelta(seconds=10)))).start()
    client = StoreClient("127.0.0.1", port, timeout_s=2, connect_timeout_s=5)
    assert client.add("n", 1) == 1  # refused at first, then the store listened: connected within 5 s
    client.close()
    store = subprocess.Popen([sys.executable, "-c", _STORE_SCRIPT], stdout=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([store.stdout], [], [], 60 + 4 * measured_startup_s())  # never waits forever
        assert ready, "the store's process printed no port"
        lost = StoreClient("127.0.0.1", int(store.stdout.readline()), timeout_s=2, connect_timeout_s=5)
        assert lost.add("n", 1) == 1
    finally:
        store.kill()
        store.wait(timeout=30)
    lost.close()
    with pytest.raises(StoreWireError) as refused:
        lost.add("n", 1)  # reconnect refused for its whole budget (2 s)
    assert refused.value.gone and not refused.value.timed_out  # the store's process ended
    began = time.monotonic()
    with pytest.raises(StoreWireError) as raised:
        lost.add("n", 1)  # within the pause after a failed reconnect: at once, no budget spent
    assert "the last attempt failed 1 time" in str(raised.value)  # said, not tried: no connect budget spent
    assert raised.value.gone
    assert time.monotonic() - began < lost.timeout_s
