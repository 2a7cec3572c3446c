"""How often each cause was behind each failure signature in real public threads (threads.toml), as priors."""

# threads.toml holds labelled public threads: per thread its address, the failure signature its
# posted log shows (a family: store_wait_timeout, nccl_watchdog_timeout, connection_closed ...),
# the cause the thread established, the context cues the log or thread showed (docker,
# multi_node, ib_or_rdma ...), and its part: "dev" or "sealed", drawn from the SHA-256 of the
# address before the thread was read. Only dev threads are counted here; sealed ones are kept to
# measure on (tests/explain/threads_figures.py), never to rank with.
#
# The priors of a family's candidate causes are a Dirichlet posterior mean: the catalog's hand-set
# order (its confidences, normalised) is the prior measure with PSEUDO_THREADS of weight, the dev
# threads' cause counts are the observations,
#     p(cause | family) = (n_cause + PSEUDO_THREADS * q_cause) / (n_family + PSEUDO_THREADS),
# so a family with few threads keeps close to the catalog's order and one with many follows the
# data. A cue's effect is measured over all dev threads (one family has too few threads per cue), but
# against what those threads' own families predict (the threads that show `mp_spawn` are mostly about
# init errors: that must not make rank_missing look rare under mp.spawn):
#     observed(cause | cue) = the threads showing the cue whose cause it was,
#     expected(cause | cue) = the sum over those threads of p(cause | their family) (raw frequencies),
#     lift(cause | cue) = (observed + CUE_PSEUDO) / (expected + CUE_PSEUDO), bounded to [MIN_LIFT, MAX_LIFT];
# a cue seen in the logs multiplies its causes' priors by their lifts before they are normalised
# again. Threads whose cause is "unknown" are kept in the file but counted nowhere.
#
# The prior measure q is not the catalog's order alone: that order was written while reading the dev
# corpus logs, and on logs nobody tuned on it generalised poorly (docs/explain.md, the corpus and its
# figures). It is blended with how often each cause was behind any labelled dev thread, whatever its
# family (the cause's field frequency, counted like the families, +FREQ_PSEUDO each):
#     q(cause) = (1 - FIELD_WEIGHT) * catalog(cause) + FIELD_WEIGHT * field(cause),
# both normalised over the family's candidate causes. A family with fewer than MIN_FAMILY_THREADS
# labelled dev threads keeps the catalog's order, as before. FIELD_WEIGHT was chosen on the dev threads'
# leave-one-out figure (tests/explain/priors_figures.py --part dev: each thread ranked by counts without
# it; 0.25 to 0.75 all give the same figure), never on a sealed figure.

from __future__ import annotations

import tomllib
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field, fields
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

from distdoctor.core.causes import CAUSES
from distdoctor.explain.priors_cache import cached

THREADS_PATH = Path(__file__).with_name("threads.toml")
PSEUDO_THREADS = 8.0
MIN_LIFT, MAX_LIFT = 0.5, 2.5
CUE_PSEUDO = 2.0
# A cue needs this many dev threads showing it before its lifts are used.
MIN_CUE_THREADS = 5
# A family needs this many labelled dev threads before its counts replace the catalog's order (with fewer,
# one thread swings the order).
MIN_FAMILY_THREADS = 5
# How much of the prior measure is the causes' field frequency over all labelled dev threads (the rest is the
# catalog's hand-set order), and the pseudo-count each cause gets in that frequency.
FIELD_WEIGHT = 0.5
FREQ_PSEUDO = 0.5

FAMILIES = (
    "store_wait_timeout", "store_connect_failed", "rendezvous_timeout", "nccl_watchdog_timeout", "gloo_timeout",
    "nccl_system_error", "nccl_internal_error", "nccl_remote_error", "nccl_invalid_usage", "nccl_cuda_error",
    "connection_closed", "connection_refused", "address_in_use", "os_error_in_rank", "killed_signal",
    "terminated_signal", "child_failed_only", "worker_traceback", "cuda_oom", "cuda_error", "ddp_reducer_error",
    "mismatch_error", "init_error", "other_distributed", "crash_signal",
)
CUES = (
    "docker", "kubernetes", "slurm", "multi_node", "single_node", "wsl_or_windows", "ib_or_rdma",
    "nccl_socket_ifname_set", "nccl_debug_shown", "version_mismatch", "rank0_only_work",
    "large_model_or_data_load", "cloud_vm", "virtual_machine", "p2p_disabled_hint", "deepspeed", "accelerate",
    "lightning", "mp_spawn", "torchrun", "mpirun",
)


class ThreadsError(ValueError):
    """threads.toml is inconsistent (raised when it is loaded, i.e. in the tests, never on a user's log)."""


@dataclass(frozen=True)
class Thread:
    url: str
    part: str
    signature: str
    cause: str
    cues: tuple[str, ...] = ()


@dataclass(frozen=True)
class Priors:
    """Counts over the dev threads: per family per cause, per cue per cause, and the totals."""

    family_counts: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    cause_counts: Mapping[str, int] = field(default_factory=dict)
    cue_counts: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    # cue -> cause -> how many of the threads showing the cue their families alone would give that cause.
    cue_expected: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    total: int = 0
    threads: int = 0          # every thread in the file, dev and sealed, labelled or not

    def family_threads(self, family: str) -> int:
        return sum(self.family_counts.get(family, {}).values())

    def prior_measure(self, causes: list[str], base: Mapping[str, float]) -> dict[str, float]:
        """q over `causes`: the catalog's confidences (normalised) blended with the causes' field frequency
        over all labelled dev threads (FIELD_WEIGHT); the catalog's order alone when nothing is counted."""
        weight = sum(max(base.get(c, 0.0), 0.0) for c in causes) or 1.0
        catalog = {c: max(base.get(c, 0.0), 0.0) / weight for c in causes}
        if not self.total:
            return catalog
        field = {c: self.cause_counts.get(c, 0) + FREQ_PSEUDO for c in causes}
        norm = sum(field.values()) or 1.0
        return {c: (1 - FIELD_WEIGHT) * catalog[c] + FIELD_WEIGHT * field[c] / norm for c in causes}

    def posterior(self, family: str, base: Mapping[str, float],
                  min_threads: int = MIN_FAMILY_THREADS) -> dict[str, float] | None:
        """p(cause | family) over the causes of `base` (the catalog's confidences) and those the threads
        add; None when the family has fewer than `min_threads` labelled dev threads (the catalog's order
        stands). (priors_figures.py's leave-one-out passes 0 for a family the shipped counts rank.)"""
        counts = self.family_counts.get(family, {})
        n = sum(counts.values())
        if n < min_threads:
            return None
        causes = list(dict.fromkeys([*base, *sorted(counts, key=lambda c: -counts[c])]))
        q = self.prior_measure(causes, base)
        return {c: (counts.get(c, 0) + PSEUDO_THREADS * q[c]) / (n + PSEUDO_THREADS) for c in causes}

    def lift(self, cue: str, cause: str) -> float | None:
        """How much likelier `cause` is among the dev threads that show `cue` than their own families predict."""
        counts = self.cue_counts.get(cue, {})
        if sum(counts.values()) < MIN_CUE_THREADS:
            return None
        observed = counts.get(cause, 0)
        expected = self.cue_expected.get(cue, {}).get(cause, 0.0)
        return min(MAX_LIFT, max(MIN_LIFT, (observed + CUE_PSEUDO) / (expected + CUE_PSEUDO)))

    def cue_support(self, cue: str, cause: str) -> tuple[int, int]:
        """(dev threads showing the cue whose cause was `cause`, dev threads showing the cue)."""
        counts = self.cue_counts.get(cue, {})
        return counts.get(cause, 0), sum(counts.values())


def parse_threads(raw: Mapping[str, Any]) -> list[Thread]:
    threads = []
    seen: set[str] = set()
    for entry in raw.get("thread", []):
        where = f"thread {entry.get('url', '?')}"
        url = entry.get("url", "")
        if not url:
            raise ThreadsError(f"{where}: no url")
        if url in seen:
            raise ThreadsError(f"{where}: listed twice")
        seen.add(url)
        part, signature, cause = entry.get("part"), entry.get("signature"), entry.get("cause")
        if part not in ("dev", "sealed"):
            raise ThreadsError(f"{where}: part {part!r} is not dev or sealed")
        if signature not in FAMILIES:
            raise ThreadsError(f"{where}: signature {signature!r} is not in the vocabulary")
        if cause not in CAUSES:
            raise ThreadsError(f"{where}: cause {cause!r} is not in docs/causes.md")
        cues = tuple(entry.get("cues", ()))
        unknown = set(cues) - set(CUES)
        if unknown:
            raise ThreadsError(f"{where}: cues outside the vocabulary: {sorted(unknown)}")
        threads.append(Thread(url, part, signature, cause, cues))
    return threads


def count(threads: list[Thread]) -> Priors:
    """The priors' counts: dev threads whose cause is known."""
    family: dict[str, dict[str, int]] = {}
    causes: dict[str, int] = {}
    cues: dict[str, dict[str, int]] = {}
    used = [t for t in threads if t.part == "dev" and t.cause != "unknown"]
    for t in used:
        family.setdefault(t.signature, {}).setdefault(t.cause, 0)
        family[t.signature][t.cause] += 1
        causes[t.cause] = causes.get(t.cause, 0) + 1
        for cue in set(t.cues):
            cues.setdefault(cue, {}).setdefault(t.cause, 0)
            cues[cue][t.cause] += 1
    expected: dict[str, dict[str, float]] = {}
    for t in used:
        counts = family[t.signature]
        n = sum(counts.values())
        for cue in set(t.cues):
            row = expected.setdefault(cue, {})
            for cause, k in counts.items():
                row[cause] = row.get(cause, 0.0) + k / n
    return Priors(family, causes, cues, expected, len(used), len(threads))


@lru_cache(maxsize=1)
def load_priors(path: Path = THREADS_PATH) -> Priors:
    """The dev threads' counts; empty priors (the catalog's order alone) when the file is absent. Kept
    between runs in the user's cache directory (priors_cache: parsing the file is most of a small log's cost)."""
    try:
        raw = path.read_bytes()
    except OSError:
        return Priors()

    def compute() -> dict[str, Any]:
        return asdict(count(parse_threads(tomllib.loads(raw.decode("utf-8")))))

    return Priors(**cached(raw, compute, _valid_counts))


def _valid_counts(counts: Any) -> bool:
    """A cached document that can stand for the counts (anything else is computed again)."""
    def table(value: Any, kind: type) -> bool:
        return isinstance(value, dict) and all(
            isinstance(k, str) and isinstance(row, dict)
            and all(isinstance(c, str) and type(n) in (int, kind) for c, n in row.items()) for k, row in value.items())

    return (isinstance(counts, dict) and set(counts) == {f.name for f in fields(Priors)}
            and table(counts.get("family_counts"), int) and table(counts.get("cue_counts"), int)
            and table(counts.get("cue_expected"), float) and isinstance(counts.get("cause_counts"), dict)
            and all(isinstance(k, str) and type(v) is int for k, v in counts["cause_counts"].items())
            and type(counts.get("total")) is int and type(counts.get("threads")) is int)


# The priors explain ranks with: the shipped dev threads' counts, or (only for the cross-validated figure,
# tests/explain/corpus_figures.py --cross) counts recomputed without the thread of the log being judged.
PRIORS_OVERRIDE: ContextVar["Priors | None"] = ContextVar("priors_override", default=None)


def active_priors() -> Priors:
    """The priors in force: the override when one is set, else the shipped dev threads' counts."""
    override = PRIORS_OVERRIDE.get()
    return load_priors() if override is None else override
