"""Configuration: CLI flag > DISTDOCTOR_* env > [tool.distdoctor] in pyproject.toml > defaults.

Every option is declared once in OPTIONS with its parser and help text; the CLI, the
environment, pyproject.toml and the pytest plugin all use the same declaration, so a value is
parsed the same way wherever it comes from and a bad one names its source.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from distdoctor.core.findings import Severity
from distdoctor.core.stages import STAGES

ENV_PREFIX = "DISTDOCTOR_"
BACKENDS = ("nccl", "gloo", "mpi", "ucc", "xccl")
FORMATS = ("rich", "json", "markdown", "html")
# Sub-tables of [tool.distdoctor] that belong to one command and are not options of `check`.
SUBTABLES = frozenset({"lint"})


class ConfigError(Exception):
    """A configuration value is unusable; the message names where it came from."""


def _as_list(value: Any) -> list[str]:
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    if isinstance(value, (list, tuple)):
        out: list[str] = []
        for item in value:
            if not isinstance(item, str):
                raise ValueError(f"expected strings, got {item!r}")
            out.extend(_as_list(item))
        return out
    raise ValueError(f"expected a string or a list of strings, got {value!r}")


# The longest deadline accepted: one week. Far beyond any diagnosis, and far below what the
# platform's timers take (threading refuses ~9e9 s; time_t overflows near 1e300).
MAX_SECONDS = 7 * 24 * 3600.0
# The most ranks a self-test starts on one node.
MAX_NPROC = 1024


def _short(value: Any) -> str:
    """A bad value quoted in an error message, cut to a readable length."""
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:40]}… ({len(text)} characters)"


def _positive_float(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError(f"expected a number of seconds, got {_short(value)}")
    try:
        number = float(value)
    except OverflowError:  # an integer too large for a float: far beyond the bound
        number = float("inf")
    except (TypeError, ValueError):
        raise ValueError(f"expected a number of seconds, got {_short(value)}") from None
    if not (number > 0):
        raise ValueError(f"expected a positive number of seconds, got {_short(value)}")
    if not (number <= MAX_SECONDS):
        raise ValueError(f"expected at most {MAX_SECONDS:g} seconds (one week), got {_short(value)}")
    return number


def _positive_int(value: Any, maximum: int | None = None) -> int:
    if isinstance(value, bool):
        raise ValueError(f"expected a positive integer, got {_short(value)}")
    text = str(value).strip()
    if not (text.isascii() and text.isdigit()) or len(text) > 18:
        raise ValueError(f"expected a positive integer, got {_short(value)}")
    number = int(text)
    if number < 1:
        raise ValueError(f"expected a positive integer, got {_short(value)}")
    if maximum is not None and number > maximum:
        raise ValueError(f"expected at most {maximum}, got {number}")
    return number


def _nproc(value: Any) -> int:
    return _positive_int(value, MAX_NPROC)


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected true or false, got {value!r}")


def _choice(choices: tuple[str, ...]) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        text = str(value).strip().lower()
        if text not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {_short(value)}")
        return text

    return parse


def _choices(choices: tuple[str, ...]) -> Callable[[Any], tuple[str, ...]]:
    def parse(value: Any) -> tuple[str, ...]:
        items = _as_list(value)
        if not items:
            # An empty selection would run no check and say "ok".
            raise ValueError(f"expected at least one of {', '.join(choices)}, got none")
        for item in items:
            if item not in choices:
                raise ValueError(f"expected some of {', '.join(choices)}, got {_short(item)}")
        return tuple(items)

    return parse


def _severity(value: Any) -> Severity:
    return Severity.parse(value)


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {value!r}")
    return value.strip()


def _str_tuple(value: Any) -> tuple[str, ...]:
    return tuple(_as_list(value))


@dataclass(frozen=True)
class Option:
    name: str
    parse: Callable[[Any], Any]
    default: Any
    help: str


OPTIONS: dict[str, Option] = {
    o.name: o
    for o in (
        Option("fail_level", _severity, Severity.ERROR,
               "Exit 1 when a finding at or above this severity remains (info, warning, error, critical)."),
        Option("silence", _str_tuple, (),
               "Finding IDs to silence (comma-separated; 'net.*' silences an area). Silenced findings are counted."),
        Option("timeout", _positive_float, 60.0,
               "Deadline in seconds for the whole diagnosis; past it the report is partial and the exit code 3."),
        Option("check_timeout", _positive_float, 10.0,
               "Deadline in seconds for any one check; an overrun becomes finding core.W003."),
        Option("stages", _choices(STAGES), STAGES,
               "Stages to run, in order: local, rendezvous, collective."),
        Option("tags", _str_tuple, (), "Run only the checks with one of these tags."),
        Option("checks_dirs", _str_tuple, (), "Directories of site checks (plain .py files) to load."),
        Option("backend", _choice(BACKENDS), None,
               "The backend the job will use (nccl, gloo, mpi, ucc, xccl); default: nccl with GPUs, else gloo."),
        Option("nproc", _nproc, None,
               "Ranks for the local self-test world when no launcher started us (default: GPUs, at least 2)."),
        Option("format", _choice(FORMATS), "rich", "Report format: rich (terminal), json, markdown or html (one self-contained page, with pictures)."),
        # Two facts about the job that its environment does not show; checks validate them.
        Option("init_method", _text, None,
               "The init_method the job passes to init_process_group (env://, tcp://host:port, file:///path); default env://."),
        Option("pg_timeout", _positive_float, None,
               "The timeout in seconds the job passes to init_process_group; default: torch's for the backend."),
    )
}


@dataclass(frozen=True)
class Config:
    fail_level: Severity = Severity.ERROR
    silence: tuple[str, ...] = ()
    timeout: float = 60.0
    check_timeout: float = 10.0
    stages: tuple[str, ...] = STAGES
    tags: tuple[str, ...] = ()
    checks_dirs: tuple[str, ...] = ()
    backend: str | None = None
    nproc: int | None = None
    format: str = "rich"
    init_method: str | None = None
    pg_timeout: float | None = None
    # Where each value came from ("default", "pyproject.toml", "DISTDOCTOR_TIMEOUT", "--timeout").
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)


def find_pyproject(start: Path) -> Path | None:
    for directory in (start, *start.parents):
        candidate = directory / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


def _read_pyproject_table(path: Path) -> dict[str, Any]:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot be read ({exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: is not valid TOML ({exc})") from None
    except RecursionError:
        # tomllib recurses once per level of nesting: thousands of levels exhaust the stack.
        raise ConfigError(f"{path}: is nested too deeply to read") from None
    table = data.get("tool", {})
    table = table.get("distdoctor", {}) if isinstance(table, dict) else {}
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [tool.distdoctor] must be a table, not {type(table).__name__}")
    return table


def _config_key(key: str) -> str:
    return key.replace("-", "_")


def load_config(
    cli: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    pyproject: Path | None = None,
    use_pyproject: bool = True,
    cli_flags: Mapping[str, str] | None = None,
) -> Config:
    """Merge the sources; raise ConfigError naming the source of the first bad value.

    ``cli_flags``: the flag each setting has on the caller's command line (stages -> --stage), so
    that an error names the flag the user typed."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    sources: dict[str, str] = {name: "default" for name in OPTIONS}

    def apply(name: str, raw: Any, source: str) -> None:
        option = OPTIONS.get(name)
        if option is None:
            raise ConfigError(f"{source}: unknown setting {name!r} (known: {', '.join(OPTIONS)})")
        try:
            values[name] = option.parse(raw)
        except ValueError as exc:
            raise ConfigError(f"{source}: {exc}") from None
        sources[name] = source

    path = (pyproject or find_pyproject(cwd or Path.cwd())) if use_pyproject else None
    if path is not None:
        for key, raw in _read_pyproject_table(path).items():
            if key in SUBTABLES and isinstance(raw, dict):
                continue  # a command's own table ([tool.distdoctor.lint]), read by that command
            apply(_config_key(key), raw, f"{path} [tool.distdoctor] {key}")

    for key, raw in env.items():
        if key.startswith(ENV_PREFIX):
            name = key[len(ENV_PREFIX):].lower()
            if name in OPTIONS:
                apply(name, raw, f"environment variable {key}")

    for name, raw in (cli or {}).items():
        if raw is None or raw == () or raw == []:
            continue
        apply(name, raw, (cli_flags or {}).get(name) or f"--{name.replace('_', '-')}")

    defaults = {name: option.default for name, option in OPTIONS.items()}
    return Config(**{**defaults, **values}, sources=sources)
