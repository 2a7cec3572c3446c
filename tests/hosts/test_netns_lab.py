"""The namespace lab itself: hosts reach each other, faults are real, and nothing is left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import netns

pytestmark = pytest.mark.hosts

CONNECT = textwrap.dedent("""
    import socket, sys, time
    t = time.monotonic()
    try:
        socket.create_connection((sys.argv[1], int(sys.argv[2])), float(sys.argv[3])).close()
        print("open")
    except TimeoutError:
        print("timeout")
    except ConnectionRefusedError:
        print("refused")
    except OSError as exc:
        print(f"errno{exc.errno}")
    print(round(time.monotonic() - t, 2))
""")

LISTEN = textwrap.dedent("""
    import socket, time
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", 29500)); s.listen()
    print("listening", flush=True)
    time.sleep(60)
""")


def connect(lab, host, target, port=29500, timeout=3.0):
    out = lab.run(host, [sys.executable, "-c", CONNECT, target, str(port), str(timeout)], timeout=timeout + 15)
    assert out.returncode == 0, out.stderr
    status, elapsed = out.stdout.split()
    return status, float(elapsed)


def wait_for_output(started, text, timeout=15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in started.stdout:
            return
        time.sleep(0.05)
    raise AssertionError(f"{started.label} never printed {text!r}: {started.stderr[-1000:]}")


def test_each_host_has_its_own_name_address_and_hosts_view(lab):
    out = lab.run("hostb", ["sh", "-c", "hostname; getent hosts hosta hostb; ip -o -4 addr show dev eth0"])
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "hostb"
    assert "10.231.0.1" in lines[1] and "hosta" in lines[1]
    assert "10.231.0.2" in lines[2] and "hostb" in lines[2]
    assert "10.231.0.2/24" in out.stdout
    # The root namespace's view is untouched.
    assert "hostb" not in subprocess.run(["hostname"], capture_output=True, text=True).stdout
    assert "10.231.0." not in Path("/etc/hosts").read_text()


def test_hosts_view_can_map_the_host_name_to_loopback(lab):
    lab.set_hosts_view("hostb", {"hostb": "127.0.1.1"})
    out = lab.run("hostb", ["getent", "hosts", "hostb"])
    assert out.stdout.split()[0] == "127.0.1.1"
    assert lab.run("hosta", ["getent", "hosts", "hostb"]).stdout.split()[0] == "10.231.0.2"


def test_hosts_reach_each_other_refused_and_unreachable_are_real(lab):
    listener = lab.spawn("hosta", [sys.executable, "-c", LISTEN], label="listener")
    wait_for_output(listener, "listening")
    assert connect(lab, "hostb", "hosta")[0] == "open"
    assert connect(lab, "hostb", "hosta", port=29501)[0] == "refused"
    # An address in the subnet where no host answers: ARP fails, the kernel says no route.
    assert connect(lab, "hostb", "10.231.0.99", timeout=8)[0] == "errno113"


def test_partition_drops_packets_so_connect_times_out(lab):
    listener = lab.spawn("hosta", [sys.executable, "-c", LISTEN], label="listener")
    wait_for_output(listener, "listening")
    qdisc = lab.partition("hostb")
    assert qdisc
    status, elapsed = connect(lab, "hostb", "hosta", timeout=2)
    assert status == "timeout" and elapsed >= 1.9
    assert lab.dropped_packets("hostb") > 0
    lab.heal("hostb")
    assert connect(lab, "hostb", "hosta")[0] == "open"


def test_close_kills_processes_and_removes_namespaces(make_lab):
    lab = make_lab(("hosta", "hostb", "hostc"))
    sleepers = [lab.spawn(h, ["sleep", "300"]) for h in lab.hosts]
    names = list(lab.namespaces)
    assert set(names) <= set(netns.list_namespaces())
    lab.close()
    assert not set(names) & set(netns.list_namespaces())
    for started in sleepers:
        assert started.popen.poll() is not None
    assert not lab.workdir.exists()


def test_refuses_to_touch_what_it_did_not_create(netns_ready):
    with pytest.raises(ValueError):
        netns.delete_namespace("some-other-namespace")


SCRIPT = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {here!r})
    import netns
    netns.install_exit_handlers()
    lab = netns.Lab(("hosta", "hostb"))
    lab.spawn("hostb", ["sleep", "300"])
    print(" ".join(lab.namespaces), flush=True)
    time.sleep(300)
""")


def _start_lab_process():
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT.format(here=str(Path(__file__).parent))],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    names = proc.stdout.readline().split()
    assert names, "the lab process did not start its lab"
    return proc, names


def _gone(names, timeout=15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not set(names) & set(netns.list_namespaces()):
            return True
        time.sleep(0.1)
    return False


def test_a_terminated_run_removes_its_lab(netns_ready):
    proc, names = _start_lab_process()
    try:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
        assert _gone(names)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_killed_run_is_cleaned_by_the_next(netns_ready):
    proc, names = _start_lab_process()
    try:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=20)
        assert set(names) <= set(netns.list_namespaces())  # SIGKILL: nothing could clean up
        removed = netns.cleanup_stale()
        assert set(names) <= set(removed)
        assert _gone(names, timeout=1)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_without_root_the_reason_to_skip_is_given(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert "root" in netns.why_unavailable()


def test_without_iproute2_the_reason_to_skip_is_given(monkeypatch):
    real_which = netns.shutil.which
    monkeypatch.setattr(netns.shutil, "which", lambda tool: None if tool == "ip" else real_which(tool))
    assert "`ip` is not installed" in netns.why_unavailable()
