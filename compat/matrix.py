"""The compatibility matrix: one environment per torch release, the smoke set in each, one table.

    python compat/matrix.py                        # every release of RELEASES (CI: --ci)
    python compat/matrix.py --torch 2.1.2 --torch 2.14.1 --only check,explain
    python compat/matrix.py --write-docs           # also rewrite the table in docs/compatibility.md

Each release gets a virtual environment under ``--home`` (default $DISTDOCTOR_COMPAT_HOME or
~/.cache/distdoctor-compat), made once and kept: ``pip install torch==V`` (from wherever this
machine's pip looks: PyPI's Linux wheels are the CUDA builds, several GB with their nvidia-*
packages; they run on a machine without GPUs), then this checkout installed into it
(``pip install -e``) on every run. A torch built against NumPy 1 fails on NumPy 2
(``torch.from_numpy`` raises, importing torch warns with a traceback): the environment is
probed after the install and gets ``numpy<2`` when that is so, and the table says it. Then
compat/smoke.py runs with the environment's Python (real jobs: see its docstring) and the
results come back as JSON lines. The exit code is 1 when any case failed anywhere, so CI fails.
Not part of the wheel: a contributor's and CI's tool.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DOCS = REPO / "docs" / "compatibility.md"
# The releases the project claims, oldest first: the oldest it supports, two in the middle, the
# release constraints.txt pins (the suite's), and the newest this project's machines install.
RELEASES = ("2.1.2", "2.4.1", "2.8.0", "2.13.0", "2.14.1")
CASES = ("check", "preflight", "guard-ok", "guard-late", "guard-raise", "guard-kill", "bench", "pytest", "stacks",
         "explain", "guard-grace")
HEADINGS = {"check": "`check`", "preflight": "`preflight`", "guard-ok": "guard: healthy job",
            "guard-late": "guard: DDP straggler", "guard-raise": "guard: a rank raises",
            "guard-kill": "guard: a rank is killed", "bench": "`bench`", "pytest": "pytest marker",
            "stacks": "`stacks` hung job", "explain": "`explain` crash log", "guard-grace": "guard: gloo's timeout in grace"}
# CI's newest release is one minor release after the suite's (constraints.txt), whose tests cover every
# case's path on it: CI runs there only the cases that read what a new release changes first (the store and a
# world, the flight recorder under the guard, gloo's timeout, torch's printed texts, a hung rank's frames); the
# oldest release runs them all. `python compat/matrix.py` (every release) runs every case everywhere.
CI_NEWEST_CASES = ("check", "guard-late", "stacks", "explain", "guard-grace")
BEGIN, END = "<!-- matrix:begin (written by compat/matrix.py --write-docs) -->", "<!-- matrix:end -->"
PROBE_NUMPY = "import numpy, torch; torch.from_numpy(numpy.zeros(1)); print(numpy.__version__)"
DESCRIBE = ("import sys, torch, numpy; print(torch.__version__, torch.version.cuda or 'cpu', numpy.__version__, "
            "'%d.%d.%d' % sys.version_info[:3])")


@dataclass
class Result:
    release: str
    build: str = ""  # torch.__version__ and its CUDA version, as installed
    numpy: str = ""
    python: str = ""
    setup_s: float = 0.0
    smoke_s: float = 0.0
    cases: dict[str, dict] = field(default_factory=dict)
    error: str = ""  # the environment could not be made: why

    @property
    def ok(self) -> bool:
        return not self.error and bool(self.cases) and all(c.get("ok") for c in self.cases.values())


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def sh(command: list[str], timeout: float, env: dict[str, str] | None = None) -> tuple[int, str]:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return 124, f"{' '.join(command[:4])} ... did not finish in {timeout:.0f} s"
    except OSError as exc:
        return 127, str(exc)
    return done.returncode, (done.stdout + done.stderr).strip()


def installed(python: Path) -> tuple[str, str, str, str] | None:
    """(torch version, CUDA or 'cpu', numpy version, Python version) of an environment, or None."""
    if not python.exists():
        return None
    code, out = sh([str(python), "-W", "ignore", "-c", DESCRIBE], 300)
    lines = out.splitlines()
    if code != 0 or not lines:
        return None
    parts = lines[-1].split()
    return (parts[0], parts[1], parts[2], parts[3]) if len(parts) == 4 else None


def prepare(release: str, home: Path, interpreter: str) -> tuple[Path | None, str, Result]:
    """The environment of ``release`` (made if missing, distdoctor installed into it)."""
    result = Result(release)
    started = time.monotonic()
    env_dir = home / f"torch-{release}"
    python = env_dir / "bin" / "python"
    have = installed(python)
    if have is None or have[0].split("+")[0] != release:
        if env_dir.exists():
            shutil.rmtree(env_dir)
        say(f"[{release}] creating {env_dir} and installing torch=={release} (from PyPI, a CUDA build: GBs, minutes)")
        code, out = sh([interpreter, "-m", "venv", str(env_dir)], 300)
        if code == 0:
            code, out = sh([str(python), "-m", "pip", "install", "-q", f"torch=={release}"], 3600)
        if code != 0:
            result.error = f"torch=={release} could not be installed: {out[-600:]}"
            return None, "", result
    say(f"[{release}] installing this checkout of distdoctor")
    code, out = sh([str(python), "-m", "pip", "install", "-q", "-e", f"{REPO}[test]"], 1200)
    if code != 0:
        result.error = f"distdoctor could not be installed: {out[-600:]}"
        return None, "", result
    note = ""
    code, out = sh([str(python), "-W", "ignore", "-c", PROBE_NUMPY], 300)
    if code != 0:
        # A torch built against NumPy 1 (it says "compiled using NumPy 1.x cannot be run in NumPy 2").
        say(f"[{release}] torch fails with this NumPy; installing numpy<2")
        code, out = sh([str(python), "-m", "pip", "install", "-q", "numpy<2"], 1200)
        note = "numpy<2"
        if code != 0:
            result.error = f"numpy<2 could not be installed: {out[-600:]}"
            return None, note, result
    have = installed(python)
    if have is None:
        result.error = "torch does not import in the environment"
        return None, note, result
    result.build = f"{have[0]} ({'CUDA ' + have[1] if have[1] != 'cpu' else 'CPU'})"
    result.numpy, result.python = have[2], have[3]
    result.setup_s = time.monotonic() - started
    return python, note, result


def smoke(python: Path, only: list[str], result: Result) -> None:
    started = time.monotonic()
    command = [str(python), str(HERE / "smoke.py")] + (["--only", ",".join(only)] if only else [])
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            case = json.loads(line)
        except ValueError:
            continue
        result.cases[case["case"]] = case
        say(f"[{result.release}] {case['case']}: {'pass' if case['ok'] else 'FAIL'} ({case['seconds']:.0f} s)"
            + (f" -- {case['why']}" if not case["ok"] else ""))
    proc.wait()
    result.smoke_s = time.monotonic() - started
    if not result.cases:
        result.error = f"the smoke set printed no result (exit {proc.returncode})"


def ci_cases(release: str, releases: list[str]) -> list[str]:
    """The cases --ci runs for ``release``: all on the oldest, CI_NEWEST_CASES on the newest ([] = all)."""
    return list(CI_NEWEST_CASES) if release == releases[-1] and len(releases) > 1 else []


def table(results: list[Result], cases: list[str]) -> str:
    """The matrix as a Markdown table: one row per release, one column per case."""
    head = ["torch (build)", "NumPy"] + [HEADINGS[c] for c in cases] + ["set-up + smoke"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        cells = [r.build or r.release, r.numpy or "-"]
        for c in cases:
            case = r.cases.get(c)
            cells.append("n/a" if r.error else "-" if case is None else "✓" if case["ok"] else "✗")
        cells.append(f"{r.setup_s:.0f} s + {r.smoke_s:.0f} s" if not r.error else "environment failed")
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def failures(results: list[Result]) -> str:
    lines = []
    for r in results:
        if r.error:
            lines.append(f"- torch {r.release}: {r.error}")
        for name, case in r.cases.items():
            if not case.get("ok"):
                lines.append(f"- torch {r.release}, {HEADINGS[name]}: {case.get('why', '')}")
    return "\n".join(lines)


def write_docs(results: list[Result], cases: list[str], command: str) -> None:
    text = DOCS.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{DOCS} has no {BEGIN} ... {END} block to rewrite")
    pythons = sorted({r.python for r in results if r.python})
    block = "\n".join([
        BEGIN,
        f"Produced by `{command}` on {time.strftime('%Y-%m-%d')}, Linux {platform.machine()}, "
        f"{os.cpu_count()} cores, no GPU, Python {', '.join(pythons) or '?'}:",
        "",
        table(results, cases),
        "",
        ("Failures:\n\n" + failures(results)) if failures(results) else "Every case passed on every release.",
        END,
    ])
    start, stop = text.index(BEGIN), text.index(END) + len(END)
    DOCS.write_text(text[:start] + block + text[stop:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torch", action="append", default=[], metavar="VERSION",
                        help=f"a torch release to run (repeatable; default: {', '.join(RELEASES)})")
    parser.add_argument("--ci", action="store_true", help=f"the oldest release ({RELEASES[0]}), every case, and the newest "
                        f"({RELEASES[-1]}), {', '.join(CI_NEWEST_CASES)}")
    parser.add_argument("--only", default="", help=f"comma-separated cases (default: all of {', '.join(CASES)})")
    parser.add_argument("--home", default=os.environ.get("DISTDOCTOR_COMPAT_HOME", str(Path.home() / ".cache" / "distdoctor-compat")),
                        help="where the environments are kept (reused by the next run)")
    parser.add_argument("--python", default=sys.executable, help="the interpreter the environments are made from")
    parser.add_argument("--write-docs", action="store_true", help="rewrite the matrix in docs/compatibility.md")
    args = parser.parse_args(argv)
    releases = args.torch or ([RELEASES[0], RELEASES[-1]] if args.ci else list(RELEASES))
    only = [c for c in args.only.split(",") if c]
    unknown = [c for c in only if c not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; the cases: {', '.join(CASES)}")
    home = Path(args.home).expanduser()
    home.mkdir(parents=True, exist_ok=True)
    results = []
    for release in releases:
        python, note, result = prepare(release, home, args.python)
        if python is not None:
            smoke(python, ci_cases(release, releases) if args.ci and not only else only, result)
        if note and result.numpy:
            result.numpy += f" ({note})"
        results.append(result)
        say(f"[{release}] set-up {result.setup_s:.0f} s, smoke {result.smoke_s:.0f} s"
            + (f"; {result.error}" if result.error else ""))
    cases = only or list(CASES)
    print(table(results, cases))
    listed = failures(results)
    if listed:
        print("\nFailures:\n" + listed)
    if args.write_docs:
        flags = " ".join(f"--torch {r}" for r in args.torch) + (" --ci" if args.ci else "") + (
            f" --only {args.only}" if only else "")
        write_docs(results, cases, f"python compat/matrix.py{(' ' + flags) if flags.strip() else ''} --write-docs")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
