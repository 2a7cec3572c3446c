"""The rank collector reads two processes' tracebacks printed to one console at once, line by line."""

from __future__ import annotations

from distdoctor.explain.ranks import RankCollector


def collect(text: str) -> RankCollector:
    collector = RankCollector()
    collector.start_source()
    collector.block(text, 1, "console.log", 0, None)
    collector.end_source()
    return collector


# Two processes without a rank prefix (no process group yet) failing at once: headers back to back,
# frames in turn, one exception line glued after the other's carets (Python 3.11), the other on its own.
INTERLEAVED = """\
Traceback (most recent call last):
Traceback (most recent call last):
  File "/job/train.py", line 12, in <module>
  File "/job/train.py", line 30, in <module>
    load_shard(rank)
    {"a": a,
done
  File "/job/data.py", line 8, in load_shard
    raise KeyError(name)
^^^^^^^ValueError^: ^shard 3 is corrupt^

KeyError: 'shard_7'
"""


def test_interleaved_tracebacks_each_keep_their_own_exception_line():
    collector = collect(INTERLEAVED)
    raised = sorted((r.type, r.message) for r in collector.unattributed)
    # Neither exception is read twice, nor is another process's word ("done") taken for one.
    assert raised == [("KeyError", "'shard_7'"), ("ValueError", "shard 3 is corrupt")], raised


def test_one_traceback_alone_still_ends_at_its_first_line_after_the_frames():
    """The twin: one process's traceback is read as before, interleaving or not (its line ends it)."""
    text = ('Traceback (most recent call last):\n  File "/job/train.py", line 12, in <module>\n'
            "    step()\nRuntimeError: loss is NaN\nrank 0 done\nKeyError: 'late'\n")
    collector = collect(text)
    assert [(r.type, r.message, r.line) for r in collector.unattributed] == [("RuntimeError", "loss is NaN", 4)]
