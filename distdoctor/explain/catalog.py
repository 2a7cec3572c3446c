"""Load the signature catalog (catalog.toml) into validated, compiled objects."""

# The catalog is data: adding a signature means adding a TOML table, not code. Loading checks
# everything a typo could break (an unknown kind, a cause outside the vocabulary, a regex that does
# not compile, a template naming a field no pattern extracts) so that a bad catalog fails at import,
# in the tests, rather than at a user's terminal.

from __future__ import annotations

import re
import signal as _signal
import string
import tomllib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Mapping

from distdoctor.core.causes import CAUSES
from distdoctor.core.findings import FindingKind
from distdoctor.core.registry import finding_kind
from distdoctor.explain.priors import CUES as THREAD_CUES, FAMILIES

CATALOG_PATH = Path(__file__).with_name("catalog.toml")
ROLES = ("cause", "crash", "symptom")


class CatalogError(ValueError):
    """The catalog data is inconsistent (raised at load time, never while reading a log)."""


def _signal_name(value: str) -> str:
    if value.startswith("Signals."):
        return value[len("Signals."):]
    try:
        return _signal.Signals(abs(int(value))).name
    except (ValueError, TypeError):
        return f"signal {value}"


def _shape(value: str) -> str:
    """DETAIL prints dims as '2 3', fingerprints as '2, 3': both render as [2, 3]."""
    dims = value.replace(",", " ").split()
    return "[" + ", ".join(dims) + "]"


def _more_joined(value: str) -> str:
    """'world_size=2, worker_count=4' -> 'yes' when more workers joined than the world has."""
    numbers = [int(n) for n in re.findall(r"\d{1,7}", value)[:2]]
    return "yes" if len(numbers) == 2 and numbers[1] > numbers[0] else ""


def _long_wait(value: str) -> str:
    """'1800000ms' / '900s' -> 'yes' when the wait was 10 minutes or more (a process group's timeout,
    not a rendezvous connect's 60 s)."""
    match = re.fullmatch(r"(\d{1,12})(ms|s)", value.strip())
    if match is None:
        return ""
    seconds = int(match.group(1)) / (1000 if match.group(2) == "ms" else 1)
    return "yes" if seconds >= 600 else ""


def _exit_signal(value: str) -> str:
    """An exit code read as the signal that ended the process: a shell's or a container's 128+N (139:
    SIGSEGV), a launcher's -N (-6: SIGABRT), or a signal's name as printed (Segmentation fault)."""
    value = value.strip()
    named = {"segmentation fault": "SIGSEGV", "aborted": "SIGABRT", "illegal instruction": "SIGILL",
             "floating point exception": "SIGFPE", "bus error": "SIGBUS"}
    if value.lower() in named:
        return named[value.lower()]
    if value.lstrip("-").isdigit() and len(value) < 5:
        number = int(value)
        return _signal_name(str(number - 128 if number > 128 else abs(number)))
    return _signal_name(value)


def _barrier_mid_training(fields: dict[str, str]) -> str:
    """A one-element all-reduce (NumelIn=1) or a BARRIER op, past the first collectives after init: what
    barrier() and a metric's reduction issue mid-training (right after init, it is the init's own)."""
    seq = fields.get("seq", "")
    if not (seq.isdigit() and len(seq) < 13 and int(seq) > 2):
        return ""
    return "yes" if fields.get("numel_in") == "1" or fields.get("op", "").upper() == "BARRIER" else ""


# Named transforms a `derive` entry may apply: "src1,src2:transform" (barrier_mid_training reads the
# fields it needs itself).
DERIVATIONS: dict[str, Callable[[str], str]] = {
    "signal": _signal_name,
    "shape": _shape,
    "more_joined": _more_joined,
    "seq_tag": lambda value: f" #{value}",
    "paren": lambda value: f" ({value})",
    "long_wait": _long_wait,
    "barrier_mid_training": _barrier_mid_training,
    # A path in shared memory (/dev/shm, torch's /torch_ segments) or elsewhere (a disk the job writes).
    "in_shm": lambda value: "yes" if "/dev/shm" in value or "torch_" in value else "",
    "not_shm": lambda value: "" if "/dev/shm" in value or "torch_" in value else "yes",
    # A hang in the first collectives after init (where blocked P2P shows) rather than mid-training.
    "first_collectives": lambda value: "yes" if value.isdigit() and len(value) < 4 and int(value) <= 2 else "",
    "exit_signal": lambda value: _exit_signal(value),
    "upper": str.upper,
    # A process group's timeout under a minute: torch's defaults are 10 and 30 minutes.
    "short_timeout": lambda value: "yes" if value.isdigit() and int(value) < 60_000 else "",
    "is_abort": lambda value: "yes" if _exit_signal(value) == "SIGABRT" else "",
}


@dataclass(frozen=True)
class Candidate:
    """One alternative cause of a generic text: how likely, why, and the observation that decides."""

    kind: FindingKind
    confidence: float
    why: str
    tell: str = ""


@dataclass(frozen=True)
class Cue:
    """A line that names no failure itself but makes some candidate causes likelier (or less likely)
    for every generic message in the same logs: an OOM-killer line, an NCCL INFO line naming the
    interface, a loopback address."""

    name: str
    tokens: tuple[str, ...]
    regex: re.Pattern[str]
    boost: Mapping[str, float]
    note: str
    # The context this line shows in threads.toml's cue vocabulary (docker, multi_node ...): its
    # effect on the candidates is measured over the labelled threads (priors.py).
    thread_cue: str = ""


@dataclass(frozen=True)
class Derivation:
    target: str
    sources: tuple[str, ...]
    transform: Callable[[str], str] | None = None

    def apply(self, fields: dict[str, str]) -> None:
        if self.transform is _barrier_mid_training:
            fields.update({self.target: "yes"} if _barrier_mid_training(fields) else {})
            return
        if self.target == "ranks":
            # Ranks named by the message: all of them, not the first.
            named = [fields[s] for s in self.sources if fields.get(s)]
            if named:
                fields["ranks"] = ",".join(named)
            return
        for source in self.sources:
            value = fields.get(source)
            if value:
                derived = self.transform(value) if self.transform else value
                if derived:
                    fields[self.target] = derived
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
    # For a generic text: the observation that confirms the signature's own (first) cause.
    tell: str = ""
    # More patterns searched in the same line, for fields the main pattern cannot reach.
    also: tuple[re.Pattern[str], ...] = ()
    # Candidate boosts that apply when the message itself shows a field: (field, cause, delta, note).
    boost_if: tuple[tuple[str, str, float, str], ...] = ()
    # A warning a healthy job prints while it retries (an IPv6 lookup, a refused connect before the
    # store is up): no failure when the same input shows the job making progress after it.
    transient: bool = False
    # The failure signature in threads.toml's vocabulary (store_wait_timeout, connection_closed ...):
    # its candidates' priors are counted over the labelled threads of that family (priors.py).
    family: str = ""
    # For a rank's error read as a peer's consequence: whether it says the peer was gone (its
    # connection closed), late (a wait timed out) or refused (nothing listened at the address it
    # published). What the silent rank's state is weighed by.
    peer: str = ""
    # A line that says something failed without saying what (NCCL's WARN lines, the watchdog's status
    # lines, a rendezvous that printed its start): it speaks only when nothing else in the logs does,
    # else it is folded under what does as a consequence.
    fallback: bool = False
    # Literal texts that end what this signature says when they come after it in the same input (the
    # agent's "Rendezvous complete for workers" after its rendezvous began): the signature is dropped.
    until: tuple[str, ...] = ()

    @property
    def cause(self) -> str:
        return self.kind.cause

    def extract(self, match: re.Match[str]) -> dict[str, str]:
        """The named groups that matched, plus constant and derived fields."""
        fields = {k: v.strip() for k, v in match.groupdict().items() if v}
        for extra in self.also:
            found = extra.search(match.string)
            if found:
                fields.update({k: v.strip() for k, v in found.groupdict().items() if v and k not in fields})
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
    # token -> the contexts, cues and signatures it may announce (the scanner's fast path)
    token_index: Mapping[str, tuple[Context | Cue | Signature, ...]]
    cues: tuple[Cue, ...] = ()
    # cause -> the observation that tells it apart, for a cause the threads add to a family's candidates.
    tells: Mapping[str, str] = field(default_factory=dict)

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

    contexts = [_parse_context(entry) for entry in raw.get("context", [])]
    signatures: list[Signature] = []
    names: set[str] = set()
    for entry in raw.get("signature", []):
        if entry["name"] in names:
            raise CatalogError(f"signature {entry['name']}: declared twice")
        names.add(entry["name"])
        signatures.append(_parse_signature(entry, kind_of))
    for sig in signatures:
        missing = set(sig.explains) - names
        if missing:
            raise CatalogError(f"signature {sig.name}: explains unknown signatures {sorted(missing)}")

    cues = _parse_cues(raw.get("cue", []))
    index: dict[str, list[Context | Cue | Signature]] = {}
    for item in [*contexts, *cues, *signatures]:
        for token in item.tokens:
            index.setdefault(token, []).append(item)
    tells = {str(k): str(v) for k, v in raw.get("tells", {}).items()}
    unknown = set(tells) - set(CAUSES)
    if unknown:
        raise CatalogError(f"tells: causes outside the vocabulary: {sorted(unknown)}")
    return Catalog(
        kinds=kinds,
        contexts=tuple(contexts),
        signatures=tuple(signatures),
        token_index={t: tuple(items) for t, items in index.items()},
        cues=tuple(cues),
        tells=tells,
    )


def _parse_context(entry: Mapping[str, Any]) -> Context:
    return Context(
        name=entry["name"],
        tokens=tuple(entry["tokens"]),
        regex=_compile(f"context {entry['name']}", entry["pattern"]),
        fields=dict(entry.get("fields", {})),
        reset=tuple(entry.get("reset", ())),
    )


def _parse_derivations(where: str, entry: Mapping[str, Any]) -> tuple[Derivation, ...]:
    derive = []
    for target, spec in entry.get("derive", {}).items():
        sources, _, transform = spec.partition(":")
        if transform and transform not in DERIVATIONS:
            raise CatalogError(f"{where}: unknown derivation {transform!r}")
        derive.append(Derivation(target, tuple(s.strip() for s in sources.split(",")), DERIVATIONS.get(transform)))
    return tuple(derive)


def _parse_signature(entry: Mapping[str, Any], kind_of: Callable[[str, str], FindingKind]) -> Signature:
    where = f"signature {entry['name']}"
    if entry["role"] not in ROLES:
        raise CatalogError(f"{where}: role {entry['role']!r} is not one of {ROLES}")
    confidence = float(entry["confidence"])
    if not 0 < confidence <= 1:
        raise CatalogError(f"{where}: confidence {confidence} is not in (0, 1]")
    if not entry.get("tokens"):
        raise CatalogError(f"{where}: no tokens (every signature needs a cheap prefilter)")
    sig = Signature(
        name=entry["name"],
        kind=kind_of(where, entry["kind"]),
        role=entry["role"],
        tokens=tuple(entry["tokens"]),
        regex=_compile(where, entry["pattern"]),
        confidence=confidence,
        title=entry["title"],
        remediation=entry["remediation"],
        key=tuple(entry.get("key", ())),
        explains=tuple(entry.get("explains", ())),
        candidates=tuple(Candidate(kind_of(where, c["kind"]), float(c["confidence"]), c["why"], c.get("tell", ""))
                         for c in entry.get("candidates", ())),
        tell_apart=entry.get("tell_apart", ""),
        fields=dict(entry.get("fields", {})),
        derive=_parse_derivations(where, entry),
        tell=entry.get("tell", ""),
        also=tuple(_compile(where, p) for p in entry.get("also", ())),
        boost_if=tuple((b["field"], b["cause"], float(b["delta"]), b.get("note", "")) for b in entry.get("boost_if", ())),
        transient=bool(entry.get("transient", False)),
        family=entry.get("family", ""),
        peer=entry.get("peer", ""),
        fallback=bool(entry.get("fallback", False)),
        until=tuple(entry.get("until", ())),
    )
    if sig.family and sig.family not in FAMILIES:
        raise CatalogError(f"{where}: family {sig.family!r} is not in threads.toml's signature vocabulary")
    if sig.peer not in ("", "gone", "late", "refused"):
        raise CatalogError(f"{where}: peer {sig.peer!r} is not gone, late or refused")
    _check_templates(where, sig)
    if sig.candidates and not sig.tell_apart:
        raise CatalogError(f"{where}: candidates without tell_apart (say how to decide between them)")
    _check_candidates(where, sig)
    return sig


def _check_templates(where: str, sig: Signature) -> None:
    """Every field a template or key names is one the patterns, constants or derivations give."""
    known = set(sig.regex.groupindex).union(*(a.groupindex for a in sig.also)) | set(sig.fields) \
        | {d.target for d in sig.derive} | CONTEXT_FIELDS
    texts = [sig.title, sig.remediation, sig.tell_apart, sig.tell] + [c.why for c in sig.candidates] \
        + [c.tell for c in sig.candidates]
    unknown = set().union(*(_template_fields(t) for t in texts)) - known
    if unknown:
        raise CatalogError(f"{where}: templates name fields the pattern never extracts: {sorted(unknown)}")
    if set(sig.key) - known:
        raise CatalogError(f"{where}: key names unknown fields {sorted(set(sig.key) - known)}")


# A generic text names at least this many distinct causes (its own and its candidates').
MIN_GENERIC_CAUSES = 3


def _check_candidates(where: str, sig: Signature) -> None:
    """A generic text lists >= 3 distinct causes, each with the observation that tells it apart."""
    if not sig.candidates:
        return
    causes = [sig.cause] + [c.kind.cause for c in sig.candidates]
    if len(set(causes)) != len(causes):
        raise CatalogError(f"{where}: a cause is listed twice among the candidates")
    if len(causes) < MIN_GENERIC_CAUSES:
        raise CatalogError(f"{where}: a generic text needs at least {MIN_GENERIC_CAUSES} distinct candidate causes")
    if not sig.tell or any(not c.tell for c in sig.candidates):
        raise CatalogError(f"{where}: every candidate needs `tell` (the observation that tells it apart)")


def _parse_cues(entries: list[Mapping[str, Any]]) -> list[Cue]:
    cues = []
    for entry in entries:
        where = f"cue {entry['name']}"
        boost = {str(k): float(v) for k, v in entry.get("boost", {}).items()}
        unknown = set(boost) - set(CAUSES)
        if unknown:
            raise CatalogError(f"{where}: boosts causes outside the vocabulary: {sorted(unknown)}")
        if not entry.get("tokens"):
            raise CatalogError(f"{where}: no tokens")
        thread_cue = entry.get("thread_cue", "")
        if thread_cue and thread_cue not in THREAD_CUES:
            raise CatalogError(f"{where}: thread_cue {thread_cue!r} is not in threads.toml's cue vocabulary")
        cues.append(Cue(entry["name"], tuple(entry["tokens"]), _compile(where, entry["pattern"]), boost,
                        entry.get("note", ""), thread_cue))
    return cues


@lru_cache(maxsize=1)
def load_catalog(path: Path = CATALOG_PATH) -> Catalog:
    with open(path, "rb") as fh:
        return parse_catalog(tomllib.load(fh))


class SafeFields(dict):
    """format_map mapping: a field the log did not show renders as <field> (an optional one,
    named *_opt, as nothing)."""

    def __missing__(self, key: str) -> str:
        return "" if key.endswith("_opt") else f"<{key}>"


def render_template(template: str, fields: Mapping[str, Any]) -> str:
    return template.format_map(SafeFields(fields))
