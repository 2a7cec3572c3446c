"""Functions that run inside each rank of a real 2-rank gloo world (via distdoctor.testing).

Each asserts what preflight did *on this rank*; the world passes only if every rank passes,
so "raises on both ranks" is checked by both ranks asserting that they raised.
"""

from __future__ import annotations

import logging
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import distdoctor
from distdoctor import PreflightError
import os


def build(width: int = 32, seed: int = 0, dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, width), nn.ReLU(), nn.Linear(width, 4))
    model[2].to(dtype)
    return model


def expect_raise(timeout: float = 20, **kwargs) -> PreflightError:
    # These scenarios wrap their plain models after preflight (pre.W011 is tested on its own).
    kwargs.setdefault("wrap", "later")
    try:
        distdoctor.preflight(timeout=timeout, local_checks=False, **kwargs)
    except PreflightError as exc:
        return exc
    raise AssertionError(f"preflight did not raise on rank {dist.get_rank()}")


def only(error: PreflightError, finding_id: str):
    found = [f for f in error.report.findings if f.id == finding_id]
    assert len(found) == 1, [f.id for f in error.report.findings]
    return found[0]


def model_mismatches() -> None:
    rank = dist.get_rank()

    # rank 1 builds one layer wider: the parameter is named, shape_mismatch, rank 1
    err = expect_raise(model=build(width=64 if rank == 1 else 32))
    shape = only(err, "spec.E001")
    assert shape.cause == "shape_mismatch" and shape.ranks == (1,), shape
    assert "'2.weight'" in shape.title and "rank 1" in shape.title, shape.title
    assert "2.weight: rank 0: [32, 32]; rank 1: [64, 32]" in str(err)

    # rank 1 has a float64 layer: dtype_mismatch naming it
    err = expect_raise(model=build(dtype=torch.float64 if rank == 1 else torch.float32))
    dtype = only(err, "spec.E002")
    assert dtype.cause == "dtype_mismatch" and dtype.ranks == (1,) and "'2.weight'" in dtype.title
    assert [f.id for f in err.report.findings] == ["spec.E002"]

    # different seeds on a model that is never wrapped: param_divergence, every parameter, rank 1
    err = expect_raise(model=build(seed=rank), wrap="never")
    values = only(err, "spec.E004")
    assert values.cause == "param_divergence" and values.ranks == (1,) and values.data["count"] == 6
    assert "'0.weight'" in values.title
    assert "wrap the model" not in values.remediation and "or wrap" not in values.remediation, values.remediation

    # before the DDP wrap (the tutorial's order, unseeded): expected, DDP broadcasts rank 0's
    # weights -> info spec.I007, no raise
    report = distdoctor.preflight(model=build(seed=rank), wrap="later", timeout=20, local_checks=False)
    assert [f.id for f in report.findings] == ["spec.I007"], report.findings
    assert report.findings[0].severity.label == "info" and report.exit_code() == 0
    # not said: the same, plus the warning that a plain module never synchronises gradients
    report = distdoctor.preflight(model=build(seed=rank), timeout=20, local_checks=False)
    assert sorted(f.id for f in report.findings) == ["pre.W011", "spec.I007"], report.findings

    # after the wrap the values can only diverge through code that changes them: the fix must
    # not say "wrap it in DDP"
    ddp = nn.parallel.DistributedDataParallel(build(seed=rank))
    if rank == 1:
        with torch.no_grad():
            ddp.module[0].weight.add_(1.0)
    err = expect_raise(model=ddp)
    values = only(err, "spec.E004")
    assert "already wrapped" in values.remediation and "or wrap" not in values.remediation, values.remediation

    # user tensors are compared the same way
    err = expect_raise(tensors={"buffer": torch.zeros(3 if rank == 0 else 4)})
    assert "tensors['buffer']" in only(err, "spec.E001").title

    # the same model everywhere, also wrapped: clean, returns the report
    report = distdoctor.preflight(model=build(), wrap="later", timeout=20, local_checks=False)
    assert report.status == "ok" and report.findings == []
    # ... but a plain module that is never wrapped is said to be one, even with a shared seed
    report = distdoctor.preflight(model=build(), timeout=20, local_checks=False)
    assert [f.id for f in report.findings] == ["pre.W011"] and report.findings[0].ranks == (0, 1), report.findings
    assert distdoctor.preflight(model=build(), wrap="never", timeout=20, local_checks=False).findings == []
    ddp = nn.parallel.DistributedDataParallel(build())
    assert distdoctor.preflight(model=ddp, timeout=20, local_checks=False).findings == []


def setup_mistakes() -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    data = TensorDataset(torch.arange(40.0).unsqueeze(1))

    # no DistributedSampler: a warning (does not raise at the default fail level) on both ranks
    report = distdoctor.preflight(dataloader=DataLoader(data, batch_size=4), timeout=20, local_checks=False)
    warning = [f for f in report.findings if f.id == "pre.W003"]
    assert len(warning) == 1 and warning[0].ranks == (0, 1), report.findings

    # a sampler built for another world
    sampler = DistributedSampler(data, num_replicas=4, rank=rank)
    err = expect_raise(dataloader=DataLoader(data, sampler=sampler, batch_size=4))
    mismatch = only(err, "pre.E004")
    assert mismatch.cause == "rank_config_error" and mismatch.ranks == (0, 1)

    # ranks with different batch counts
    mine = TensorDataset(torch.arange(40.0 if rank == 0 else 48.0).unsqueeze(1))
    loader = DataLoader(mine, sampler=DistributedSampler(mine), batch_size=4)
    err = expect_raise(dataloader=loader)
    uneven = only(err, "pre.E006")
    assert uneven.cause == "uneven_inputs" and uneven.ranks == (1,) and uneven.data["batches"] == {"0": 5, "1": 6}

    assert "Join" in uneven.remediation and "drop_last" not in uneven.remediation, uneven.remediation

    # nn.DataParallel inside a multi-process job; on the CPU the advice must not pass
    # device_ids (DistributedDataParallel(cpu_model, device_ids=[0]) raises ValueError)
    err = expect_raise(model=nn.DataParallel(build()))
    dp = only(err, "pre.E002")
    assert dp.cause == "launcher_misuse" and "device_ids=[local_rank])" not in dp.remediation, dp.remediation
    assert "use DistributedDataParallel(model) without device_ids" in dp.remediation
    nn.parallel.DistributedDataParallel(build())  # what the advice says works here

    # the fail level decides: with critical, the warnings and errors are returned, not raised
    report = distdoctor.preflight(model=nn.DataParallel(build()), fail_level="critical", timeout=20, local_checks=False)
    assert report.status == "error"
    # silencing an ID
    report = distdoctor.preflight(model=build(seed=rank), wrap="never", silence=("spec.E004",), timeout=20,
                                  local_checks=False)
    assert report.findings == [] and [f.id for f in report.silenced] == ["spec.E004"]
    assert world == 2


def clean_logs_one_line(log_path: str) -> None:
    logger = logging.getLogger("distdoctor")
    logger.setLevel(logging.INFO)
    handler = logging.FileHandler(f"{log_path}.{dist.get_rank()}")
    logger.addHandler(handler)
    report = distdoctor.preflight(model=build(), wrap="later", timeout=20)  # with the local registry checks
    handler.close()
    assert report.exit_code() == 0, report.findings
    assert any(c["name"] == "preflight.exchange" for c in report.checks)


def rank_one_never_arrives() -> None:
    rank = dist.get_rank()
    if rank == 0:
        start = time.monotonic()
        err = expect_raise(model=build(), timeout=4)  # rank 1 never comes
        # Its timeout, plus the slack the test session measured for this machine's load.
        assert time.monotonic() - start < 4 + float(os.environ.get("DISTDOCTOR_TEST_SLACK_S", "2"))
        missing = only(err, "pre.E009")
        assert missing.cause == "rank_missing" and missing.ranks == (1,), missing
        assert err.report.status == "incomplete"
    dist.barrier()  # rank 1 was busy elsewhere; the group itself is still usable


def fsdp_models() -> None:
    """FSDP1 flat shards and FSDP2 DTensors: names/dtypes compared, shard values reported as not compared."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    rank = dist.get_rank()
    fsdp1 = FSDP(build(), device_id=torch.device("cpu"), use_orig_params=False)
    report = distdoctor.preflight(model=fsdp1, timeout=20, local_checks=False)
    assert [f.id for f in report.findings] == ["spec.I006"], report.findings
    assert "FSDP shard" in report.findings[0].title

    from torch.distributed.fsdp import fully_shard

    model = build()
    fully_shard(model)
    report = distdoctor.preflight(model=model, timeout=20, local_checks=False)
    assert [f.id for f in report.findings] == ["spec.I006"], report.findings
    assert "DTensor" in report.findings[0].title

    # a real difference still shows through the shards: another dtype on rank 1
    model = build(dtype=torch.float64 if rank == 1 else torch.float32)
    fully_shard(model[2])
    fully_shard(model)
    err = expect_raise(model=model)
    assert "spec.E002" in [f.id for f in err.report.findings], err.report.findings


def warnings_reach_stderr_by_default() -> None:
    """No logging set up in the script: a warning below the fail level still reaches stderr."""
    import contextlib
    import io

    for handler in list(logging.getLogger().handlers):  # a script that configured nothing
        logging.getLogger().removeHandler(handler)
    rank = dist.get_rank()
    data = TensorDataset(torch.arange(40.0).unsqueeze(1))
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        report = distdoctor.preflight(dataloader=DataLoader(data, batch_size=4, shuffle=True), timeout=20,
                                      local_checks=False)
    assert [f.id for f in report.findings] == ["pre.W003"] and report.exit_code() == 0
    text = stderr.getvalue()
    if rank == 0:
        assert "pre.W003" in text and "DistributedSampler" in text, text
    else:
        assert text == "", text  # one voice: rank 0 speaks for the world
