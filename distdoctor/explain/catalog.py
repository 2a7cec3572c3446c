"""Load the signature catalog (catalog.toml) into validated, compiled objects.

The catalog is data: adding a signature means adding a TOML table, not code. Loading checks
everything a typo could break (an unknown kind, a cause outside the vocabulary, a regex that does
not compile, a template naming a field no pattern extracts) so that a bad catalog fails at import,
in the tests, rather than at a user's terminal.
"""

from __future__ import annotations

import re
import signal as _signal
import string
import tomllib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Mapping

from distdoctor.core.findings import FindingKind
from distdoctor.core.registry import finding_kind

CATALOG_PATH = Path(__file__).with_name("catalog.toml")
ROLES = ("cause", "crash", "symptom")


class CatalogError(ValueError):
    """The catalog data is inconsistent (raised at load time, never while reading a log)."""


def _signal_name(value: str) -> str:
    try:
        return _signal.Signals(abs(int(value))).name
    except (ValueError, TypeError):
        return f"signal {value}"


# Named transforms a `derive` entry may apply: "src1,src2:transform".
DERIVATIONS: dict[str, Callable[[str], str]] = {
    "signal": _signal_name,
}


@dataclass(frozen=True)
class Candidate:
    kind: FindingKind
    confidence: float
    why: str


@dataclass(frozen=True)
class Derivation:
    target: str
    sources: tuple[str, ...]
    transform: Callable[[str], str] | None = None

    def apply(self, fields: dict[str, str]) -> None:
        if self.target == "ranks":
            # Ranks named by the message: all of them, not the first.
            named = [fields[s] for s in self.sources if fields.get(s)]
            if named:
                fields["ranks"] = ",".join(named)
            return
        for source in self.sources:
            value = fields.get(source)
            if value:
                fields[self.target] = self.transform(value) if self.transform else value
                return


@dataclass(frozen=True)
class Context:
    """A line that sets (or clears) file-level context for the lines after it."""

    name: str
    tokens: tuple[str, ...]
    regex: re.Pattern[str]
    fields: Mapping[str, str] = field(default_factory=dict)
    reset: tuple[str, ...] = ()


@dataclass(frozen=True)
class Signature:
    name: str
    kind: FindingKind
    role: str
    tokens: tuple[str, ...]
    regex: re.Pattern[str]
    confidence: float
    title: str
    remediation: str
    key: tuple[str, ...] = ()
    explains: tuple[str, ...] = ()
    candidates: tuple[Candidate, ...] = ()
    tell_apart: str = ""
    fields: Mapping[str, str] = field(default_factory=dict)
    derive: tuple[Derivation, ...] = ()

    @property
    def cause(self) -> str:
        return self.kind.cause

    def extract(self, match: re.Match[str]) -> dict[str, str]:
        """The named groups that matched, plus constant and derived fields."""
        fields = {k: v.strip() for k, v in match.groupdict().items() if v}
        for k, v in self.fields.items():
            fields.setdefault(k, v)
        for derivation in self.derive:
            derivation.apply(fields)
        return fields


@dataclass(frozen=True)
class Catalog:
    kinds: Mapping[str, FindingKind]
    contexts: tuple[Context, ...]
    signatures: tuple[Signature, ...]
    # token -> the contexts and signatures it may announce (the scanner's fast path)
    token_index: Mapping[str, tuple[Context | Signature, ...]]

    def signature(self, name: str) -> Signature:
        for sig in self.signatures:
            if sig.name == name:
                return sig
        raise KeyError(name)


def _template_fields(template: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(template) if name}


# Fields every template may use whatever the pattern: filled from the line's context.
CONTEXT_FIELDS = {"rank", "host", "local_rank", "ifname", "nccl_version", "file", "line"}


def _compile(where: str, pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise CatalogError(f"{where}: pattern does not compile: {exc}") from None


def parse_catalog(raw: Mapping[str, Any], register: Callable[..., FindingKind] = finding_kind) -> Catalog:
    kinds: dict[str, FindingKind] = {}
    for entry in raw.get("kind", []):
        kinds[entry["id"]] = register(entry["id"], cause=entry["cause"], title=entry["title"], hint=entry["hint"])

    def kind_of(where: str, kind_id: str) -> FindingKind:
        if kind_id not in kinds:
            raise CatalogError(f"{where}: kind {kind_id!r} is not declared in the catalog")
        return kinds[kind_id]

    contexts = []
    for entry in raw.get("context", []):
        where = f"context {entry['name']}"
        contexts.append(
            Context(
                name=entry["name"],
                tokens=tuple(entry["tokens"]),
                regex=_compile(where, entry["pattern"]),
                fields=dict(entry.get("fields", {})),
                reset=tuple(entry.get("reset", ())),
            )
        )

    signatures: list[Signature] = []
    names: set[str] = set()
    for entry in raw.get("signature", []):
        where = f"signature {entry['name']}"
        if entry["name"] in names:
            raise CatalogError(f"{where}: declared twice")
        names.add(entry["name"])
        if entry["role"] not in ROLES:
            raise CatalogError(f"{where}: role {entry['role']!r} is not one of {ROLES}")
        confidence = float(entry["confidence"])
        if not 0 < confidence <= 1:
            raise CatalogError(f"{where}: confidence {confidence} is not in (0, 1]")
        if not entry.get("tokens"):
            raise CatalogError(f"{where}: no tokens (every signature needs a cheap prefilter)")
        regex = _compile(where, entry["pattern"])
        derive = []
        for target, spec in entry.get("derive", {}).items():
            sources, _, transform = spec.partition(":")
            if transform and transform not in DERIVATIONS:
                raise CatalogError(f"{where}: unknown derivation {transform!r}")
            derive.append(Derivation(target, tuple(s.strip() for s in sources.split(",")), DERIVATIONS.get(transform)))
        candidates = tuple(
            Candidate(kind_of(where, c["kind"]), float(c["confidence"]), c["why"]) for c in entry.get("candidates", ())
        )
        sig = Signature(
            name=entry["name"],
            kind=kind_of(where, entry["kind"]),
            role=entry["role"],
            tokens=tuple(entry["tokens"]),
            regex=regex,
            confidence=confidence,
            title=entry["title"],
            remediation=entry["remediation"],
            key=tuple(entry.get("key", ())),
            explains=tuple(entry.get("explains", ())),
            candidates=candidates,
            tell_apart=entry.get("tell_apart", ""),
            fields=dict(entry.get("fields", {})),
            derive=tuple(derive),
        )
        known = set(regex.groupindex) | set(sig.fields) | {d.target for d in derive} | CONTEXT_FIELDS
        texts = [sig.title, sig.remediation, sig.tell_apart] + [c.why for c in candidates]
        unknown = set().union(*(_template_fields(t) for t in texts)) - known
        if unknown:
            raise CatalogError(f"{where}: templates name fields the pattern never extracts: {sorted(unknown)}")
        if set(sig.key) - known:
            raise CatalogError(f"{where}: key names unknown fields {sorted(set(sig.key) - known)}")
        if candidates and not sig.tell_apart:
            raise CatalogError(f"{where}: candidates without tell_apart (say how to decide between them)")
        signatures.append(sig)

    for sig in signatures:
        missing = set(sig.explains) - names
        if missing:
            raise CatalogError(f"signature {sig.name}: explains unknown signatures {sorted(missing)}")

    index: dict[str, list[Context | Signature]] = {}
    for item in [*contexts, *signatures]:
        for token in item.tokens:
            index.setdefault(token, []).append(item)
    return Catalog(
        kinds=kinds,
        contexts=tuple(contexts),
        signatures=tuple(signatures),
        token_index={t: tuple(items) for t, items in index.items()},
    )


@lru_cache(maxsize=1)
def load_catalog(path: Path = CATALOG_PATH) -> Catalog:
    with open(path, "rb") as fh:
        return parse_catalog(tomllib.load(fh))


class SafeFields(dict):
    """format_map mapping: a field the log did not show renders as <field>."""

    def __missing__(self, key: str) -> str:
        return f"<{key}>"


def render_template(template: str, fields: Mapping[str, Any]) -> str:
    return template.format_map(SafeFields(fields))
