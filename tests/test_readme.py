"""The README's quick start is what CI runs, and its commands exist."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def quick_start_commands():
    text = (REPO / "README.md").read_text()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.+?)\n```", section, re.S)


def test_quick_start_is_exactly_two_commands():
    commands = quick_start_commands()
    assert len(commands) == 2
    assert all("\n" not in c for c in commands)
    assert commands[0].endswith("distdoctor check")
    assert "pytest" in commands[1]


def test_ci_runs_exactly_the_readme_test_command():
    test_command = quick_start_commands()[1]
    ci = (REPO / ".ci" / "run").read_text()
    ci_commands = [line for line in ci.splitlines() if line and not line.startswith(("#", "set ", "cd ", "export "))]
    # Before it, CI only installs the launchers the suite starts (never fatal, never a test run);
    # after it, the compatibility matrix for the oldest and the newest torch (its own environments).
    assert ci_commands[0] == ".ci/install-launchers"
    assert ci_commands[3:] == ["python compat/matrix.py --ci", 'exit "$suite"']
    # CI adds pip's -q only; the command is otherwise the README's, character for character, and its status is
    # the script's (a failing step inside an && list does not end a `set -e` script by itself).
    assert ci_commands[1] == "suite=0" and ci_commands[2].endswith(" || suite=$?")
    assert ci_commands[2].removesuffix(" || suite=$?").replace("pip install -q ", "pip install ") == test_command


def test_ci_launcher_install_is_guarded_and_never_fatal():
    script = (REPO / ".ci" / "install-launchers").read_text()
    assert "apt-get install -y slurm-wlm munge openmpi-bin iproute2" in script
    assert "command -v apt-get" in script and script.rstrip().endswith("exit 0")


def test_constraints_pin_the_cpu_torch():
    assert "torch==2.13.0" in (REPO / "constraints.txt").read_text()
