"""A check that raises, a plugin that fails to import and a check that overruns its deadline each
become a finding while the rest of the run completes — through the CLI, as users load plugins."""

import json
import subprocess
import sys
import textwrap
import time


def test_broken_plugins_become_findings(tmp_path, clean_env):
    plugins = tmp_path / "checks"
    plugins.mkdir()
    (plugins / "crashes.py").write_text(textwrap.dedent("""
        from distdoctor import check
        @check(stage="local", tags=("e2e",))
        def explodes(ctx):
            raise RuntimeError("boom from a site check")
    """))
    (plugins / "hangs.py").write_text(textwrap.dedent("""
        import time
        from distdoctor import check
        @check(stage="local", tags=("e2e",), timeout=1.0)
        def sleeps(ctx):
            time.sleep(60)
            return []
    """))
    (plugins / "broken.py").write_text("import not_a_real_module_anywhere\n")
    (plugins / "fine.py").write_text(textwrap.dedent("""
        from distdoctor import check, finding_kind
        K = finding_kind("e2e.W001", cause="unknown", title="The fine check ran", hint="nothing")
        @check(stage="local", tags=("e2e",))
        def runs(ctx):
            yield K()
    """))
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "distdoctor", "check", "--stage", "local", "--tag", "e2e",
         "--checks-dir", str(plugins), "--format", "json"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )
    elapsed = time.monotonic() - started
    assert "Traceback" not in proc.stderr
    report = json.loads(proc.stdout)
    by_id = {f["id"]: f for f in report["findings"]}
    assert {"core.W001", "core.W003", "core.E002", "e2e.W001"} <= set(by_id)
    assert "boom from a site check" in by_id["core.W001"]["title"]
    assert "not_a_real_module_anywhere" in by_id["core.E002"]["detail"]
    assert "crashes.explodes" in by_id["core.W001"]["check"]
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    assert statuses == {"crashes.explodes": "error", "hangs.sleeps": "timeout", "fine.runs": "fail"}
    assert report["status"] == "error" and proc.returncode == 1  # core.E002 is an error
    # The 60 s sleeper was abandoned after its 1 s deadline: distdoctor's own clock says so
    # (the report's duration), whatever the interpreter's start-up took on a loaded machine.
    assert report["duration_s"] < 30, (report["duration_s"], elapsed)
