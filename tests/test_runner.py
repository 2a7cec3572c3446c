import threading
import time

import pytest

from distdoctor.fakes import fake_context
from distdoctor.core.findings import Severity
from distdoctor.core.registry import SkipCheck
from distdoctor.core.runner import Runner
from tests.conftest import measured_startup_s


@pytest.fixture
def kinds(fresh_registry):
    return {
        "err": fresh_registry.finding_kind("t.E001", cause="unknown", title="an error", hint="h"),
        "crit": fresh_registry.finding_kind("t.C002", cause="env_missing", title="cannot start", hint="h"),
        "info": fresh_registry.finding_kind("t.I003", cause="unknown", title="fyi", hint="h"),
    }


def run(registry, *, timeout=10.0, check_timeout=5.0, silence=(), world=None, env=None):
    runner = Runner(registry, timeout=timeout, check_timeout=check_timeout, silence=silence)
    ctx = fake_context(env or {}, world=world)
    runner.run(ctx, registry.select())
    return runner


def statuses(runner):
    return {r.name: r.status for r in runner.state.results}


def test_crash_and_overrun_become_findings_and_the_run_goes_on(fresh_registry, kinds):
    release = threading.Event()
    fresh_registry.check(lambda ctx: 1 / 0, name="t.crashes")
    fresh_registry.check(lambda ctx: release.wait(30) or [], name="t.hangs", timeout=0.3)
    fresh_registry.check(lambda ctx: [kinds["err"]()], name="t.finds")
    fresh_registry.check(lambda ctx: (_ for _ in ()).throw(SkipCheck("not here")), name="t.skips")
    started = time.monotonic()
    runner = run(fresh_registry)
    release.set()
    assert time.monotonic() - started < min(3 + measured_startup_s(), 25)  # not the 30 s hang
    assert statuses(runner) == {"t.crashes": "error", "t.hangs": "timeout", "t.finds": "fail", "t.skips": "skip"}
    ids = sorted(f.id for f in runner.state.findings)
    assert ids == ["core.W001", "core.W003", "t.E001"]
    crash = next(f for f in runner.state.findings if f.id == "core.W001")
    assert "ZeroDivisionError" in crash.title and crash.check == "t.crashes"
    assert not runner.state.incomplete
    skipped = next(r for r in runner.state.results if r.name == "t.skips")
    assert skipped.reason == "not here"


def test_run_deadline_makes_the_report_incomplete(fresh_registry):
    release = threading.Event()
    fresh_registry.check(lambda ctx: release.wait(30) or [], name="t.slow")
    fresh_registry.check(lambda ctx: [], name="t.after")
    started = time.monotonic()
    runner = run(fresh_registry, timeout=0.5, check_timeout=5.0)
    release.set()
    assert time.monotonic() - started < min(2 + measured_startup_s(), 25)  # not the 30 s hang
    assert runner.state.incomplete and runner.state.stuck_stage == "local"
    assert statuses(runner) == {"t.slow": "timeout", "t.after": "skip"}
    assert any(f.id == "core.E004" and "local" in f.title for f in runner.state.findings)


def test_critical_findings_skip_later_stages(fresh_registry, kinds):
    fresh_registry.check(lambda ctx: [kinds["crit"]()], name="t.blocker")
    fresh_registry.check(lambda ctx: [], name="t.rdzv", stage="rendezvous")
    runner = run(fresh_registry, world=object())
    result = next(r for r in runner.state.results if r.name == "t.rdzv")
    assert result.status == "skip" and "t.C002" in result.reason


def test_silenced_critical_does_not_block(fresh_registry, kinds):
    fresh_registry.check(lambda ctx: [kinds["crit"]()], name="t.blocker")
    fresh_registry.check(lambda ctx: [], name="t.rdzv", stage="rendezvous")
    runner = run(fresh_registry, world=object(), silence=("t.C*",))
    assert statuses(runner)["t.rdzv"] == "pass"


def test_cross_rank_stages_skip_without_a_world(fresh_registry):
    fresh_registry.check(lambda ctx: [], name="t.coll", stage="collective")
    runner = run(fresh_registry)
    (result,) = runner.state.results
    assert result.status == "skip" and "no cross-rank world" in result.reason


def test_findings_are_annotated_with_rank_and_host(fresh_registry, kinds):
    fresh_registry.check(lambda ctx: [kinds["info"]()], name="t.local")
    env = {"RANK": "3", "WORLD_SIZE": "4", "MASTER_ADDR": "a", "MASTER_PORT": "1", "TORCHELASTIC_RUN_ID": "x"}
    runner = run(fresh_registry, env=env)
    (finding,) = runner.state.findings
    assert finding.ranks == (3,) and finding.hosts == ("node-a",) and finding.check == "t.local"
    assert finding.severity is Severity.INFO


def test_a_check_returning_garbage_is_an_error(fresh_registry):
    fresh_registry.check(lambda ctx: ["not a finding"], name="t.garbage")
    runner = run(fresh_registry)
    assert statuses(runner) == {"t.garbage": "error"}
