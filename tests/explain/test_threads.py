"""The labelled thread set explain's priors come from (distdoctor/explain/threads.toml): schema, vocabularies, parts, sources."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest

from distdoctor.core.causes import CAUSES

# pytest puts this directory on sys.path (tests/ is not a package), as for conftest.py.
from corpus_figures import CORPUS, part_of, thread_key
from threads_figures import THREADS, cause_counts, threads

REQUIRED = {"url": str, "part": str, "signature": str, "cause": str, "cues": list, "established": str}
OPTIONAL = {"log": str}
# The team's held-out list lives beside the checkouts, never in the repository: CI has none.
HELD_OUT_SCRIPTS = [p / "shared" / "heldout" / "is-held-out" for p in Path(__file__).resolve().parents]


def header_vocabulary(section: str) -> set[str]:
    """The names documented in one section of the file's header comment ('# Signatures:' or '# Cues:')."""
    names, inside = set(), False
    for line in THREADS.read_text().splitlines():
        if not line.startswith("#"):
            break
        if line.startswith(f"# {section}:"):
            inside = True
        elif inside and re.match(r"#\s*$|# \S", line):
            inside = False
        elif inside and (m := re.match(r"#   (\w+)\s", line)):
            names.add(m.group(1))
    return names


SIGNATURES = header_vocabulary("Signatures")
CUES = header_vocabulary("Cues")


def test_the_header_documents_both_vocabularies():
    assert {"store_wait_timeout", "nccl_watchdog_timeout", "other_distributed"} <= SIGNATURES
    assert {"docker", "multi_node", "rank0_only_work", "mpirun"} <= CUES


def test_every_thread_has_the_schema_fields_and_values_from_the_vocabularies():
    for t in threads():
        assert set(REQUIRED) <= set(t) <= set(REQUIRED) | set(OPTIONAL), t["url"]
        for key, kind in {**REQUIRED, **OPTIONAL}.items():
            assert key not in t or isinstance(t[key], kind), (t["url"], key)
        assert t["url"].startswith("https://"), t["url"]
        assert t["signature"] in SIGNATURES, (t["url"], t["signature"])
        assert t["cause"] in CAUSES, (t["url"], t["cause"])
        assert set(t["cues"]) <= CUES and len(set(t["cues"])) == len(t["cues"]), (t["url"], t["cues"])
        assert t["established"].strip(), t["url"]


def test_no_thread_is_recorded_twice():
    keys = [thread_key(t["url"]) for t in threads()]
    assert len(keys) == len(set(keys)), [k for k in keys if keys.count(k) > 1]


def test_each_part_is_the_one_its_address_draws():
    wrong = [(t["url"], t["part"]) for t in threads() if t["part"] != part_of(t["url"])]
    assert not wrong, wrong


def test_every_log_named_is_in_the_corpus_index_under_the_same_thread_and_cause():
    index = {e["file"]: e for e in tomllib.loads((CORPUS / "index.toml").read_text())["log"]}
    for t in threads():
        if "log" in t:
            entry = index.get(t["log"])
            assert entry is not None and (CORPUS / t["log"]).is_file(), t["log"]
            assert thread_key(entry["url"]) == thread_key(t["url"]) and entry["cause"] == t["cause"], t["log"]


def test_the_dev_table_counts_labelled_threads_only():
    dev = threads("dev")
    table = cause_counts(dev)
    assert sum(sum(c.values()) for c in table.values()) == sum(t["cause"] != "unknown" for t in dev)
    assert all("unknown" not in counts for counts in table.values())


def test_no_address_is_held_out():
    script = next((p for p in HELD_OUT_SCRIPTS if p.is_file()), None)
    if script is None:
        pytest.skip("the held-out list is not beside this checkout (CI)")
    urls = "\n".join(t["url"] for t in threads())
    result = subprocess.run([str(script), "-"], input=urls, capture_output=True, text=True, timeout=60)
    held = [line for line in result.stdout.splitlines() if line.startswith("held out")]
    assert not held and result.returncode == 0, held
