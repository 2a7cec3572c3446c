"""`distdoctor bench` across three lab hosts: a tbf-throttled veth is named as slow_link, a healthy lab as nothing."""

from __future__ import annotations

import subprocess
import sys

import pytest

from host_worlds import RankSpec, start_world

pytestmark = pytest.mark.hosts

HOSTS = ("hosta", "hostb", "hostc")
TIMEOUT_S = 60.0
# A short sweep: the test is about the link matrix; the sweep only has to run and be correct.
ARGS = ["--sizes", "8,4K", "--ops", "all_reduce,broadcast", "--iters", "5", "--warmup", "1"]
# netem is not in this kernel; a token bucket at 20 Mbit/s is a NIC negotiated far down.
THROTTLE = ["root", "tbf", "rate", "20mbit", "burst", "32kbit", "latency", "400ms"]


def throttle(lab, host: str) -> str:
    h = lab.hosts[host]
    subprocess.run(["tc", "-n", h.ns, "qdisc", "add", "dev", h.ifname, *THROTTLE], check=True,
                   capture_output=True, text=True, timeout=10)
    return subprocess.run(["tc", "-n", h.ns, "qdisc", "show", "dev", h.ifname], capture_output=True, text=True,
                          timeout=10).stdout


def bench_world(lab):
    specs = [RankSpec(host, rank) for rank, host in enumerate(HOSTS)]
    argv = [sys.executable, "-m", "distdoctor", "bench", "--format", "json", "--timeout", f"{TIMEOUT_S:g}", *ARGS]
    run = start_world(lab, specs, argv, bound=TIMEOUT_S + 20, label="bench").wait()
    report = run.report(0)
    assert run.code(0) in (0, 1), run.describe()
    assert all(run.code(r) == run.code(0) for r in run.ranks), run.describe()
    return run, report


def slow_findings(report):
    return [f for f in report["findings"] if f["cause"] == "slow_link"]


def test_throttled_host_is_named_as_slow_link_and_no_other(make_lab):
    lab = make_lab(HOSTS)
    assert "tbf" in throttle(lab, "hostc")
    run, report = bench_world(lab)
    bench = report["data"]["bench"]
    pairs = {(p["a"], p["b"]): p for p in bench["links"]["host_pairs"]}
    print("host pairs:", {k: (v["bw_gbs"], v["lat_us"]) for k, v in pairs.items()})
    slow = slow_findings(report)
    assert [f["id"] for f in slow] == ["bench.W001"], run.describe()
    assert slow[0]["hosts"] == ["hostc"] and slow[0]["ranks"] == [2]
    named = {(link["a"], link["b"]) for link in slow[0]["data"]["links"]}
    assert named == {("hosta", "hostc"), ("hostb", "hostc")}
    # The figure against the median: the throttled links are far below it, the healthy one is not.
    assert all(link["value"] < 0.2 * link["median"] for link in slow[0]["data"]["links"])
    assert pairs[("hosta", "hostb")]["bw_gbs"] > 5 * max(pairs[("hosta", "hostc")]["bw_gbs"], pairs[("hostb", "hostc")]["bw_gbs"])
    assert all(row["correct"] for row in bench["sweep"]) and bench["sweep"]


def test_healthy_lab_names_no_slow_link(make_lab):
    lab = make_lab(HOSTS)
    run, report = bench_world(lab)
    bench = report["data"]["bench"]
    print("host pairs:", {(p["a"], p["b"]): (p["bw_gbs"], p["lat_us"]) for p in bench["links"]["host_pairs"]})
    assert slow_findings(report) == [], run.describe()
    assert len(bench["links"]["host_pairs"]) == 3
    assert bench["interfaces"]["0"]["routes"]["hostb"]["interface"] == "eth0"
    assert all(row["correct"] for row in bench["sweep"])


def test_traffic_over_a_docker_bridge_is_named(make_lab):
    # hostb's only interface is called docker0: its traffic to hosta leaves through a "bridge".
    lab = make_lab(("hosta", "hostb"), ifnames={"hostb": "docker0"})
    specs = [RankSpec("hosta", 0), RankSpec("hostb", 1)]
    argv = [sys.executable, "-m", "distdoctor", "bench", "--format", "json", "--timeout", f"{TIMEOUT_S:g}", *ARGS]
    run = start_world(lab, specs, argv, bound=TIMEOUT_S + 20, label="bench").wait()
    report = run.report(0)
    wrong = [f for f in report["findings"] if f["cause"] == "wrong_interface"]
    assert [(f["id"], f["hosts"], f["ranks"]) for f in wrong] == [("bench.W003", ["hostb"], [1])], run.describe()
    assert "docker0" in wrong[0]["detail"] and wrong[0]["data"]["peers"] == ["hosta"]
    routes = report["data"]["bench"]["interfaces"]
    assert routes["0"]["routes"]["hostb"]["interface"] == "eth0"
    assert routes["1"]["routes"]["hosta"]["interface"] == "docker0"
    # One link between two hosts: nothing to compare it with, and the report says so.
    assert not [f for f in report["findings"] if f["cause"] == "slow_link"]
    assert any("no peers" in n for n in report["data"]["bench"]["links"]["notes"])
