"""Match the catalog against text blocks: tokens first (whole-block str.find), regexes on hits only."""

# Most lines of a training log say nothing about a failure. Instead of testing every line against
# every signature, each catalog token is searched in the whole block with str.find (C speed), and
# only the lines a token lands on are split out and matched against the regexes that token
# announces. Matches become Observations, folded into an Accumulator of bounded size.

from __future__ import annotations

import heapq
import re
from dataclasses import dataclass, field
from typing import Any, Iterable

from distdoctor.explain.attempts import Marks
from distdoctor.explain.catalog import Catalog, Context, Cue, Signature
from distdoctor.explain.presence import PRESENCE_ONLY, BlockWords
from distdoctor.explain.ranks import RankCollector, split_prefix
from distdoctor.explain.reader import LogSource, iter_blocks
from distdoctor.explain.sanitize import clean_quote, strip_controls

MAX_EVIDENCE = 5  # quoted lines kept per group (the first ones: the start of a failure matters)
MAX_RANK_CLAIMS = 8192  # launcher announcements of a rank kept (two per rank of a 4,096-rank job)
MAX_GROUPS = 512  # distinct (signature, key) groups; beyond it, occurrences are only counted
MAX_LINE_CHARS = 400  # evidence lines are quoted up to this length
RELEVANT_LINES = 8  # lines kept for the "nothing matched" answer
# A regex sees at most this many characters around the token that announced it, so a pattern's
# work per line is bounded whatever the line's length (a 200 kB line of hex is not a message).
WINDOW_BEFORE = 1024
WINDOW_AFTER = 2048
CUE_LINES_PER_BLOCK = 8  # lines a cue-only token is tried on per block (it counts once anyway)
MAX_FIELD_CHARS = 200  # an extracted field longer than this is cut (a 5000-digit "rank")
MAX_RANK_DIGITS = 7  # ranks are < 10 million; a longer number is not a rank

_RANK_NUMBER = re.compile(r"(?<!\d)\d{1,7}(?!\d)")
# NCCL's own lines start with host:pid:tid [cuda device].
_NCCL_PREFIX = re.compile(r"^(?P<host>[\w.-]+):(?P<pid>\d+):\d+ \[(?P<cuda_device>\d+)\] ")
_GLOG_TIME = re.compile(r"(?:^|\]:?\[?)[EWIF](\d{3,4}) (\d\d:\d\d:\d\d(?:\.\d+)?)")
_ISO_TIME = re.compile(r"\d{4}-(\d\d)-(\d\d)[ T_](\d\d:\d\d:\d\d)(?:[.,](\d+))?")

# Words that make a line look relevant when no signature matches, with their weight. They are
# searched in the lower-cased block: one pass per word whatever its capitalisation.
RELEVANCE_TOKENS: dict[str, int] = {
    "error": 2, "exception": 2, "failed": 2, "timeout": 2, "timed out": 2, "killed": 2, "fatal": 3,
    "warn": 1, "abort": 2, "segmentation fault": 3, "traceback": 1,
}
_EXCEPTION_LINE = re.compile(r"^(?:\[rank\d+\]: )?[A-Za-z_][\w.]*(?:Error|Exception|Interrupt)\b:?")


def small_int(value: str | None) -> int | None:
    """A rank-sized decimal number, or None (a 5000-digit or non-ASCII "number" is not a rank)."""
    if value and value.isascii() and value.isdigit() and len(value) <= MAX_RANK_DIGITS:
        return int(value)
    return None


def quote_line(text: str, span: tuple[int, int] | None = None) -> str:
    """The line as explain may show it: cut around the match, control sequences and secrets removed."""
    return clean_quote(_cut_line(text, span))


def _cut_line(text: str, span: tuple[int, int] | None = None) -> str:
    """The line, or for a long one its start and the part around the match (what it is about)."""
    if len(text) <= MAX_LINE_CHARS:
        return text
    if span is None or span[1] <= MAX_LINE_CHARS - 20:
        return text[:MAX_LINE_CHARS] + " …"
    head = text[:120]
    if span[1] - span[0] > MAX_LINE_CHARS - 140:
        # A long match (two fingerprints of DETAIL's message): its end is what tells it apart.
        start = max(120, span[1] - (MAX_LINE_CHARS - 140))
        return head + " … " + text[start:span[1]] + (" …" if span[1] < len(text) else "")
    start = max(120, span[0] - 60)
    return head + " … " + text[start:start + MAX_LINE_CHARS - 120] + (" …" if start + MAX_LINE_CHARS - 120 < len(text) else "")


def time_key(text: str, fallback: str | None = None) -> str | None:
    """A sortable 'MMDD HH:MM:SS.ffffff' from a glog or ISO timestamp in the line, if any."""
    m = _GLOG_TIME.search(text[:80])
    if m:
        return f"{m.group(1).zfill(4)} {m.group(2)}"
    m = _ISO_TIME.search(text[:80])
    if m:
        frac = f".{m.group(4)}" if m.group(4) else ""
        return f"{m.group(1)}{m.group(2)} {m.group(3)}{frac}"
    if fallback:
        m = _ISO_TIME.search(fallback)
        if m:
            return f"{m.group(1)}{m.group(2)} {m.group(3)}"
    return None


@dataclass
class Observation:
    signature: Signature
    fields: dict[str, str]
    rank: int | None
    host: str | None
    file: str
    line: int
    text: str
    time: str | None
    source_index: int


@dataclass
class Group:
    """All occurrences of one signature with one key, across files and ranks."""

    signature: Signature
    key: tuple[str, ...]
    fields: dict[str, str]
    first: Observation
    count: int = 0
    ranks: set[int] = field(default_factory=set)
    hosts: set[str] = field(default_factory=set)
    files: dict[str, int] = field(default_factory=dict)
    evidence: list[dict[str, Any]] = field(default_factory=list)
    first_time: str | None = None
    flagged_first_failure: bool = False
    last_at: dict[int, int] = field(default_factory=dict)  # input index -> its last line with this match

    @property
    def order(self) -> tuple:
        """When it was first seen: by timestamp where the log has one, else by position."""
        return (self.first_time or "~", self.first.source_index, self.first.line)

    def add(self, obs: Observation) -> None:
        self.count += 1
        rank_list = _ranks_of(obs)
        self.ranks.update(rank_list)
        if obs.host:
            self.hosts.add(obs.host)
        self.files[obs.file] = self.files.get(obs.file, 0) + 1
        self.last_at[obs.source_index] = max(self.last_at.get(obs.source_index, 0), obs.line)
        for k, v in obs.fields.items():
            self.fields.setdefault(k, v)
        if obs.time and (self.first_time is None or obs.time < self.first_time):
            self.first_time = obs.time
        if obs.fields.get("first_failure"):
            self.flagged_first_failure = True
        if len(self.evidence) < MAX_EVIDENCE:
            entry: dict[str, Any] = {"file": obs.file, "line": obs.line, "text": obs.text}
            if obs.rank is not None:
                entry["rank"] = obs.rank
            self.evidence.append(entry)


def _ranks_of(obs: Observation) -> list[int]:
    """The ranks an observation is about: ranks the message names, else the rank that printed it."""
    named = obs.fields.get("ranks")
    if named:
        return [int(r) for r in _RANK_NUMBER.findall(named)]
    return [obs.rank] if obs.rank is not None else []


@dataclass
class Accumulator:
    """Bounded summary of a scan: groups of matches, relevant lines, ranks seen, line counts."""

    groups: dict[tuple, Group] = field(default_factory=dict)
    overflow: int = 0
    relevant: list[tuple[int, int, int, str, str]] = field(default_factory=list)  # heap
    ranks_seen: set[int] = field(default_factory=set)
    hosts_seen: set[str] = field(default_factory=set)
    # Ranks whose own log (a per-rank file) holds no error-looking line at all: they stopped
    # without a word, which a Python exception never does.
    quiet_ranks: set[int] = field(default_factory=set)
    # Per-rank logs that are empty: the rank printed nothing at all (hung or killed early).
    empty_ranks: set[int] = field(default_factory=set)
    empty_files: list[str] = field(default_factory=list)
    empty_file_ranks: dict[str, int] = field(default_factory=dict)  # an empty per-rank file -> its rank
    # The output showed the job at work (progress bars, steps, losses): set before findings are made.
    progress_seen: bool = False
    # Cue name -> (occurrences, first evidence line).
    cues: dict[str, list] = field(default_factory=dict)
    # distdoctor's own JSON reports found among the inputs: (file, parsed report).
    own_reports: list[tuple[str, dict]] = field(default_factory=list)
    # NCCL versions the logs' INFO lines name (two of them: ranks or nodes run different NCCL builds).
    nccl_versions: set[str] = field(default_factory=set)
    # Signature name -> input index -> the last line of a text that ends what it says (its `until`).
    ended: dict[str, dict[int, int]] = field(default_factory=dict)
    # Why the logs show a job on one host ("" when they do not): no network between hosts to blame.
    one_host: str = ""
    # A launcher's announcement of each process's global rank: (input, line, rank, world size), bounded.
    rank_claims: list[tuple[int, int, int, int]] = field(default_factory=list)

    def add_cue(self, cue: Cue, evidence: dict[str, Any]) -> None:
        entry = self.cues.get(cue.name)
        if entry is None:
            self.cues[cue.name] = [1, evidence]
        else:
            entry[0] += 1

    def add(self, obs: Observation) -> None:
        sig = obs.signature
        key = (sig.name, tuple(obs.fields.get(k, "") for k in sig.key))
        group = self.groups.get(key)
        if group is None:
            if len(self.groups) >= MAX_GROUPS:
                self.overflow += 1
                return
            group = self.groups[key] = Group(signature=sig, key=key[1], fields={}, first=obs)
        group.add(obs)

    def add_relevant(self, score: int, source_index: int, line: int, file: str, text: str) -> None:
        # Highest score wins; among equals the later line (a failure is near the end of a log).
        item = (score, source_index, line, file, text)
        if len(self.relevant) < RELEVANT_LINES:
            heapq.heappush(self.relevant, item)
        elif item > self.relevant[0]:
            heapq.heapreplace(self.relevant, item)


_SEARCHED: dict[int, tuple[Catalog, list]] = {}


def search_tokens(catalog: Catalog) -> list[tuple[str, tuple]]:
    """search_tokens_of, worked out once per catalog (it is quadratic in the tokens: ~30 ms each time)."""
    cached = _SEARCHED.get(id(catalog))
    if cached is None or cached[0] is not catalog:
        cached = _SEARCHED[id(catalog)] = (catalog, _search_tokens_of(catalog))
    return cached[1]


def _search_tokens_of(catalog: Catalog) -> list[tuple[str, tuple]]:
    """The tokens to search, each with the catalog items it may announce.

    A token that contains another ('exitcode  : -9' contains 'exitcode  : -') is not searched on
    its own: the shorter one finds every line the longer one would, and the regexes decide. A token
    that only cues announce is never the shorter one: a cue counts once and its tokens stop being
    searched when it was seen, which a signature's longer token folded into it would undo (every
    'NCCL INFO' line of a chatty log matched against NCCL's INFO signatures).
    """
    tokens = list(catalog.token_index)
    cue_only = {t for t, items in catalog.token_index.items() if _cue_only(items)}
    folds = [t for t in tokens if t not in cue_only]
    searched: dict[str, list] = {t: [] for t in tokens
                                 if not any(o != t and o in t for o in (folds if t not in cue_only else ()))}
    for token, items in catalog.token_index.items():
        for short in searched:
            if short in token and (short == token or short not in cue_only):
                searched[short].extend(i for i in items if i not in searched[short])
                break
    return [(t, tuple(items)) for t, items in searched.items()]


class Scanner:
    def __init__(self, catalog: Catalog, accumulator: Accumulator | None = None,
                 ranks: RankCollector | None = None, marks: dict[int, Marks] | None = None) -> None:
        self.catalog = catalog
        # Per input, where torchelastic's attempts start (None: not looked for, e.g. within one attempt).
        self.marks = marks
        self.acc = accumulator or Accumulator()
        self.ranks = ranks
        self._rank_noticed: dict[int, int] = {}
        tokens = [(t, items, _cue_only(items)) for t, items in search_tokens(catalog)]
        # Where the job ran (docker, SLURM, IB, the launcher ...) is read from a sample of each block:
        # those lines repeat, and a few dozen such tokens over whole blocks would cost a third of the scan.
        self._context = [t for t in tokens if t[2] and all(_context_cue(i) for i in t[1])]
        tokens = [t for t in tokens if t not in self._context]
        # Tokens that contain a relevance word are tried only on the lines that word is on (the
        # relevance pass finds them anyway): one block pass fewer per such token.
        self._gated: dict[str, list] = {}
        self._tokens = []
        for entry in tokens:
            word = next((w for w in GATE_WORDS if w in entry[0].lower()), None)
            if word is None:
                self._tokens.append(entry)
            else:
                self._gated.setdefault(word, []).append(entry)
        self._cues_dropped = 0
        self._relevance = list(RELEVANCE_TOKENS.items()) + [(w, 0) for w in GATE_ONLY if w in self._gated]
        self._tracked = tuple(w for w, _ in self._relevance) + PRESENCE_ONLY
        self._until = [(sig.name, token) for sig in catalog.signatures for token in sig.until]

    def scan(self, source: LogSource, source_index: int) -> int:
        """Scan one input; return how many lines in it matched a signature or looked like an error."""
        context: dict[str, str] = {}
        self._noticed = 0
        if self.ranks is not None:
            self.ranks.start_source()
        marks = self.marks.setdefault(source_index, Marks()) if self.marks is not None else None
        for block, first_line in iter_blocks(source):
            words = self._scan_block(block, first_line, source, source_index, context)
            if marks is not None:
                marks.block(block, first_line, words)
            self._mark_ends(block, first_line, source_index)
            if self.ranks is not None:
                self.ranks.block(block, first_line, source.name, source_index, source.rank_hint, words)
            self._drop_seen_cues()
        if self.ranks is not None:
            self.ranks.end_source()
        if source.rank_hint is not None:
            self.acc.ranks_seen.add(source.rank_hint)
            # A rank's stdout.log says nothing of errors, its stderr.log does: quiet is per rank, over its files.
            self._rank_noticed[source.rank_hint] = self._rank_noticed.get(source.rank_hint, 0) + self._noticed
            if self._rank_noticed[source.rank_hint] == 0:
                self.acc.quiet_ranks.add(source.rank_hint)
            else:
                self.acc.quiet_ranks.discard(source.rank_hint)
        return self._noticed

    def _mark_ends(self, block: str, first_line: int, source_index: int) -> None:
        """Where a text that ends a signature's reading was last seen in this input (one rfind per text),
        searched once the signature itself was seen (its start comes first)."""
        seen = {g.signature.name for g in self.acc.groups.values()} if self._until else set()
        for name, token in self._until:
            if name not in seen:
                continue
            pos = block.rfind(token)
            if pos != -1:
                self.acc.ended.setdefault(name, {})[source_index] = first_line + block.count("\n", 0, pos)

    def _drop_seen_cues(self) -> None:
        """A cue counts once: its tokens stop being searched after it was seen (NCCL INFO chatter
        repeats them on every line). The lists are rebuilt only when a new cue was seen."""
        if len(self.acc.cues) == self._cues_dropped:
            return
        self._cues_dropped = len(self.acc.cues)
        self._tokens = _without_seen_cues(self._tokens, self.acc.cues)
        self._context = _without_seen_cues(self._context, self.acc.cues)
        self._gated = {w: _without_seen_cues(t, self.acc.cues) for w, t in self._gated.items()}

    def _scan_block(self, block: str, first_line: int, source: LogSource, source_index: int,
                    context: dict) -> BlockWords | None:
        """The block's observations into the accumulator; the words it holds (None: not known, search the plain way)."""
        hits: dict[int, list] = {}
        _find_tokens(block, self._tokens, hits)
        if self._context:
            _find_tokens(block[:CONTEXT_SAMPLE], self._context, hits)
        lower = block.lower()
        relevance: dict[int, int] = {}
        word_lines: dict[str, list[int]] = {}
        words = None
        if len(lower) == len(block):
            found = _find_relevance(block, lower, self._relevance, relevance, word_lines)
            _find_gated(block, self._gated, word_lines, hits)
            found.update(w for w in PRESENCE_ONLY if w in lower)
            words = BlockWords(found, self._tracked)
        else:
            # lower() changed the length of some non-ASCII text, so positions would not align:
            # search this block the plain way.
            _find_relevance(block, block, self._relevance, relevance, word_lines)
            _find_tokens(block, [t for toks in self._gated.values() for t in toks], hits)
        if not hits and not relevance:
            return words
        line_no, pos = first_line, 0
        self._noticed += len(relevance)
        find = block.find
        for start in sorted(hits.keys() | _worth_reading(relevance)):
            line_no += block.count("\n", pos, start)
            pos = start
            end = find("\n", start)
            text = block[start:end if end != -1 else len(block)].rstrip("\r")
            if start in hits:
                self._match_line(text, line_no, hits[start], source, source_index, context,
                                 follow=lambda end=end: _next_line(block, end))
            if start in relevance and relevance[start]:
                raised = _EXCEPTION_LINE.match(text)
                score = relevance[start] + (2 if raised else 0)
                if raised and self.ranks is not None:
                    # A traceback cut above its header (a pasted excerpt) still names what the rank raised.
                    self.ranks.bare_exception(text, line_no, source.name, source_index, source.rank_hint)
                # Cut now (bounded memory), clean only the few kept (cleaning every warning line costs).
                self.acc.add_relevant(score, source_index, line_no, source.name, _cut_line(text))
        return words

    def _match_line(self, line: str, line_no: int, items: Iterable, source: LogSource, source_index: int,
                    context: dict, follow=None) -> None:
        seen: set[int] = set()
        line_rank: int | None = None
        line_host: str | None = None
        head = strip_controls(line[:256])
        line_rank, rest = split_prefix(head)
        if line_rank is not None:
            self.acc.ranks_seen.add(line_rank)
        nccl = _NCCL_PREFIX.match(rest)
        if nccl:
            line_host = clean_quote(nccl.group("host")[:MAX_FIELD_CHARS])
        for item, offset in items:
            if id(item) in seen:
                continue
            seen.add(id(item))
            text = strip_controls(_window(line, offset))
            match = item.regex.search(text)
            if match is None and follow is not None and isinstance(item, Signature):
                text, match = _wrapped(text, follow(), item.regex)
            if match is None:
                continue
            if isinstance(item, Context):
                if item.name == "rank_claim":
                    if len(self.acc.rank_claims) < MAX_RANK_CLAIMS:
                        self.acc.rank_claims.append((source_index, line_no, int(match["claim_rank"]),
                                                     int(match["claim_world"])))
                    continue
                self._set_context(item, match, context)
                continue
            if isinstance(item, Cue):
                if item.name in self.acc.cues:
                    self.acc.cues[item.name][0] += 1  # counted; its first line is the one quoted
                else:
                    self.acc.add_cue(item, {"file": source.name, "line": line_no, "text": quote_line(text, match.span())})
                continue
            sig: Signature = item
            self._noticed += 1
            # Fields reach titles and remediations: they are cleaned like quotes (secrets, controls).
            fields = {k: clean_quote(v[:MAX_FIELD_CHARS]) for k, v in sig.extract(match).items()}
            rank = line_rank
            if rank is None:
                rank = small_int(context.get("rank"))
            if rank is None:
                rank = source.rank_hint
            if fields.get("rank") and small_int(fields["rank"]) is not None:
                rank = small_int(fields["rank"])
            for name in ("host", "local_rank", "ifname", "nccl_version", "first_failure", "summary_time"):
                if name in context and name not in fields:
                    fields[name] = context[name]
            self.acc.add(
                Observation(
                    signature=sig,
                    fields=fields,
                    rank=rank,
                    host=line_host or context.get("host"),
                    file=source.name,
                    line=line_no,
                    text=quote_line(text, match.span()),
                    time=time_key(text, context.get("summary_time")),
                    source_index=source_index,
                )
            )

    def _set_context(self, item: Context, match: re.Match[str], context: dict) -> None:
        for name in item.reset:
            context.pop(name, None)
        context.update({k: clean_quote(v[:MAX_FIELD_CHARS]) for k, v in match.groupdict().items() if v})
        context.update(item.fields)
        rank = small_int(context.get("rank"))
        if rank is None:
            context.pop("rank", None)
        else:
            self.acc.ranks_seen.add(rank)
        if "host" in context:
            self.acc.hosts_seen.add(context["host"])
        if item.name == "nccl_version" and len(self.acc.nccl_versions) < 16:
            self.acc.nccl_versions.add(context.get("nccl_version", ""))


GATE_WORDS = ("error", "exception", "failed", "timed out", "timeout", "killed", "fatal", "abort", "segmentation fault",
              "exit", "memory", "nccl", "cuda", "connect", "signal", "socket", "device", "peer", "missing",
              "libuv", "p2p", "gpu", "traceback", "tensor", "expected")
# Gate words that are not relevance words: their lines are collected for the gated tokens only (one
# lower-case pass per word instead of one pass per token it gates; words that healthy chatter rarely has).
GATE_ONLY = {"exit": 0, "memory": 0, "nccl": 0, "cuda": 0, "connect": 0, "signal": 0, "socket": 0, "device": 0,
             "peer": 0, "missing": 0, "libuv": 0, "p2p": 0, "gpu": 0, "tensor": 0, "expected": 0}
# Relevance words whose every line is not needed (they gate no token): only the last few lines of a
# block can be kept, so they are searched backwards from its end.
TAIL_ONLY = ("warn",)


def _find_tokens(block: str, tokens: list, hits: dict[int, list]) -> None:
    find = block.find
    for token, items, cue_only in tokens:
        i = find(token)
        budget = CUE_LINES_PER_BLOCK if cue_only else -1
        while i != -1 and budget != 0:
            start = block.rfind("\n", 0, i) + 1
            hits.setdefault(start, []).extend((item, i - start) for item in items)
            budget -= 1  # a cue counts once: a few candidate lines per block are enough
            end = find("\n", i)
            i = find(token, end) if end != -1 else -1


def _find_relevance(block: str, lower: str, words: list[tuple[str, int]], relevance: dict[int, int],
                    word_lines: dict[str, list[int]]) -> set[str]:
    """The lines holding each word: weighed into ``relevance``, or kept in ``word_lines``; the words found."""
    find, lfind = block.find, lower.find
    found: set[str] = set()
    for word, weight in words:
        if word in TAIL_ONLY:
            if _find_last(block, lower, word, weight, relevance):
                found.add(word)
            continue
        lines = word_lines.setdefault(word, [])
        i = lfind(word)
        if i != -1:
            found.add(word)
        while i != -1:
            start = block.rfind("\n", 0, i) + 1
            if weight:
                relevance[start] = relevance.get(start, 0) + weight
            elif len(lines) > GATED_LINES_PER_BLOCK:
                # A gate word on this many lines (NCCL INFO chatter): its tokens are searched in the whole
                # block (_find_gated), so its remaining lines need not be collected.
                break
            lines.append(start)
            end = find("\n", i)
            i = lfind(word, end) if end != -1 else -1
    return found


def _find_last(block: str, lower: str, word: str, weight: int, relevance: dict[int, int]) -> bool:
    """The last RELEVANT_LINES lines holding a word, found from the block's end; whether there was one."""
    end, found = len(lower), 0
    while found < RELEVANT_LINES:
        i = lower.rfind(word, 0, end)
        if i == -1:
            break
        start = block.rfind("\n", 0, i) + 1
        relevance[start] = relevance.get(start, 0) + weight
        found += 1
        end = start
    return found > 0


# Past this many lines holding a gate word in one block (NCCL INFO chatter), searching its tokens in the
# whole block is cheaper than trying each on every such line.
GATED_LINES_PER_BLOCK = 256


def _find_gated(block: str, gated: dict[str, list], word_lines: dict[str, list[int]], hits: dict[int, list]) -> None:
    find = block.find
    for word, tokens in gated.items():
        starts = word_lines.get(word, ())
        if len(starts) > GATED_LINES_PER_BLOCK:
            _find_tokens(block, tokens, hits)
            continue
        for start in starts:
            end = find("\n", start)
            line = block[start:end if end != -1 else len(block)]
            for token, items, _ in tokens:
                j = line.find(token)
                if j != -1:
                    hits.setdefault(start, []).extend((item, j) for item in items)


def _worth_reading(relevance: dict[int, int]) -> set[int]:
    """The relevant lines to read: every one with an error word (it may be an exception), and of those
    with a lesser word ("warn") only the last few, which are all the kept ones can gain from a block."""
    strong = {start for start, score in relevance.items() if score >= 2}
    weak = [start for start, score in relevance.items() if 0 < score < 2]
    return strong | set(sorted(weak)[-RELEVANT_LINES:]) if len(weak) > RELEVANT_LINES else strong | set(weak)


# A line a terminal or a paste wrapped is long: shorter ones are not joined with the next.
MIN_WRAPPED_CHARS = 60


def _next_line(block: str, end: int) -> str:
    """The line after the one ending at `end` (a terminal's wrap continues a message there)."""
    if end == -1 or end + 1 >= len(block):
        return ""
    stop = block.find("\n", end + 1)
    return block[end + 1:stop if stop != -1 else len(block)][:WINDOW_AFTER].rstrip("\r")


def _wrapped(text: str, following: str, regex: re.Pattern[str]) -> tuple[str, re.Match[str] | None]:
    """The message read across a wrapped line: this line and the next one joined (a terminal splits
    anywhere, a paste at a space); the next line's own rank prefix, if any, dropped."""
    _, rest = split_prefix(following)
    rest = strip_controls(rest)
    if not rest.strip() or len(text.rstrip()) < MIN_WRAPPED_CHARS:
        return text, None  # a short line ended where its writer ended it
    for joined in (text + rest, text.rstrip() + " " + rest.lstrip()):
        match = regex.search(joined)
        if match is not None:
            return joined, match
    return text, None


def _without_seen_cues(tokens: list, seen: dict) -> list:
    kept = []
    for token, items, _ in tokens:
        items = tuple(i for i in items if not (isinstance(i, Cue) and i.name in seen))
        if items:
            kept.append((token, items, _cue_only(items)))
    return kept


CONTEXT_SAMPLE = 16 << 10  # characters of each block searched for context cues


def _context_cue(item) -> bool:
    """A cue that says where the job ran or what ran it (threads.toml's vocabulary, torch.distributed at
    all), not what failed: the catalog names them ctx_*."""
    return isinstance(item, Cue) and item.name.startswith("ctx_")


def _cue_only(items: tuple) -> bool:
    return all(isinstance(i, Cue) for i in items)


def _window(line: str, offset: int) -> str:
    """The part of a long line a regex may look at: around the token that announced the pattern."""
    if len(line) <= WINDOW_BEFORE + WINDOW_AFTER:
        return line
    return line[max(0, offset - WINDOW_BEFORE):offset + WINDOW_AFTER]
