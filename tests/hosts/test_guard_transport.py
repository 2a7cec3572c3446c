"""The guard's proof that a collective is stuck, across lab hosts: with gloo's traffic dropped (a firewall
that lets only the store's port through) every rank waits and no connection receives data: job.E009,
watched until the connections have been silent for 30 s (longer than TCP's retransmission backoff), then
proven and the job ended; so in a second gloo group while the default one is idle (the proof is read
from the stalled group's backend). Its twins: the same all_reduce over a throttled link (tc tbf) is slow
but moving, job.W011, watched, and the job finishes; a link that drops every packet for 5 s and then
passes them is never proven stuck, and the job finishes."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from host_worlds import MASTER_PORT, RankSpec, start_world

pytestmark = pytest.mark.hosts
SCRIPT = Path(__file__).resolve().parents[1] / "guard" / "scripts" / "policy_job.py"
THROTTLE = ["tbf", "rate", "4mbit", "burst", "32kbit", "latency", "400ms"]


def tc(ns: str, *args: str) -> None:
    subprocess.run(["tc", "-n", ns, *args], check=True, capture_output=True, text=True, timeout=10)


def both_ends(lab, host: str):
    h = lab.hosts[host]
    return ((h.ns, h.ifname), (lab.bridge_ns, h.port))


def network_ports(lab) -> list[tuple[str, str]]:
    """The bridge's port to every host: a drop there is the network's, which neither host's TCP sees.
    (A drop in a host's own qdisc is seen: Linux then retries without backing off, and gloo's read
    failed with "Connection timed out" about 10 s in, in this lab.)"""
    return [(lab.bridge_ns, h.port) for h in lab.hosts.values()]


def only_the_store_passes(lab, host: str) -> None:
    """Drop every packet between the hosts but the c10d store's (a firewall on the backend's ports), in
    the bridge: an htb root whose default class drops (pfifo limit 0) and a class for the store's port
    (this kernel has no sch_prio; the lab's neighbours are permanent, so no ARP is needed)."""
    for ns, dev in network_ports(lab):
        tc(ns, "qdisc", "replace", "dev", dev, "root", "handle", "1:", "htb", "default", "30")
        for classid in ("1:1", "1:30"):
            tc(ns, "class", "add", "dev", dev, "parent", "1:", "classid", classid, "htb", "rate", "10gbit")
        tc(ns, "qdisc", "add", "dev", dev, "parent", "1:30", "handle", "30:", "pfifo", "limit", "0")
        for direction in ("dport", "sport"):
            tc(ns, "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", "1", "u32", "match", "ip",
               direction, str(MASTER_PORT), "0xffff", "flowid", "1:1")


def heal(lab) -> None:
    for ns, dev in network_ports(lab):
        tc(ns, "qdisc", "del", "dev", dev, "root")


def drop_for_5_s(lab, host: str) -> threading.Thread:
    """The firewall of only_the_store_passes for 5 s, then every packet passes again."""
    only_the_store_passes(lab, host)
    healer = threading.Timer(5.0, heal, (lab,))
    healer.start()
    return healer


def throttle(lab, host: str) -> None:
    for ns, dev in both_ends(lab, host):
        tc(ns, "qdisc", "replace", "dev", dev, "root", *THROTTLE)


def transfer(lab, tmp_path: Path, floats: int, fault, *extra: str) -> tuple:
    """Two ranks (hosta, hostb) under `distdoctor guard --hang-timeout 3`; ``fault`` is applied once both
    are ready, before the all_reduce of ``floats`` starts (``extra``: "group", in a second gloo group)."""
    flags = tmp_path / "flags"
    flags.mkdir()
    argv = [sys.executable, "-m", "distdoctor", "guard", "--hang-timeout", "3", "--report-dir", str(tmp_path / "reports"),
            "--", sys.executable, str(SCRIPT), "transfer", str(floats), str(flags), *extra]
    run = start_world(lab, [RankSpec("hosta", 0), RankSpec("hostb", 1)], argv, bound=150, label="transfer")
    deadline = time.monotonic() + 120
    while len(list(flags.glob("ready*"))) < 2 and time.monotonic() < deadline:
        assert all(s.popen.poll() is None for s in run.ranks.values()), run.describe()
        time.sleep(0.2)
    pending = fault(lab, "hostb")
    (flags / "go").write_text("")
    run.wait()
    if isinstance(pending, threading.Thread):
        pending.join()  # the lab's teardown removes what it left
    return run, run.output(0) + run.output(1)


# extended: [group] proves the same stall from the stalled group's own sockets, the more demanding case
# (the default group idle beside it); the default group's proof is the same code on its own group.
@pytest.mark.parametrize("where", [pytest.param("default", marks=pytest.mark.extended), "group"])
def test_a_collective_whose_traffic_is_dropped_is_proven_stuck_after_30_s_and_the_job_ended(make_lab, tmp_path, where):
    lab = make_lab(("hosta", "hostb"))
    run, out = transfer(lab, tmp_path, 1 << 20, only_the_store_passes, *(["group"] if where == "group" else []))
    assert run.code(0) == 1 and run.code(1) == 1, run.describe()
    group = "the default group" if where == "default" else "group 1"
    assert "job.E009 [collective_timeout_hang] Every rank waits in all_reduce #" in out, out[-4000:]
    assert f"of {group}" in out
    # First watched: a few seconds without data is no proof (TCP's backoff after an outage is that long).
    assert "not yet proof that it is stuck (30 s without data is" in out, out[-6000:]
    assert "Warnings (1)" in out
    silent = re.search(r"nothing moves: no rank's connections received data for ([\d.]+) s", out)
    assert silent and float(silent.group(1)) >= 30, out[-4000:]
    assert "the guard ends the job: no rank can advance (job.E009 [collective_timeout_hang])" in out
    assert "Errors (1)" in out and "job.W011" not in out


def test_a_link_that_drops_packets_for_5_s_and_then_passes_them_is_never_proven_stuck_and_finishes(make_lab, tmp_path):
    lab = make_lab(("hosta", "hostb"))
    run, out = transfer(lab, tmp_path, 1 << 20, drop_for_5_s)
    assert run.code(0) == 0 and run.code(1) == 0, run.describe()
    assert "the guard ends the job" not in out and "nothing moves" not in out, out[-4000:]
    assert "rank 0: the all_reduce took" in out and "rank 1: the all_reduce took" in out


def test_the_same_collective_over_a_throttled_link_is_slow_not_stuck_watched_and_finishes(make_lab, tmp_path):
    lab = make_lab(("hosta", "hostb"))
    run, out = transfer(lab, tmp_path, 2 << 20, throttle)  # 8 MB each way at 4 Mbit/s: about 16 s
    assert run.code(0) == 0 and run.code(1) == 0, run.describe()
    assert "the guard ends the job" not in out and "job.E009" not in out, out[-4000:]
    assert "job.W011 [slow_link] Every rank is in all_reduce #" in out and "but it still moves data" in out
    assert "the guard watches: every rank is in the collective and it still moves data: slow, not stuck" in out
    assert "Warnings (1)" in out and "Errors (" not in out
    assert "stall 1 cleared after" in out
