"""--distdoctor / ini keys: a one-line header, the session failing per the fail level, the fixture."""

from __future__ import annotations

import pytest

SITE_CHECK = '''
from distdoctor import check, finding_kind

PLUGTEST_BROKEN = finding_kind("plugtest.E001", cause="unknown", title="The plugtest fixture machine is broken",
                               hint="Nothing; this is a test")


@check(stage="local", tags=("plugtest",), emits=(PLUGTEST_BROKEN,))
def always_broken(ctx):
    yield PLUGTEST_BROKEN()
'''

INI = '''
[pytest]
distdoctor_checks_dirs = {checks}
distdoctor_tags = plugtest
distdoctor_stages = local
'''


@pytest.fixture
def site(pytester: pytest.Pytester):
    checks = pytester.mkdir("site_checks")
    (checks / "broken.py").write_text(SITE_CHECK)
    pytester.makepyfile(test_ok="def test_ok():\n    assert True\n")
    return checks


def test_header_and_failing_session(pytester: pytest.Pytester, site):
    pytester.makeini(INI.format(checks=site))
    result = pytester.runpytest_subprocess("--distdoctor", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines([
        "distdoctor: ERROR: 1 error*(fail level error)",
        "*distdoctor failed the session: 1 finding(s) at or above fail level error*",
        "*plugtest.E001 ?unknown? The plugtest fixture machine is broken*",
    ])
    result.assert_outcomes(passed=1)
    assert result.ret == 1


def test_fail_level_option_lets_the_session_pass(pytester: pytest.Pytester, site):
    pytester.makeini(INI.format(checks=site))
    result = pytester.runpytest_subprocess("--distdoctor", "--distdoctor-fail-level=critical", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["distdoctor: ERROR: 1 error*(fail level critical)"])
    assert result.ret == 0


def test_ini_key_enables_and_sets_fail_level(pytester: pytest.Pytester, site):
    pytester.makeini(INI.format(checks=site) + "distdoctor = true\ndistdoctor_fail_level = critical\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["distdoctor: ERROR: 1 error*(fail level critical)"])
    assert result.ret == 0


def test_bad_fail_level_is_a_usage_error(pytester: pytest.Pytester, site):
    pytester.makeini(INI.format(checks=site))
    result = pytester.runpytest_subprocess("--distdoctor", "--distdoctor-fail-level=loud", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*distdoctor: --distdoctor-fail-level: unknown severity 'loud'*"])


def test_without_the_option_nothing_runs(pytester: pytest.Pytester, site):
    pytester.makeini(INI.format(checks=site))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert "distdoctor:" not in result.stdout.str()
    assert result.ret == 0


def test_report_fixture(pytester: pytest.Pytester, site):
    pytester.makeini(INI.format(checks=site))
    pytester.makepyfile(test_fixture='''
def test_report(distdoctor_report):
    assert [f.id for f in distdoctor_report.findings] == ["plugtest.E001"]
    assert distdoctor_report.status == "error"
''')
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)


def test_loading_the_plugin_imports_no_torch(pytester: pytest.Pytester):
    pytester.makepyfile(test_modules='''
import sys

def test_light():
    assert "distdoctor.pytest_plugin" in sys.modules
    heavy = [m for m in ("torch", "rich", "distdoctor.core.engine", "distdoctor.checks") if m in sys.modules]
    assert heavy == []
''')
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_options_share_help_with_the_cli():
    from distdoctor.core.config import OPTIONS
    from distdoctor.pytest_plugin import _help

    assert _help("fail_level") == OPTIONS["fail_level"].help
