"""Table tests for the *_SOCKET_IFNAME, CUDA_VISIBLE_DEVICES and init_method parsers."""

from __future__ import annotations

import pytest

from distdoctor.checks._support import cuda_visible_devices as cuda_visible

from distdoctor.checks._support import socket_ifname as ifname

from distdoctor.checks._support import init_method

NICS = ["lo", "eth0", "eth01", "eth1", "docker0", "ib0", "ib1", "veth3a"]


@pytest.mark.parametrize(
    "raw, selected, exclude, exact",
    [
        ("eth", ["eth0", "eth01", "eth1"], False, False),  # prefix match
        ("eth0", ["eth0", "eth01"], False, False),  # prefix: eth0 also matches eth01
        ("=eth0", ["eth0"], False, True),  # exact
        ("eth0,ib", ["eth0", "eth01", "ib0", "ib1"], False, False),  # comma list
        ("^docker,lo", ["eth0", "eth01", "eth1", "ib0", "ib1", "veth3a"], True, False),  # exclusion
        ("^=eth0,eth1", ["lo", "eth01", "docker0", "ib0", "ib1", "veth3a"], True, True),  # exact exclusion
        ("eth0:1234", ["eth0", "eth01"], False, False),  # port suffix ignored
        ("nosuch", [], False, False),
        ("=eth", [], False, True),
    ],
)
def test_nccl_socket_ifname(raw, selected, exclude, exact):
    spec = ifname.parse_nccl(raw)
    assert spec.select(NICS) == selected
    assert (spec.exclude, spec.exact) == (exclude, exact)


@pytest.mark.parametrize(
    "raw, names, problem",
    [
        (",,x", ("x",), "empty entry"),
        ("eth0,eth0", ("eth0",), "listed twice"),
        ("eth0, eth1", ("eth0", " eth1"), "blanks"),
        ("^", (), "ignored"),
        ("", (), "ignored"),
    ],
)
def test_nccl_socket_ifname_problems(raw, names, problem):
    spec = ifname.parse_nccl(raw)
    assert spec.names == names
    assert any(problem in p for p in spec.problems)


@pytest.mark.parametrize(
    "raw, names, usable, problem",
    [
        ("eth0", ("eth0",), ["eth0"], None),
        ("eth0,eth1", ("eth0", "eth1"), ["eth0", "eth1"], None),
        ("eth", ("eth",), [], None),  # Gloo does not prefix-match
        ("^lo", ("^lo",), [], "NCCL syntax"),
        ("e", (), NICS, "ignored"),
    ],
)
def test_gloo_socket_ifname(raw, names, usable, problem):
    spec = ifname.parse_gloo(raw)
    assert spec.names == names
    assert spec.select(NICS) == usable
    assert (problem is None) == (not spec.problems) or any(problem in p for p in spec.problems)


def test_nccl_default_candidates_prefer_ib_and_skip_docker_and_lo():
    assert ifname.nccl_default_candidates(NICS) == ["ib0", "ib1"]
    assert ifname.nccl_default_candidates(["lo", "docker0", "veth1", "eth0"]) == ["veth1", "eth0"]
    assert ifname.is_virtual("veth1") and ifname.is_virtual("docker0") and not ifname.is_virtual("eth0")


@pytest.mark.parametrize(
    "raw, form, devices, problem, hides_all",
    [
        (None, cuda_visible.ALL, (), None, False),
        ("0,1", cuda_visible.INDICES, (0, 1), None, False),
        ("3", cuda_visible.INDICES, (3,), None, False),
        ("", cuda_visible.INDICES, (), None, True),  # documented way to hide every GPU
        ("-1", cuda_visible.INDICES, (), None, True),
        ("0,0", cuda_visible.INDICES, (), "twice", True),  # duplicate empties the list
        ("0,1,0", cuda_visible.INDICES, (), "twice", True),
        (",,x", cuda_visible.INDICES, (), "empty entry", True),
        ("0,1,,2", cuda_visible.INDICES, (0, 1), "ignores", False),
        ("0,x,1", cuda_visible.INDICES, (0,), "not a GPU index", False),
        ("1gpu2,2ampere", cuda_visible.INDICES, (1, 2), "leading digits", False),
        (" 1, 2", cuda_visible.INDICES, (1, 2), None, False),  # blanks are stripped
        ("GPU-aaaa,GPU-bbbb", cuda_visible.UUIDS, ("GPU-aaaa", "GPU-bbbb"), None, False),
        ("GPU-aaaa,0", cuda_visible.UUIDS, ("GPU-aaaa",), "does not start with", False),
        ("GPU-aaaa,GPU-aaaa", cuda_visible.UUIDS, (), "twice", True),
        ("MIG-1111/1/0,MIG-2222", cuda_visible.MIG, ("MIG-1111/1/0", "MIG-2222"), None, False),
        ("MIG-1,GPU-2", cuda_visible.MIG, ("MIG-1",), "does not start with", False),
    ],
)
def test_cuda_visible_devices(raw, form, devices, problem, hides_all):
    parsed = cuda_visible.parse(raw)
    assert parsed.form == form
    assert parsed.devices == devices
    assert parsed.hides_all == hides_all
    if problem is None:
        assert not parsed.problems
    else:
        assert any(problem in p for p in parsed.problems), parsed.problems


@pytest.mark.parametrize(
    "raw, scheme, host, port, path, problem",
    [
        ("env://", "env", None, None, None, None),
        ("tcp://10.0.0.1:29500", "tcp", "10.0.0.1", 29500, None, None),
        ("tcp://[::1]:23", "tcp", "::1", 23, None, None),
        ("tcp://host", "tcp", "host", None, None, "no usable port"),
        ("tcp://host:99999", "tcp", "host", None, None, "not a number"),
        ("tcp://:1", "tcp", None, None, None, "no host"),
        ("file:///shared/rdzv", "file", None, None, "/shared/rdzv", None),
        ("file://shared/rdzv", "file", None, None, "/rdzv", "three slashes"),
        ("mpi://", "mpi", None, None, None, None),
        ("foo://x", "foo", None, None, None, "no rendezvous handler"),
        ("localhost:29500", "", None, None, None, "no scheme"),
    ],
)
def test_init_method(raw, scheme, host, port, path, problem):
    parsed = init_method.parse(raw)
    assert (parsed.scheme, parsed.host, parsed.port, parsed.path) == (scheme, host, port, path)
    assert (parsed.problem is None) if problem is None else (problem in parsed.problem)


def test_rendezvous_endpoint_prefers_tcp_init_method():
    from distdoctor.core.config import load_config

    given = load_config({"init_method": "tcp://10.1.1.1:1234"}, env={}, use_pyproject=False)
    host, port, source = init_method.rendezvous_endpoint(given, "m", 5)
    assert (host, port) == ("10.1.1.1", 1234) and "--init-method" in source
    from_env = load_config({}, env={"DISTDOCTOR_INIT_METHOD": "tcp://10.1.1.2:99"}, use_pyproject=False)
    assert init_method.rendezvous_endpoint(from_env, "m", 5)[:2] == ("10.1.1.2", 99)
    assert init_method.rendezvous_endpoint(load_config({}, env={}, use_pyproject=False), "m", 5)[:2] == ("m", 5)
