"""preflight in real 2-rank gloo worlds on loopback (each rank asserts what it saw)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from distdoctor.testing import run_distributed
from tests.conftest import measured_startup_s, slack_s

pytestmark = pytest.mark.multiproc
SCENARIOS = str(Path(__file__).with_name("rank_scenarios.py"))


def run(name: str, timeout: float = 90, **kwargs):
    # The ranks bound their own waits by their timeout plus this machine's measured slack.
    os.environ.setdefault("DISTDOCTOR_TEST_SLACK_S", f"{slack_s(measured_startup_s()):.1f}")
    result = run_distributed(f"rank_scenarios:{name}", module_file=SCENARIOS, world_size=2, timeout=timeout, **kwargs)
    assert result.ok, result.failure_message()
    return result


def test_model_mismatches_are_named_on_both_ranks():
    run("model_mismatches")


def test_ddp_setup_mistakes():
    run("setup_mistakes")


def test_clean_run_logs_one_line_on_rank_0(tmp_path):
    log = tmp_path / "log"
    run("clean_logs_one_line", kwargs={"log_path": str(log)})
    lines = Path(f"{log}.0").read_text().splitlines()
    # ok, or warning when this machine gives the registry's local checks something to say (each
    # warning is then logged too, at WARNING, after the one summary line)
    summary = [line for line in lines if re.match(r"distdoctor preflight: (ok|warning) on 2 ranks", line)]
    assert len(summary) == 1 and re.match(r"distdoctor preflight: (ok|warning) on 2 ranks, 6 tensors compared", lines[0]), lines
    assert Path(f"{log}.1").read_text() == ""


def test_missing_rank_is_named_within_the_timeout():
    run("rank_one_never_arrives", timeout=60)


def test_fsdp_shards_are_compared_honestly():
    run("fsdp_models")


def test_warnings_reach_stderr_without_logging_setup():
    run("warnings_reach_stderr_by_default")
