"""The pytest plugin (entry point ``pytest11``): session checks, a report fixture, a multi-rank marker.

- ``pytest --distdoctor`` (or ``distdoctor = true`` in the ini file) runs the checks once per
  session, shows a one-line summary in the report header, and fails the session (exit status
  1, with the findings in the terminal summary) when a finding reaches
  ``--distdoctor-fail-level``.
- ``distdoctor_report``: a session-scoped fixture with the Report (the checks run on first use).
- ``@pytest.mark.distributed(world_size=2, backend="gloo", timeout=60)``: the test body runs in
  ``world_size`` fresh processes with an initialized process group (distdoctor.testing) and the
  runtime guard on (every collective verified; a stall named, and the test ended, at a third of
  the timeout: ``on_hang="exit"``, whatever the job's own default);
  ``guard=False`` turns it off, a dict passes distdoctor.guard's arguments.
- ``pytest --distdoctor-lint`` (or ``distdoctor_lint = true``) runs ``distdoctor lint`` once per
  session over ``distdoctor_lint_paths`` (default: the rootdir), with [tool.distdoctor.lint],
  and fails the session on a finding at or above the lint fail level (error by default).

Loading the plugin costs nothing measurable: this module imports neither torch nor rich nor
the check registry; they are imported when an option, the fixture or the marker is used.
"""

from __future__ import annotations

from typing import Any

import pytest
from pathlib import Path
import pickle

MARKER = "distributed"
_REPORT_KEY = pytest.StashKey[Any]()
_LINT_KEY = pytest.StashKey[Any]()
_LINT_HELP = "Lint the project's sources once per session (distdoctor lint); the session fails on lint errors."
_LINT_PATHS_HELP = "Files or directories for --distdoctor-lint (default: the rootdir)."
_INI = {
    # ini key -> (option name in distdoctor.core.config.OPTIONS or None, type, default)
    "distdoctor": (None, "bool", False),
    "distdoctor_fail_level": ("fail_level", "string", None),
    "distdoctor_timeout": ("timeout", "string", None),
    "distdoctor_silence": ("silence", "args", []),
    "distdoctor_stages": ("stages", "args", []),
    "distdoctor_tags": ("tags", "args", []),
    "distdoctor_checks_dirs": ("checks_dirs", "args", []),
}
_ENABLE_HELP = "Run the distdoctor checks once per session: summary in the header, session fails per the fail level."


def _help(option: str | None) -> str:
    if option is None:
        return _ENABLE_HELP
    # distdoctor.core.config is light (no torch); it holds the help text the CLI shows too.
    from distdoctor.core.config import OPTIONS

    return OPTIONS[option].help


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("distdoctor", "distdoctor: PyTorch distributed diagnostics")
    group.addoption("--distdoctor", action="store_true", default=None, help=_help(None))
    group.addoption("--distdoctor-fail-level", default=None, metavar="LEVEL", help=_help("fail_level"))
    group.addoption("--distdoctor-timeout", default=None, metavar="SECONDS", help=_help("timeout"))
    group.addoption("--distdoctor-silence", action="append", default=None, metavar="IDS", help=_help("silence"))
    for key, (option, kind, default) in _INI.items():
        parser.addini(key, _help(option), type=kind, default=default)
    group.addoption("--distdoctor-lint", action="store_true", default=None, help=_LINT_HELP)
    parser.addini("distdoctor_lint", _LINT_HELP, type="bool", default=False)
    parser.addini("distdoctor_lint_paths", _LINT_PATHS_HELP, type="args", default=[])


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(world_size=2, backend='gloo', timeout=60, guard=True): run the test in world_size processes, each "
        "a rank of an initialized torch.distributed process group, with distdoctor's runtime guard on (distdoctor)",
    )


def _enabled(config: pytest.Config) -> bool:
    flag = config.getoption("--distdoctor")
    return bool(flag) if flag is not None else bool(config.getini("distdoctor"))


def _settings(config: pytest.Config) -> dict[str, Any]:
    """Command line over ini; what is unset here comes from DISTDOCTOR_* env / pyproject / defaults.

    Each value is parsed here with the option's own parser so that an error names the pytest
    option or ini key it came from.
    """
    from distdoctor.core.config import OPTIONS  # loaded only on this path, to keep start-up light

    cli: dict[str, Any] = {}

    def take(option: str, value: Any, source: str) -> None:
        try:
            OPTIONS[option].parse(value)
        except ValueError as exc:
            raise pytest.UsageError(f"distdoctor: {source}: {exc}") from None
        cli[option] = value

    for key, (option, _kind, _default) in _INI.items():
        value = config.getini(key)
        if option is not None and value not in (None, "", []):
            take(option, value, f"ini {key}")
    for flag, option in (("--distdoctor-fail-level", "fail_level"), ("--distdoctor-timeout", "timeout"),
                         ("--distdoctor-silence", "silence")):
        value = config.getoption(flag)
        if value not in (None, [], ""):
            take(option, value, flag)
    return cli


def _session_report(config: pytest.Config) -> Any:
    """The checks' Report, computed once per session (cached on the config)."""
    cached = config.stash.get(_REPORT_KEY, None)
    if cached is not None:
        return cached
    from distdoctor.core.config import ConfigError, load_config  # loaded only on this path, to keep start-up light
    from distdoctor.dispatch import diagnose  # loaded only on this path, to keep start-up light

    try:
        settings = load_config(cli=_settings(config), cwd=config.rootpath)
    except ConfigError as exc:
        raise pytest.UsageError(f"distdoctor: {exc}") from None
    report = diagnose(settings)
    config.stash[_REPORT_KEY] = (report, settings)
    return report, settings


def _lint_enabled(config: pytest.Config) -> bool:
    flag = config.getoption("--distdoctor-lint")
    return bool(flag) if flag is not None else bool(config.getini("distdoctor_lint"))


def _lint_report(config: pytest.Config) -> Any:
    """The lint Report and its settings, computed once per session (cached on the config)."""
    cached = config.stash.get(_LINT_KEY, None)
    if cached is not None:
        return cached
    from distdoctor.lint import LintInputError, LintSettingsError, all_ids, lint_paths, load_settings  # loaded only when linting is asked for

    paths = [str(config.rootpath / p) for p in config.getini("distdoctor_lint_paths")] or [str(config.rootpath)]
    try:
        settings = load_settings(all_ids(), cwd=config.rootpath)
        report = lint_paths(paths, settings)
    except (LintInputError, LintSettingsError) as exc:
        raise pytest.UsageError(f"distdoctor lint: {exc}") from None
    config.stash[_LINT_KEY] = (report, settings)
    return report, settings


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    lines = []
    if _enabled(config) or _lint_enabled(config):
        from distdoctor.core.render import summary_line  # loaded only on this path, to keep start-up light
    if _enabled(config):
        report, settings = _session_report(config)
        lines.append(f"distdoctor: {summary_line(report)} (fail level {settings.fail_level.label})")
    if _lint_enabled(config):
        report, settings = _lint_report(config)
        lines.append(f"distdoctor lint: {summary_line(report)} (fail level {settings.fail_level.label})")
    return lines or None


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    failed = False
    if _enabled(config):
        report, settings = _session_report(config)
        failed |= report.exit_code(settings.fail_level) != 0
    if _lint_enabled(config):
        report, settings = _lint_report(config)
        failed |= report.exit_code(settings.fail_level) != 0
    if failed and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if _lint_enabled(config):
        _lint_summary(terminalreporter, config)
    if not _enabled(config):
        return
    report, settings = _session_report(config)
    code = report.exit_code(settings.fail_level)
    if code == 0:
        return
    from distdoctor.core.report import format_where  # loaded only on this path, to keep start-up light

    terminalreporter.section("distdoctor", sep="=", red=True, bold=True)
    worst = [f for f in report.findings if f.severity >= settings.fail_level]
    reason = "the diagnosis was cut off by its deadline" if report.incomplete else (
        f"{len(worst)} finding(s) at or above fail level {settings.fail_level.label}")
    terminalreporter.line(f"distdoctor failed the session: {reason}", red=True)
    for finding in worst:
        where = format_where(finding)
        terminalreporter.line(f"  {finding.id} [{finding.cause}] {finding.title}" + (f" ({where})" if where else ""))
        if finding.remediation:
            terminalreporter.line(f"      fix: {finding.remediation}")


def _lint_summary(terminalreporter: Any, config: pytest.Config) -> None:
    report, settings = _lint_report(config)
    worst = [f for f in report.findings if f.severity >= settings.fail_level]
    if not worst:
        return
    terminalreporter.section("distdoctor lint", sep="=", red=True, bold=True)
    terminalreporter.line(f"distdoctor lint failed the session: {len(worst)} finding(s) at or above "
                          f"fail level {settings.fail_level.label}", red=True)
    for finding in worst:
        data = finding.data or {}
        path = _relative(str(data.get("path", "")), config)
        terminalreporter.line(f"  {path}:{data.get('line')}:{data.get('col')}: {finding.id} "
                              f"[{finding.cause}] {finding.title}")
        if finding.remediation:
            terminalreporter.line(f"      fix: {finding.remediation}")


def _relative(path: str, config: pytest.Config) -> str:
    """A finding's path relative to the rootdir, as pytest shows test paths."""

    try:
        return Path(path).relative_to(config.rootpath).as_posix()
    except ValueError:
        return path


@pytest.fixture(scope="session")
def distdoctor_report(request: pytest.FixtureRequest) -> Any:
    """The distdoctor Report of this machine (checks run once per session, on first use)."""
    report, _settings = _session_report(request.config)
    return report


# -- the distributed marker ------------------------------------------------------------------------


def _marker_settings(mark: pytest.Mark) -> dict[str, Any]:
    def _distributed(world_size: int = 2, backend: str = "gloo", timeout: float = 60.0, grace: float = 3.0,
                     guard: Any = True) -> dict[str, Any]:
        return {"world_size": int(world_size), "backend": str(backend), "timeout": float(timeout), "grace": float(grace),
                "guard": _guard_settings(guard, float(timeout))}

    return _distributed(*mark.args, **mark.kwargs)


def _guard_settings(guard: Any, timeout: float) -> dict[str, Any] | None:
    """The runtime guard in the test body: every call verified, a hang named well before the timeout."""
    if guard is False or guard is None:
        return None
    # on_hang="exit": a stall ends the test at the hang timeout (a job's patience is not CI's).
    settings: dict[str, Any] = {"verify": "all", "hang_timeout": min(120.0, max(2.0, timeout / 3)), "on_hang": "exit"}
    if isinstance(guard, dict):
        settings.update(guard)
    elif guard is not True:
        raise TypeError(f"guard= takes True, False or a dict of distdoctor.guard's arguments, got {guard!r}")
    return settings


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    mark = pyfuncitem.get_closest_marker(MARKER)
    if mark is None:
        return None

    from distdoctor.testing import run_distributed  # loaded only on this path, to keep start-up light

    try:
        settings = _marker_settings(mark)
    except TypeError as exc:
        pytest.fail(f"@pytest.mark.{MARKER}: {exc}", pytrace=False)
    names = pyfuncitem._fixtureinfo.argnames
    kwargs = {name: pyfuncitem.funcargs[name] for name in names}
    try:
        pickle.dumps(kwargs)
    except Exception as exc:
        pytest.fail(f"@pytest.mark.{MARKER}: the test's arguments cannot be sent to the rank processes "
                    f"(they are pickled): {type(exc).__name__}: {exc}", pytrace=False)
    function = pyfuncitem.function
    module = pyfuncitem.module
    result = run_distributed(
        f"{module.__name__}:{function.__qualname__}",
        module_file=str(pyfuncitem.path),
        kwargs=kwargs,
        **settings,
    )
    skipped = result.skipped
    if skipped is not None:
        pytest.skip(skipped.message or "skipped on every rank")
    if not result.ok:
        pytest.fail(result.failure_message(), pytrace=False)
    return True
