"""Site checks at arm's length, in-process: vetting of --checks-dir files in a child, local site
checks in a forked child, prints muted, name clashes refused (the CLI paths are in the matrix)."""

from __future__ import annotations

import contextlib
import io
import os
import textwrap
import time

from distdoctor.core.plugin_vetting import vet_files
from distdoctor.core.registry import Registry, SkipCheck
from distdoctor.core.runner import ERROR, PASS, SKIP, TIMEOUT, Runner
from distdoctor.fakes import fake_context


def site_registry() -> Registry:
    registry = Registry()
    registry._source = "file site.py"  # what load_checks_dir sets while a site file registers
    return registry


def run_one(registry: Registry, name: str, limit: float = 3.0):
    runner = Runner(registry, timeout=30, check_timeout=limit)
    return runner.run_check(registry.checks[name], fake_context())


def test_local_site_checks_run_in_a_child_and_answer_like_threads():
    registry = site_registry()

    @registry.check(stage="local", name="site.exits")
    def exits(ctx):
        os._exit(0)

    @registry.check(stage="local", name="site.skips")
    def skips(ctx):
        raise SkipCheck("not here")

    @registry.check(stage="local", name="site.raises")
    def raises(ctx):
        raise ValueError("bad site")

    @registry.check(stage="local", name="site.spins")
    def spins(ctx):
        while True:
            pass

    parent = os.getpid()
    exited = run_one(registry, "site.exits")
    assert os.getpid() == parent and exited.status == ERROR
    assert "ended its process (exit code 0)" in exited.findings[0].title
    assert run_one(registry, "site.skips").status == SKIP
    raised = run_one(registry, "site.raises")
    assert raised.status == ERROR and "ValueError: bad site" in raised.findings[0].title
    started = time.monotonic()
    spun = run_one(registry, "site.spins", limit=1.0)
    assert spun.status == TIMEOUT and time.monotonic() - started < 1.0 + 2.0


def test_cross_rank_site_check_prints_are_muted():
    registry = site_registry()

    @registry.check(stage="rendezvous", name="site.noisy")
    def noisy(ctx):
        print("noise that would corrupt a JSON report")
        return []

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result = run_one(registry, "site.noisy")
        print("the report")
    assert result.status == PASS and out.getvalue() == "the report\n"


def test_vetting_names_the_file_that_blocks_or_exits(tmp_path):
    files = {"a_fine.py": "X = 1\n", "b_blocks.py": "import time\ntime.sleep(3600)\n",
             "c_exits.py": "import os\nos._exit(3)\n", "d_raises.py": "raise ImportError('x')\n",
             "e_fine.py": "Y = 2\n"}
    for name, body in files.items():
        (tmp_path / name).write_text(body)
    paths = sorted(tmp_path.glob("*.py"))
    started = time.monotonic()
    problems = {p.name: why for p, why in vet_files(paths, timeout=2.0).items()}
    # one timeout (+ the child's start allowance) and a fresh child after it
    assert time.monotonic() - started < 2.0 + 2.0 + 10.0
    assert set(problems) == {"b_blocks.py", "c_exits.py"}, problems
    assert "did not finish within 2s" in problems["b_blocks.py"]
    assert "exit code 3" in problems["c_exits.py"]


def test_a_site_file_cannot_shadow_a_builtin_check(tmp_path):
    from distdoctor.core.registry import REGISTRY

    # site files register through the module-level decorators, i.e. the process-wide registry
    REGISTRY.load_builtins()
    builtin = REGISTRY.checks["network.rendezvous_port"]
    (tmp_path / "network.py").write_text(textwrap.dedent("""
        from distdoctor import check
        @check(stage="local")
        def rendezvous_port(ctx):
            return []
    """))
    before = list(REGISTRY.load_problems)
    try:
        REGISTRY.load_checks_dir(tmp_path, vet_timeout=5.0)
        assert REGISTRY.checks["network.rendezvous_port"] is builtin
        problem = [p for p in REGISTRY.load_problems if "network.py" in p.data["source"]]
        # "builtin network" when the loader imported it, "builtin" when a test imported the module first
        assert problem and "already registered by builtin" in problem[0].detail
    finally:
        REGISTRY.load_problems[:] = before  # later in-process runs must not report this file


def test_many_blocking_files_do_not_add_up(tmp_path):
    for name in ("a.py", "b.py", "c.py", "d.py"):
        (tmp_path / name).write_text("import time\ntime.sleep(3600)\n")
    started = time.monotonic()
    problems = vet_files(sorted(tmp_path.glob("*.py")), timeout=1.0)
    # the directory's budget is twice the per-file deadline (+ the child's start allowance),
    # and a fresh child's own start is paid again after each killed one
    assert time.monotonic() - started < 2 * 1.0 + 1.0 + 8.0
    assert len(problems) == 4 and any("loading deadline" in why for why in problems.values())
