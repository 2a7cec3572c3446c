"""The sweep's sizes and nccl-tests' bus-bandwidth factors, and the link matrix's schedule."""

from __future__ import annotations

import itertools

import pytest

from distdoctor.bench.pairing import partner_in, round_robin
from distdoctor.bench.sizes import (OPS, SizeError, bus_factor, default_sizes, element_count, human_bytes,
                                    parse_ops, parse_sizes)


@pytest.mark.parametrize("n, expected", [(2, 1.0), (4, 1.5), (8, 1.75), (1, 0.0)])
def test_all_reduce_factor_is_2_n_minus_1_over_n(n, expected):
    assert bus_factor("all_reduce", n) == pytest.approx(expected)


@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter", "all_to_all"])
def test_gather_scatter_and_all_to_all_factor_is_n_minus_1_over_n(op):
    assert bus_factor(op, 2) == pytest.approx(0.5)
    assert bus_factor(op, 8) == pytest.approx(7 / 8)


def test_broadcast_factor_is_one_and_unknown_ops_are_refused():
    assert bus_factor("broadcast", 16) == 1.0
    with pytest.raises(ValueError):
        bus_factor("reduce", 4)
    with pytest.raises(ValueError):
        bus_factor("all_reduce", 0)


def test_element_count_is_a_whole_chunk_per_rank():
    assert element_count("all_reduce", 8, 2) == 2
    assert element_count("all_gather", 8, 4) == 4  # 2 elements round up to one per rank
    assert element_count("all_to_all", 1000, 3) == 249  # 250 -> a multiple of 3
    assert element_count("broadcast", 2**20, 8) == 2**18


def test_sizes_parse_as_lists_and_nccl_tests_style_ranges():
    assert parse_sizes("8,1K,4M") == (8, 1024, 4 * 2**20)
    assert parse_sizes("8:64:2") == (8, 16, 32, 64)
    assert parse_sizes("1K:16K") == (1024, 2048, 4096, 8192, 16384)
    assert default_sizes(on_gpu=True)[0] == 8 and default_sizes(on_gpu=True)[-1] == 256 * 2**20
    assert default_sizes(on_gpu=False)[-1] == 32 * 2**20
    for bad in ("", "8:4", "x", "8:16:1", "9G", "8:16:z", "1:2:3:4"):
        with pytest.raises(SizeError):
            parse_sizes(bad)


def test_ops_parse_and_sizes_print():
    assert parse_ops("all-reduce,broadcast,all_reduce") == ("all_reduce", "broadcast")
    with pytest.raises(SizeError):
        parse_ops("allreduce")
    assert set(OPS) == {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"}
    assert [human_bytes(s) for s in (8, 1024, 3 * 2**20, 2**30)] == ["8B", "1K", "3M", "1G"]


@pytest.mark.parametrize("n", range(2, 18))
def test_round_robin_meets_every_pair_once_in_disjoint_rounds(n):
    rounds = round_robin(n)
    assert len(rounds) == (n - 1 if n % 2 == 0 else n)
    seen = [pair for pairs in rounds for pair in pairs]
    assert sorted(seen) == list(itertools.combinations(range(n), 2))
    for pairs in rounds:
        ranks = [r for pair in pairs for r in pair]
        assert len(ranks) == len(set(ranks)), pairs  # disjoint: no rank twice in a round
        assert len(pairs) == n // 2


def test_partner_and_leader():
    pairs = [(0, 3), (1, 2)]
    assert partner_in(pairs, 0) == (3, True)
    assert partner_in(pairs, 3) == (0, False)
    assert partner_in(pairs, 4) == (None, False)
    assert round_robin(1) == []
