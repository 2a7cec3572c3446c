"""One version, said everywhere: pyproject.toml's, the package's, `distdoctor --version`'s, every report's and
CHANGELOG.md's newest release."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import distdoctor

REPO = Path(__file__).resolve().parents[1]


def test_the_package_says_the_version_pyproject_declares():
    declared = re.search(r'^version = "([^"]+)"$', (REPO / "pyproject.toml").read_text(), re.M).group(1)
    assert distdoctor.__version__ == declared
    assert re.fullmatch(r"\d+\.\d+\.\d+", declared)


def test_the_changelog_has_a_section_for_this_version():
    text = (REPO / "CHANGELOG.md").read_text()
    assert re.search(rf"^## \[{re.escape(distdoctor.__version__)}\]", text, re.M), "CHANGELOG.md lacks this release"


def test_the_command_and_its_json_report_say_it():
    out = subprocess.run([sys.executable, "-m", "distdoctor", "--version"], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == f"distdoctor {distdoctor.__version__}"
    report = subprocess.run([sys.executable, "-m", "distdoctor", "check", "--stage", "local", "--format", "json"],
                            capture_output=True, text=True, timeout=300, env={"PATH": "/usr/bin:/bin", "HOME": "/tmp",
                                                                              "PYTHONPATH": str(REPO)})
    assert json.loads(report.stdout)["about"]["distdoctor"] == distdoctor.__version__
