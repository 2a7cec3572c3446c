"""Where a rank's time goes that its peers' does not: the call a user recognises, where the ranks' stacks part."""

# Two uses, one rule. A stall: the late rank's stack against a waiting rank's, outermost first; the
# first frame of the user's code where they differ is the call that made it late (`estimate_loss()`
# at train.py:264 for a rank-0-only evaluation, not the innermost model.py:89 the sample happened
# to catch). A slow rank: its profile against its peers', per step; frames that every rank spends
# nearly all its time under (the script's `<module>`, a `main()`) are common ground and are opened,
# the first level below them where the slow rank's time is not the peers' is said, one row per call
# that holds a share of the extra time, with the innermost line under it for context. Where the ranks'
# waits for their peers were sampled, common ground is also a frame they wait under (it encloses the
# step): a call that holds no wait, `next(loader)` at 94 % of every rank's time outside its waits on a
# fast machine, is a call of the step and is named, not opened to the line inside it.

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from distdoctor.diagnosis.frames import is_user_file
from distdoctor.diagnosis.pace import Frame4, RankPace

COMMON = 0.9          # a frame both sides spend this share of their time under is common ground
MIN_ROW_SHARE = 0.1   # a row holds at least this share of the extra time
MAX_ROWS = 5
MIN_SAMPLES = 4
ONLY_HERE = 0.05      # the peers' time under a call below this share of the slow rank's: only it runs it
# ... said only from this many of the slow rank's samples there: the peers are sampled as often, so had they spent a
# third of its time there they would have about 4 samples of it, and none in 2 % of runs (nanoGPT's
# clip_grad_norm_, which every rank runs, was said run by the slow rank only, at 0.8 ms a step).
ONLY_HERE_SAMPLES = 12


def parting_frame(late: Sequence[Any], peer: Sequence[Any]) -> Any:
    """The late stack's frame (innermost-last stacks of diagnosis.snapshot.Frame) where it parts from
    the peer's: the outermost frame of the user's code that differs; None without user frames."""
    mine = [f for f in late if is_user_file(getattr(f, "file", ""))]
    theirs = [f for f in peer if is_user_file(getattr(f, "file", ""))]
    for index, frame in enumerate(mine):
        other = theirs[index] if index < len(theirs) else None
        if other is None or (frame.file, frame.line, frame.function) != (other.file, other.line, other.function):
            return frame
    return mine[-1] if mine else None


@dataclass
class Row:
    """One call on the slow rank, per step: its time there, the peers' there, the extra."""

    frame: Frame4
    extra_s: float
    slow_s: float
    peers_s: float
    share: float            # of the extra time the rows explain
    only_here: bool
    inner: Frame4 | None    # the slow rank's heaviest innermost frame under it, when deeper
    cpu: float              # shares of the slow rank's time under it: on a CPU, runnable, blocked
    runq: float
    blocked: float
    gc: float               # shares of its samples there: inside a GC, under a DataLoader
    data: float
    inner_data: float = 0.0  # ... and under the innermost frame where the extra time is largest

    @property
    def data_loading(self) -> bool:
        return self.data >= 0.5 or self.inner_data >= 0.5


def _tree(pace: RankPace, steps: float) -> tuple[dict[tuple, list[float]], float]:
    """prefix -> [s, cpu, runq, n, gc, data] per step, and the total profiled time per step."""
    out: dict[tuple, list[float]] = {}
    for row in pace.paths.values():
        key = row.key
        for depth in range(1, len(key) + 1):
            node = out.setdefault(key[:depth], [0.0] * 6)
            for i, value in enumerate((row.s, row.cpu, row.runq, row.n, row.gc, row.data)):
                node[i] += value / steps if i < 3 else value
    return out, pace.profile_s / steps


def _children(node: tuple, keys: Iterable[tuple]) -> list[tuple]:
    return sorted({k[:len(node) + 1] for k in keys if len(k) > len(node) and k[:len(node)] == node})


def _enclosing(paces: Iterable[RankPace]) -> set[tuple]:
    """Every prefix of the paths the ranks' waits for their peers were sampled in (empty: none sampled)."""
    return {key[:depth] for pace in paces for key in pace.wait_paths for depth in range(1, len(key) + 1)}


def _frontier(slow: dict, slow_total: float, peers: dict, peers_total: float,
              enclosing: set[tuple] = frozenset()) -> list[tuple[tuple, bool]]:
    """The level below the common ground: (prefix, self-only) nodes; ``enclosing``: the frames the waits
    are under (when any were sampled, only those can be common ground)."""
    keys = set(slow) | set(peers)
    frontier = [((k,), False) for k in sorted({k[0] for k in keys})]
    for _ in range(8):
        opened, out = False, []
        for node, self_only in frontier:
            common = not self_only and slow.get(node, [0.0])[0] >= COMMON * slow_total \
                and peers.get(node, [0.0])[0] >= COMMON * peers_total and (not enclosing or node in enclosing)
            kids = _children(node, keys) if common else []
            if kids:
                opened = True
                out += [(k, False) for k in kids] + [(node, True)]
            else:
                out.append((node, self_only))
        frontier = out
        if not opened:
            break
    return frontier


def _value(tree: dict, node: tuple, self_only: bool, keys: Iterable[tuple]) -> list[float]:
    value = list(tree.get(node, [0.0] * 6))
    if self_only:
        for kid in _children(node, keys):
            value = [a - b for a, b in zip(value, tree.get(kid, [0.0] * 6))]
    return value


def _frames(pace: RankPace) -> dict[tuple, Frame4]:
    return {f[:3]: f for row in pace.paths.values() for f in row.frames}


def differential(slow: RankPace, slow_steps: float, peers: list[tuple[RankPace, float]]) -> list[Row]:
    """The slow rank's calls that take longer than its peers', per step, largest first (at most MAX_ROWS)."""
    if not peers or slow_steps <= 0 or not slow.paths:
        return []
    mine, mine_total = _tree(slow, slow_steps)
    theirs: dict[tuple, list[float]] = {}
    theirs_total = 0.0
    for pace, steps in peers:
        tree, total = _tree(pace, max(steps, 1e-9))
        theirs_total += total / len(peers)
        for node, value in tree.items():
            acc = theirs.setdefault(node, [0.0] * 6)
            for i, v in enumerate(value):
                acc[i] += v / len(peers)
    keys = set(mine) | set(theirs)
    scored = []
    enclosing = _enclosing([slow, *(pace for pace, _ in peers)])
    for node, self_only in _frontier(mine, mine_total, theirs, theirs_total, enclosing):
        s_val, p_val = _value(mine, node, self_only, keys), _value(theirs, node, self_only, keys)
        if s_val[3] >= MIN_SAMPLES and s_val[0] - p_val[0] > 0:
            scored.append((s_val[0] - p_val[0], node, self_only, s_val, p_val))
    total = sum(x[0] for x in scored)
    scored.sort(key=lambda x: -x[0])
    frames = _frames(slow)
    leaves = {key: row.s / slow_steps for key, row in slow.paths.items()}
    for pace, steps in peers:  # each path's own time (not its subtree's), the peers' mean
        for key, row in pace.paths.items():
            leaves[key] = leaves.get(key, 0.0) - row.s / max(steps, 1e-9) / len(peers)
    return [_row(x, total, frames, _inner(x[1], x[2], slow, leaves)) for x in scored[:MAX_ROWS]
            if x[0] >= MIN_ROW_SHARE * total]


def _inner(node: tuple, self_only: bool, slow: RankPace, leaves: dict) -> tuple[Frame4 | None, float]:
    """The innermost frame under a call where the slow rank's extra time is largest (None: the call itself),
    and the share of its samples there under a DataLoader."""
    if self_only:
        return None, 0.0
    under = [r for r in slow.paths.values() if r.key[:len(node)] == node and len(r.key) > len(node)]
    if not under:
        return None, 0.0
    best = max(under, key=lambda r: leaves.get(r.key, 0.0))
    return best.frames[-1], best.data / max(1, best.n)


def _row(item: tuple, total: float, frames: dict, inner: tuple[Frame4 | None, float]) -> Row:
    extra, node, self_only, s_val, p_val = item
    s = max(s_val[0], 1e-12)
    n = max(s_val[3], 1.0)
    only_here = p_val[0] <= ONLY_HERE * s_val[0] and s_val[3] >= ONLY_HERE_SAMPLES
    return Row(frame=frames.get(node[-1], (*node[-1], "")), extra_s=extra, slow_s=s_val[0], peers_s=max(0.0, p_val[0]),
               share=extra / total if total else 0.0, only_here=only_here, inner=inner[0],
               cpu=s_val[1] / s, runq=s_val[2] / s, blocked=max(0.0, 1 - (s_val[1] + s_val[2]) / s),
               gc=s_val[4] / n, data=s_val[5] / n, inner_data=inner[1])


def frame_text(frame: Frame4 | None) -> str:
    """'`batch = next(it)` train.py:31' (or 'train.py:31 in fn' without the source line)."""
    if not frame:
        return "an unknown line"
    where = f"{frame[0]}:{frame[1]}" if frame[1] is not None else str(frame[0])
    return f"`{frame[3]}` {where}" if frame[3] else f"{where} in {frame[2]}"
