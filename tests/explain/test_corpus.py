"""explain's figures on its development corpus of real posted logs (issue 15's bar)."""

from __future__ import annotations

import tomllib

# pytest puts this directory on sys.path (tests/ is not a package), as for conftest.py.
from corpus_figures import CORPUS, evaluate, figures


def test_every_corpus_log_is_indexed_with_its_source():
    index = tomllib.loads((CORPUS / "index.toml").read_text())
    files = {e["file"] for e in index["log"]}
    assert files == {p.name for p in CORPUS.glob("*.log")}
    for entry in index["log"]:
        assert entry["url"].startswith("https://github.com/") and entry["kind"] in ("identifies", "generic")
        assert entry["established"]


def test_corpus_figures_meet_the_bar():
    f = figures(evaluate())
    assert f["top1_identifies"] >= 0.9, f
    assert f["top3_generic"] >= 0.8, f
    assert f["confidently_wrong"] == 0, f
