"""Slow links and hosts judged against the median of their class, and --compare's regressions."""

from __future__ import annotations

import json

import pytest

from distdoctor.bench.assemble import assemble, sweep_rows
from distdoctor.bench.compare import BaselineError, compare, load_baseline
from distdoctor.bench.interfaces import suspicious
from distdoctor.bench.outliers import judge


def link(a, b, ha, hb, bw, lat=50.0):
    return {"a": a, "b": b, "host_a": ha, "host_b": hb, "bw_gbs": bw, "lat_us": lat}


def three_hosts(bw_ac, bw_bc, bw_ab=1.5):
    return [link(0, 1, "a", "b", bw_ab), link(0, 2, "a", "c", bw_ac), link(1, 2, "b", "c", bw_bc)]


def test_one_slow_host_of_three_is_named_although_two_of_three_links_touch_it():
    verdict = judge(three_hosts(0.005, 0.005))
    assert set(verdict.slow_nodes) == {"c"}
    assert {(s.edge.a, s.edge.b) for s in verdict.slow} == {("a", "c"), ("b", "c")}
    assert verdict.references["inter_host"]["bw_gbs"] == pytest.approx((1.5 + 0.005) / 2)


def test_healthy_hosts_within_noise_name_nothing():
    verdict = judge(three_hosts(0.6, 1.2, 1.5))
    assert not verdict.slow and not verdict.slow_nodes


def test_one_slow_link_between_healthy_hosts_is_a_link_not_a_host():
    links = [link(a, b, f"h{a}", f"h{b}", 0.01 if (a, b) == (0, 1) else 1.0) for a in range(4) for b in range(a + 1, 4)]
    verdict = judge(links)
    assert [(s.edge.a, s.edge.b) for s in verdict.slow] == [("h0", "h1")]
    assert not verdict.slow_nodes


def test_latency_outlier_needs_both_ratio_and_absolute_floor():
    fast = [link(a, b, "x", "x", 1.0, 40.0) for a in range(4) for b in range(a + 1, 4) if (a, b) != (2, 3)]
    jitter = judge(fast + [link(2, 3, "x", "x", 1.0, 400.0)])  # 10x but only 360 us more
    assert not jitter.slow
    slow = judge(fast + [link(2, 3, "x", "x", 1.0, 5000.0)])
    assert [(s.edge.a, s.edge.b, s.metric) for s in slow.slow] == [("2", "3", "latency")]


def test_single_link_says_it_cannot_tell():
    verdict = judge([link(0, 1, "a", "b", 0.001)])
    assert not verdict.slow and "no peers" in verdict.notes[0]


def test_intra_and_inter_host_links_are_judged_apart():
    links = [link(0, 1, "a", "a", 20.0), link(2, 3, "b", "b", 20.0), link(0, 2, "a", "b", 1.0),
             link(1, 3, "a", "b", 1.0), link(0, 3, "a", "b", 1.0), link(1, 2, "a", "b", 1.0)]
    assert not judge(links).slow  # the NIC is 20x slower than shared memory, and that is normal


def test_sweep_rows_average_time_over_ranks_and_apply_the_factor():
    per_rank = {0: [{"op": "all_reduce", "bytes": 1000, "count": 250, "iters": 5, "time_s": 1e-6, "correct": True}],
                1: [{"op": "all_reduce", "bytes": 1000, "count": 250, "iters": 5, "time_s": 3e-6, "correct": False}]}
    (row,) = sweep_rows(per_rank, 2)
    assert row["time_us"] == pytest.approx(2.0)
    assert row["algbw_gbs"] == pytest.approx(0.5)
    assert row["busbw_gbs"] == pytest.approx(0.5)  # 2(n-1)/n = 1 for n = 2
    assert row["correct"] is False and row["wrong_ranks"] == [1]


def test_assemble_names_the_slow_host_with_its_figures():
    bench, findings = assemble(size=3, hosts={0: "a", 1: "b", 2: "c"}, sweeps={}, links=[
        {"a": 0, "b": 1, "bw_gbs": 1.5, "lat_us": 50}, {"a": 0, "b": 2, "bw_gbs": 0.005, "lat_us": 60},
        {"a": 1, "b": 2, "bw_gbs": 0.004, "lat_us": 70}], routes={}, stopped={}, backend="gloo")
    assert [(f.id, f.cause, f.hosts, f.ranks) for f in findings] == [("bench.W001", "slow_link", ("c",), (2,))]
    assert "against a median of" in findings[0].detail
    assert len(bench["links"]["host_pairs"]) == 3


def test_suspicious_routes():
    assert "virtual" in suspicious({"interface": "docker0", "virtual": True}, [])
    assert "loopback" in suspicious({"interface": "lo", "loopback": True}, [])
    slow = {"interface": "eno1", "speed_mbps": 1000}
    assert suspicious(slow, []) is None
    assert "100000 Mb/s" in suspicious(slow, [{"interface": "ib0", "speed_mbps": 100000}])
    assert suspicious({"interface": "ens5", "speed_mbps": 25000}, [{"interface": "ib0", "speed_mbps": 100000}]) is None


def bench_data(busbw=10.0, bw=1.0, lat=50.0):
    return {"sweep": [{"op": "all_reduce", "size": "1M", "bytes": 2**20, "busbw_gbs": busbw, "correct": True}],
            "links": {"host_pairs": [{"a": "a", "b": "b", "bw_gbs": bw, "lat_us": lat}]}}


def test_compare_flags_only_losses_beyond_the_tolerance():
    assert compare(bench_data(8.5), bench_data(10.0), 0.2) == ([], 3)
    regressions, common = compare(bench_data(7.0, lat=80.0), bench_data(10.0), 0.2)
    assert common == 3
    assert sorted(r.metric for r in regressions) == ["busbw_gbs", "lat_us"]
    assert compare(bench_data(20.0, 2.0, 10.0), bench_data(), 0.0) == ([], 3)  # gains are not losses
    with pytest.raises(BaselineError):
        compare(bench_data(), bench_data(), 1.5)


def test_baseline_must_be_a_bench_report(tmp_path):
    good = tmp_path / "base.json"
    good.write_text(json.dumps({"schema": "distdoctor.report/1", "data": {"bench": bench_data()}}))
    assert load_baseline(good)["sweep"][0]["op"] == "all_reduce"
    for text, why in (("{", "not JSON"), (json.dumps({"findings": []}), "not a `distdoctor bench")):
        bad = tmp_path / "bad.json"
        bad.write_text(text)
        with pytest.raises(BaselineError, match=why):
            load_baseline(bad)
    with pytest.raises(BaselineError, match="cannot read"):
        load_baseline(tmp_path / "missing.json")


def test_endpoint_and_route_from_gloo_socket_ifname_and_the_routing_table():
    from distdoctor.bench.interfaces import endpoint, routes_to
    from distdoctor.machine.probes import Probes

    probes = Probes()
    chosen = endpoint("gloo", {"GLOO_SOCKET_IFNAME": "lo"}, probes)
    assert chosen == {"address": "127.0.0.1", "interface": "lo", "how": "GLOO_SOCKET_IFNAME=lo"}
    missing = endpoint("gloo", {"GLOO_SOCKET_IFNAME": "nosuchif0"}, probes)
    assert missing["address"] is None and "selects no interface" in missing["how"]
    route = routes_to({"peer": "127.0.0.1"}, probes)["peer"]
    assert route["interface"] == "lo" and route["loopback"] is True
    assert "loopback" in suspicious(route, [])
