"""A torch older than the oldest supported release is refused at start in one line, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from distdoctor.machine.torch_support import OLDEST_TEXT, refusal, release
from tests.local_faults.conftest import REPO, base_env


def old_torch(tmp_path: Path, version: str) -> dict[str, str]:
    """An environment whose torch (first on PYTHONPATH) is ``version``; importing it fails loudly,
    so a refusal that imported torch to learn the version would show."""
    package = tmp_path / "fake" / "torch"
    package.mkdir(parents=True)
    (package / "version.py").write_text(f"__version__ = '{version}'\ncuda = '11.8'\n")
    (package / "__init__.py").write_text('raise ImportError("this torch must not be imported to be refused")\n')
    return base_env(PYTHONPATH=os.pathsep.join([str(tmp_path / "fake"), str(REPO)]), NO_COLOR="1")


def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("command", [["check"], ["check", "--stage", "local"], ["bench", "--nproc", "2"],
                                     ["guard", "--", "python", "train.py"]])
def test_the_commands_that_run_torch_refuse_it_in_one_line(tmp_path, command):
    done = run(["-m", "distdoctor", *command], old_torch(tmp_path, "2.0.1+cu118"))
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert f"supports torch {OLDEST_TEXT} and newer; this environment has torch 2.0.1+cu118" in done.stderr


def test_commands_that_read_logs_still_work_with_it(tmp_path):
    log = tmp_path / "job.log"
    log.write_text("[rank1]: Traceback (most recent call last):\n[rank1]:   File \"train.py\", line 3, in <module>\n"
                   "[rank1]: ValueError: bad batch\n")
    done = run(["-m", "distdoctor", "explain", str(log)], old_torch(tmp_path, "1.13.1"))
    assert done.returncode == 1 and "ValueError" in done.stdout and "supports torch" not in done.stderr


def test_the_embedded_api_raises_preflight_error_with_that_line(tmp_path):
    code = ("import distdoctor\n"
            "for call in (distdoctor.preflight, lambda: distdoctor.init_process_group('gloo')):\n"
            "    try:\n"
            "        call()\n"
            "    except distdoctor.PreflightError as exc:\n"
            "        print(str(exc)); print([(f.id, f.cause) for f in exc.report.findings])\n")
    done = run(["-c", code], old_torch(tmp_path, "2.0.1"))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 4 and lines[0] == lines[2]
    assert lines[0].startswith("distdoctor: distdoctor supports torch 2.1 and newer; this environment has torch 2.0.1.")
    assert lines[1] == "[('backend.E007', 'version_incompat')]"


@pytest.mark.parametrize("version, refused", [
    ("2.0.1+cu118", True), ("1.13.1", True), ("2.1.0a0+git1234", False), ("2.1.2+cu121", False),
    ("2.14.1", False), ("3.0.0", False), ("not a version", False),
])
def test_the_floor(version, refused):
    assert (refusal(version) is not None) is refused
    assert release("2.1.2+cu121") == (2, 1, 2)


def test_this_environments_torch_is_supported():
    assert refusal() is None


def test_the_range_is_said_the_same_everywhere():
    """pyproject's lower bound, the refusal, the matrix's oldest release, README and the docs agree."""
    import importlib.util
    import re

    spec = importlib.util.spec_from_file_location("compat_matrix", REPO / "compat" / "matrix.py")
    matrix = importlib.util.module_from_spec(spec)
    sys.modules["compat_matrix"] = matrix  # its dataclasses look their module up
    spec.loader.exec_module(matrix)
    pyproject = (REPO / "pyproject.toml").read_text()
    assert re.search(r'"torch>=([0-9.]+)"', pyproject).group(1) == OLDEST_TEXT
    assert release(matrix.RELEASES[0])[:2] == release(OLDEST_TEXT)
    readme = (REPO / "README.md").read_text()
    assert f"torch {OLDEST_TEXT} or newer" in readme
    assert all(r in readme for r in matrix.RELEASES)
    assert f"torch {OLDEST_TEXT} and newer" in (REPO / "docs" / "compatibility.md").read_text()
