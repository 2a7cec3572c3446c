"""torch's flight-recorder dumps given to explain (JSON and pickle, a directory of them, damaged ones)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from distdoctor.explain import LogInputError, explain_files
from distdoctor.testing import run_distributed

RANKS = str(Path(__file__).with_name("fr_jobs.py"))


@pytest.fixture(scope="module")
def dumps(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fr")
    (out / "json").mkdir()
    (out / "pickle").mkdir()
    result = run_distributed("fr_jobs:dumps_after_dtype_mismatch", world_size=2, module_file=RANKS,
                             env={"TORCH_FR_BUFFER_SIZE": "200"}, timeout=120, args=(str(out),))
    assert result.ok, result.failure_message()
    return out


@pytest.mark.multiproc
@pytest.mark.parametrize("form", ["json", "pickle"])
def test_the_dumps_of_every_rank_name_the_collective_where_they_differ(dumps, form):
    report = explain_files([str(dumps / form)])
    top = report.findings[0]
    assert (top.id, top.cause) == ("job.E008", "dtype_mismatch"), [(f.id, f.title) for f in report.findings]
    assert "all_reduce #2" in top.title and "Float" in top.title and "Int" in top.title
    assert top.confidence >= 0.8  # the recorder saw both ranks' dtypes: specific evidence
    assert report.world.ranks_reported == (0, 1)


@pytest.mark.multiproc
def test_a_truncated_or_hostile_dump_in_a_directory_is_skipped_and_named(dumps, tmp_path):
    folder = tmp_path / "reports"
    folder.mkdir()
    for rank in (0, 1):
        (folder / f"dump-{rank}.json").write_text((dumps / "json" / f"dump-{rank}.json").read_text())
    whole = (dumps / "pickle" / "nccl_trace_rank_0").read_bytes()
    (folder / "nccl_trace_rank_7").write_bytes(whole[: len(whole) // 2])
    (folder / "nccl_trace_rank_8").write_bytes(pickle.dumps(Path("/etc/passwd")))  # a class: refused, never built
    report = explain_files([str(folder)])
    assert report.findings[0].cause == "dtype_mismatch"
    skipped = next(f for f in report.findings if f.id == "log.W036")
    assert "nccl_trace_rank_7" in skipped.detail and "nccl_trace_rank_8" in skipped.detail
    with pytest.raises(LogInputError, match="nccl_trace_rank_7: not a readable flight-recorder dump"):
        explain_files([str(folder / "nccl_trace_rank_7")])


def test_a_dump_without_its_rank_in_its_name_is_refused_with_the_reason(tmp_path):
    dump = tmp_path / "trace.json"
    dump.write_text(json.dumps({"version": "2.10", "pg_status": {}, "entries": []}))
    with pytest.raises(LogInputError, match="whose rank its name does not say"):
        explain_files([str(dump)])
