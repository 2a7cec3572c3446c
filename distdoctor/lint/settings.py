"""Lint settings: command line over [tool.distdoctor.lint] in pyproject.toml over defaults."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Iterable, Mapping

from distdoctor.core.config import find_pyproject
from distdoctor.core.findings import Severity

KEYS = ("select", "ignore", "exclude", "fail-level")


class LintSettingsError(ValueError):
    """A lint setting is unusable; the message names where it came from."""


@dataclass(frozen=True)
class LintSettings:
    select: tuple[str, ...] = ("lint.*",)
    ignore: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    fail_level: Severity = Severity.ERROR

    def wants(self, finding_id: str) -> bool:
        return matches(finding_id, self.select) and not matches(finding_id, self.ignore)


def matches(finding_id: str, patterns: Iterable[str]) -> bool:
    """`lint.W003`, a glob (`lint.W*`) or a prefix (`lint.W`, `lint.E00`)."""
    return any(fnmatchcase(finding_id, p) or finding_id.startswith(p) for p in patterns)


def check_patterns(patterns: Iterable[str], known: Iterable[str], source: str) -> tuple[str, ...]:
    known = list(known)
    out = []
    for pattern in patterns:
        pattern = pattern.strip()
        if not pattern:
            continue
        if not any(matches(k, [pattern]) for k in known):
            raise LintSettingsError(f"{source}: {pattern!r} matches no lint rule (see distdoctor list)")
        out.append(pattern)
    return tuple(out)


def _as_list(value: Any, source: str) -> list[str]:
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return [p.strip() for v in value for p in v.split(",") if p.strip()]
    raise LintSettingsError(f"{source}: expected a string or a list of strings, got {value!r}")


def read_table(pyproject: Path) -> Mapping[str, Any]:
    try:
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise LintSettingsError(f"{pyproject}: cannot be read as TOML ({exc})") from None
    table = data.get("tool", {}).get("distdoctor", {}).get("lint", {}) if isinstance(data.get("tool"), dict) else {}
    if not isinstance(table, dict):
        raise LintSettingsError(f"{pyproject}: [tool.distdoctor.lint] must be a table")
    return table


def load_settings(known_ids: Iterable[str], *, cli: Mapping[str, Any] | None = None, cwd: Path | None = None,
                  pyproject: Path | None = None) -> LintSettings:
    known_ids = list(known_ids)
    values: dict[str, Any] = {}
    path = pyproject or find_pyproject(cwd or Path.cwd())
    if path is not None:
        for key, raw in read_table(path).items():
            source = f"{path} [tool.distdoctor.lint] {key}"
            if key.replace("_", "-") not in KEYS:
                raise LintSettingsError(f"{source}: unknown setting (known: {', '.join(KEYS)})")
            values[key.replace("_", "-")] = (raw, source)
    for key, raw in (cli or {}).items():
        if raw not in (None, [], ()):
            values[key.replace("_", "-")] = (raw, f"--{key.replace('_', '-')}")
    return _parse(values, known_ids)


def _parse(values: Mapping[str, tuple[Any, str]], known_ids: list[str]) -> LintSettings:
    out: dict[str, Any] = {}
    for key in ("select", "ignore"):
        if key in values:
            raw, source = values[key]
            out[key] = check_patterns(_as_list(raw, source), known_ids, source)
    if "exclude" in values:
        raw, source = values["exclude"]
        out["exclude"] = tuple(_as_list(raw, source))
    if "fail-level" in values:
        raw, source = values["fail-level"]
        try:
            out["fail_level"] = Severity.parse(raw)
        except ValueError as exc:
            raise LintSettingsError(f"{source}: {exc}") from None
    return LintSettings(**out)
