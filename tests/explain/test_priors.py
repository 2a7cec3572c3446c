"""The candidates' priors from the labelled threads (threads.toml): dev threads only, smoothed, moved by context."""

from __future__ import annotations

import pytest

from distdoctor.explain import explain_text
from distdoctor.explain.priors import (FIELD_WEIGHT, FREQ_PSEUDO, MIN_FAMILY_THREADS, PSEUDO_THREADS, Thread,
                                       ThreadsError, count, load_priors, parse_threads)


def thread(i: int, signature: str, cause: str, part: str = "dev", cues=()) -> Thread:
    return Thread(f"https://example.org/t/{i}", part, signature, cause, tuple(cues))


def test_only_dev_threads_with_a_known_cause_are_counted():
    priors = count([thread(1, "store_wait_timeout", "straggler_rank"), thread(2, "store_wait_timeout", "rank_missing",
                    part="sealed"), thread(3, "store_wait_timeout", "unknown")])
    assert priors.family_counts == {"store_wait_timeout": {"straggler_rank": 1}} and priors.total == 1


def test_the_posterior_is_the_threads_counts_smoothed_towards_the_catalogs_order():
    threads = [thread(i, "nccl_watchdog_timeout", "straggler_rank") for i in range(6)] + \
        [thread(9, "nccl_watchdog_timeout", "collective_mismatch")]
    base = {"collective_timeout_hang": 0.25, "rank_missing": 0.3, "straggler_rank": 0.3, "collective_mismatch": 0.15}
    priors = count(threads)
    post = priors.posterior("nccl_watchdog_timeout", base)
    q = priors.prior_measure(list(base), base)
    assert post["straggler_rank"] == pytest.approx((6 + PSEUDO_THREADS * q["straggler_rank"]) / (7 + PSEUDO_THREADS))
    assert post["rank_missing"] == pytest.approx(PSEUDO_THREADS * q["rank_missing"] / (7 + PSEUDO_THREADS))
    assert sum(post.values()) == pytest.approx(1.0)
    assert max(post, key=post.get) == "straggler_rank"
    # Too few threads: the catalog's order stands.
    assert count(threads[:MIN_FAMILY_THREADS - 1]).posterior("nccl_watchdog_timeout", base) is None


def test_the_prior_measure_blends_the_catalogs_order_with_the_causes_field_frequency():
    # Causes counted over every labelled dev thread, whatever its family: the catalog's order alone was fitted to
    # the dev logs it was written from; the field frequency is what the threads say across families.
    threads = [thread(i, "address_in_use", "port_in_use") for i in range(6)] + \
        [thread(10, "store_wait_timeout", "straggler_rank")]
    base = {"rank_missing": 0.6, "port_in_use": 0.2, "straggler_rank": 0.2}
    q = count(threads).prior_measure(list(base), base)
    field = {"rank_missing": FREQ_PSEUDO, "port_in_use": 6 + FREQ_PSEUDO, "straggler_rank": 1 + FREQ_PSEUDO}
    norm = sum(field.values())
    for cause in base:
        assert q[cause] == pytest.approx((1 - FIELD_WEIGHT) * base[cause] + FIELD_WEIGHT * field[cause] / norm)
    assert sum(q.values()) == pytest.approx(1.0) and q["port_in_use"] > q["straggler_rank"]
    # Nothing counted: the catalog's order, normalised.
    assert count([]).prior_measure(list(base), base) == pytest.approx({"rank_missing": 0.6, "port_in_use": 0.2,
                                                                      "straggler_rank": 0.2})


def test_a_cue_moves_the_causes_it_went_with_in_the_threads():
    threads = [thread(i, "nccl_system_error", "shm_too_small", cues=("docker",)) for i in range(6)] + \
        [thread(10 + i, "nccl_system_error", "wrong_interface") for i in range(6)]
    priors = count(threads)
    assert priors.lift("docker", "shm_too_small") > 1.3 and priors.lift("docker", "wrong_interface") < 0.7
    assert priors.lift("kubernetes", "shm_too_small") is None  # no thread shows it


@pytest.mark.parametrize("bad, message", [
    ({"part": "both"}, "part"), ({"signature": "nope"}, "vocabulary"), ({"cause": "gremlins"}, "causes.md"),
    ({"cues": ["moon_phase"]}, "cues"),
])
def test_a_bad_thread_is_rejected(bad, message):
    good = {"url": "https://github.com/o/r/issues/1", "part": "dev", "signature": "store_wait_timeout",
            "cause": "straggler_rank", "cues": []}
    parse_threads({"thread": [good]})
    with pytest.raises(ThreadsError, match=message):
        parse_threads({"thread": [{**good, **bad}]})


def test_the_shipped_threads_load_and_the_finding_says_what_ranked_it():
    priors = load_priors()
    assert priors.threads >= 1 and priors.total >= 1
    # A generic text whose family has enough labelled threads: its candidates say how many threads put each.
    for family in ("nccl_watchdog_timeout", "nccl_system_error", "killed_signal"):
        if priors.family_threads(family) >= MIN_FAMILY_THREADS:
            break
    else:
        pytest.skip("no family with enough labelled dev threads yet")
    text = {"nccl_watchdog_timeout": "[rank1]:[E1127 10:00:00.0 ProcessGroupNCCL.cpp:607] [Rank 1] Watchdog caught "
            "collective operation timeout: WorkNCCL(SeqNum=812, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
            "Timeout(ms)=1800000) ran for 1800083 milliseconds before timing out.\n",
            "nccl_system_error": "RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, "
            "unhandled system error, NCCL version 2.14.3\n",
            "killed_signal": "torch.multiprocessing.spawn.ProcessExitedException: process 1 terminated with signal "
            "SIGKILL\n"}[family]
    top = explain_text(text).findings[0]
    reasons = [r for c in top.data["candidates"] for r in c.get("reordered_by", [])]
    assert any("labelled threads" in r for r in reasons), top.data["candidates"]
    assert "labelled public threads" in top.detail


def _fresh(path):
    return load_priors.__wrapped__(path)  # past the process's own lru_cache: what a new run does


def test_the_counts_kept_between_runs_are_the_counts_the_threads_file_gives(tmp_path, monkeypatch):
    import json
    import tomllib

    from distdoctor.explain.priors import THREADS_PATH

    monkeypatch.setenv("DISTDOCTOR_CACHE_DIR", str(tmp_path / "cache"))
    parsed = count(parse_threads(tomllib.loads(THREADS_PATH.read_text(encoding="utf-8"))))
    first, again = _fresh(THREADS_PATH), _fresh(THREADS_PATH)
    [kept] = (tmp_path / "cache").glob("priors-*.json")
    assert first == parsed and again == parsed and json.loads(kept.read_text())["counts"]["total"] == parsed.total
    edited = tmp_path / "threads.toml"  # an edited file is another key: never read stale
    edited.write_text(THREADS_PATH.read_text(encoding="utf-8") + '\n[[thread]]\nurl = "https://example.org/1"\n'
                      'part = "dev"\nsignature = "store_wait_timeout"\ncause = "rank_missing"\ncues = []\n')
    assert _fresh(edited).total == parsed.total + 1 and len(list((tmp_path / "cache").glob("priors-*.json"))) == 2


@pytest.mark.parametrize("kept", ["{not json", '{"schema": "distdoctor.priors-cache/1", "counts": {"total": "9"}}',
                                  '{"schema": "distdoctor.priors-cache/1", "counts": {"family_counts": {"a": {"b": "1"}}}}'])
def test_a_damaged_cache_is_counted_again_and_an_unwritable_one_is_not_used(tmp_path, monkeypatch, kept):
    import hashlib

    from distdoctor.explain.priors import THREADS_PATH

    expected = count(parse_threads(__import__("tomllib").loads(THREADS_PATH.read_text(encoding="utf-8"))))
    cache = tmp_path / "cache"
    cache.mkdir()
    digest = hashlib.sha256(THREADS_PATH.read_bytes()).hexdigest()[:32]
    (cache / f"priors-{digest}.json").write_text(kept)
    monkeypatch.setenv("DISTDOCTOR_CACHE_DIR", str(cache))
    assert _fresh(THREADS_PATH) == expected
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setenv("DISTDOCTOR_CACHE_DIR", str(blocked / "cache"))  # a directory that cannot be made
    assert _fresh(THREADS_PATH) == expected and not list(tmp_path.glob("**/.priors-*.tmp"))
    for name in ("DISTDOCTOR_CACHE_DIR", "XDG_CACHE_HOME", "HOME"):  # nowhere absolute to keep it: not kept
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr("os.path.expanduser", lambda path: path)
    monkeypatch.chdir(tmp_path)
    assert _fresh(THREADS_PATH) == expected and not (tmp_path / "~").exists()
