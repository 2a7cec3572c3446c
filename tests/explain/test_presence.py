"""The words a block holds, found by the scan, spare the rank collector's and the attempts' own passes: never a finding."""

from __future__ import annotations

from pathlib import Path

import pytest

from distdoctor.explain import explain_files, presence
from distdoctor.explain.presence import BlockWords, may_hold

HERE = Path(__file__).parent
LOGS = sorted(p for folder in ("corpus", "fixtures") for p in (HERE / folder).rglob("*") if p.is_file())


def test_a_text_holding_a_word_the_block_lacks_is_not_there_and_any_other_is_searched():
    words = BlockWords({"traceback"}, ("error", "traceback", "exit"))
    assert words.may_hold("Traceback (most recent call last)")
    assert not words.may_hold("ChildFailedError") and not words.may_hold("exitcode  : ")
    assert words.may_hold("atchdog")          # holds no tracked word: searched
    assert may_hold(None, "ChildFailedError")  # words not known (a non-ASCII block): searched


def _reports(paths: list[Path]) -> list[dict]:
    out = []
    for path in paths:
        data = explain_files([str(path)]).to_dict()
        data.pop("duration_s", None)
        for check in data.get("checks", []):
            check.pop("duration_s", None)
        out.append(data)
    return out


def test_every_log_of_the_corpus_explains_the_same_with_the_words_as_without(monkeypatch):
    assert len(LOGS) > 250
    fast = _reports(LOGS)
    monkeypatch.setattr(presence.BlockWords, "may_hold", lambda self, text: True)
    assert _reports(LOGS) == fast


@pytest.mark.parametrize("chunk", [1 << 10, 1 << 14])
def test_a_log_read_in_small_blocks_explains_the_same_with_the_words_as_without(monkeypatch, tmp_path, chunk):
    # Small blocks: a traceback, a summary and a restart each fall in blocks that lack the other words.
    from distdoctor.explain import reader, scan

    monkeypatch.setattr(scan, "iter_blocks", lambda source: reader.iter_blocks(source, chunk))
    logs = [p for p in LOGS if p.stat().st_size > 4 * chunk][:40]
    assert logs
    fast = _reports(logs)
    monkeypatch.setattr(presence.BlockWords, "may_hold", lambda self, text: True)
    assert _reports(logs) == fast
