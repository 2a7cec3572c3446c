"""pytest --distdoctor-lint / the distdoctor_lint ini key: one lint per session, failing it on errors."""

from __future__ import annotations

import pytest

BROKEN = "import torch.distributed as dist\n\n\ndef send(t):\n    dist.isend(t, dst=1)\n"
WARNING_ONLY = "import torch.distributed as dist\n\n\ndef recv(t):\n    req = dist.irecv(t, src=0)\n"


@pytest.fixture
def project(pytester: pytest.Pytester):
    pytester.makepyfile(test_ok="def test_ok():\n    assert True\n")
    src = pytester.mkdir("src")
    return src


def test_lint_errors_fail_the_session(pytester: pytest.Pytester, project):
    (project / "train.py").write_text(BROKEN)
    result = pytester.runpytest_subprocess("--distdoctor-lint", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines([
        "distdoctor lint: ERROR: 1 error*(fail level error)",
        "*distdoctor lint failed the session: 1 finding(s) at or above fail level error*",
        "*src/train.py:5:5: lint.E002 ?collective_timeout_hang? The request of an asynchronous send/receive*",
    ])
    result.assert_outcomes(passed=1)
    assert result.ret == 1
    assert result.stdout.str().count("lint.E002 [") == 1  # linted once, reported once


def test_warnings_do_not_fail_and_ini_key_and_paths_work(pytester: pytest.Pytester, project):
    (project / "train.py").write_text(WARNING_ONLY)
    other = pytester.mkdir("elsewhere")
    (other / "bad.py").write_text(BROKEN)
    pytester.makeini("[pytest]\ndistdoctor_lint = true\ndistdoctor_lint_paths = src\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["distdoctor lint: WARNING: 0 errors, 1 warning*"])
    assert result.ret == 0


def test_pyproject_lint_settings_apply(pytester: pytest.Pytester, project):
    (project / "train.py").write_text(BROKEN)
    pytester.makepyprojecttoml('[tool.distdoctor.lint]\nignore = ["lint.E002"]\n')
    result = pytester.runpytest_subprocess("--distdoctor-lint", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["distdoctor lint: OK: 0 errors*"])
    assert result.ret == 0


def test_bad_lint_path_is_a_usage_error(pytester: pytest.Pytester, project):
    pytester.makeini("[pytest]\ndistdoctor_lint = true\ndistdoctor_lint_paths = nowhere\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*distdoctor lint: no such file or directory*nowhere*"])


def test_without_the_option_no_lint_runs(pytester: pytest.Pytester, project):
    (project / "train.py").write_text(BROKEN)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert "distdoctor lint" not in result.stdout.str()
    assert result.ret == 0
