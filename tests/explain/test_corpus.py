"""explain's figures on its corpus of real posted logs: the dev part it is developed against (the sealed part is
measured once when a piece of work is done, never asserted here: a test run must not steer the work by it)."""

from __future__ import annotations

import tomllib

# pytest puts this directory on sys.path (tests/ is not a package), as for conftest.py.
from corpus_figures import CORPUS, cross_validate, entries, evaluate, figures, log_part, part_of


def test_every_corpus_log_is_indexed_with_its_source_and_why_it_is_or_is_not_ambiguous():
    index = tomllib.loads((CORPUS / "index.toml").read_text())
    files = {e["file"] for e in index["log"]}
    assert files == {p.name for p in CORPUS.glob("*.log")}
    for entry in index["log"]:
        assert entry["url"].startswith("https://") and entry["kind"] in ("identifies", "generic")
        assert entry["established"] and entry["why"], entry["file"]


def test_the_split_is_by_thread_and_an_override_only_moves_a_log_read_before_the_split_to_dev():
    logs = entries("all")
    # The hash puts about 2 in 5 threads on the sealed side; overrides only ever take logs out of it.
    threads = {e["url"] for e in logs}
    assert sum(part_of(u) == "sealed" for u in threads) * 3 >= len(threads)
    for e in logs:
        if "part" in e:
            assert e["part"] == "dev" and e["moved"], e["file"]
    # Every log of one thread lands on the same side: the split is by thread, not by log.
    sides: dict[str, set[str]] = {}
    for e in logs:
        sides.setdefault(e["url"], set()).add(log_part(e))
    assert all(len(s) == 1 for s in sides.values())


def test_dev_figures_meet_the_bar():
    f = figures(evaluate("dev"))
    assert f["top1_identifies"] >= 0.9, f
    assert f["top3_generic"] >= 0.8, f
    assert f["confidently_wrong"] == 0, f
    assert f["confident_right"] >= 0.9, f


def test_the_cross_validated_dev_figure_holds_with_what_each_log_fitted_left_out():
    # Each dev log judged with the threads' priors counted without its own thread and without the hand-set rules
    # only its thread's log fires (corpus_figures.py --cross): the dev estimate that is not fitted to the log it
    # judges. Round 4 added 53 dev logs nobody had tuned on (15 ambiguous; measured as they came: 7 of 15 in the
    # top 3), and the estimate fell from 34 of 38 ambiguous logs (89 %) to 43 of 53 (81 %) against 46 of 53 on the
    # plain dev figure: the bar below is the issue's own floor for ambiguous logs (70 %) plus a margin.
    f = figures(cross_validate())
    assert f["top1_identifies"] >= 0.9, f
    assert f["top3_generic"] >= 0.75, f
    assert f["confidently_wrong"] == 0, f
