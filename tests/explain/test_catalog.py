"""The catalog is consistent: IDs registered, causes in the vocabulary, every ID documented."""

from __future__ import annotations

import re

import pytest

from distdoctor.core.causes import CAUSES
from distdoctor.core.docs import finding_doc
from distdoctor.explain import CATALOG
from distdoctor.explain.catalog import CatalogError, parse_catalog
from distdoctor.core.registry import REGISTRY, Registry

SIGNATURE_IDS = sorted({s.kind.id for s in CATALOG.signatures} | {c.kind.id for s in CATALOG.signatures for c in s.candidates})


@pytest.mark.parametrize("kind_id", sorted(CATALOG.kinds))
def test_each_kind_is_registered_valid_and_documented(kind_id):
    kind = CATALOG.kinds[kind_id]
    assert REGISTRY.kinds.get(kind_id) is kind
    assert kind.cause in CAUSES
    assert kind_id.startswith("log.")
    section = finding_doc(kind_id)
    assert section is not None, f"docs/findings/log.md has no section for {kind_id}"
    assert f"**Cause:** `{kind.cause}`" in section


@pytest.mark.parametrize("sig", CATALOG.signatures, ids=lambda s: s.name)
def test_each_signature_is_sound(sig):
    assert sig.cause in CAUSES
    assert sig.kind.id in CATALOG.kinds
    assert sig.tokens and all(t for t in sig.tokens)
    if sig.candidates:
        # A generic text never states any cause with high confidence, lists >= 3 distinct causes,
        # and says for each one what observation tells it apart. A message that names its cause (role
        # cause: EADDRINUSE) may be confident; its alternatives rank below it.
        assert sig.role == "cause" or sig.confidence < 0.8
        assert all(c.confidence < 0.8 and c.confidence < sig.confidence for c in sig.candidates) or sig.role != "cause"
        assert all(c.confidence < 0.8 for c in sig.candidates)
        assert sig.tell_apart and sig.tell and all(c.tell for c in sig.candidates)
        causes = [sig.cause] + [c.kind.cause for c in sig.candidates]
        assert len(set(causes)) == len(causes) >= 3


GENERIC = ["nccl_watchdog_timeout", "bare_socket_timeout", "nccl_unhandled_system_error", "child_failed_generic",
           "gloo_peer_lost", "gloo_io_timeout", "store_client_connect_timeout", "nccl_internal_error",
           "store_peer_closed", "nccl_remote_error"]


@pytest.mark.parametrize("name", GENERIC)
def test_generic_messages_have_ranked_candidates(name):
    sig = CATALOG.signature(name)
    assert len({sig.cause, *(c.kind.cause for c in sig.candidates)}) >= 3


def test_every_declared_kind_is_used():
    # W036: skipped inputs (reason.skipped_finding); I041: a restarted job's earlier attempts (attempts.py)
    used = set(SIGNATURE_IDS) | {"log.W030", "log.W036", "log.I041"}
    assert set(CATALOG.kinds) == used


def test_a_bad_catalog_is_rejected_at_load():
    base = {"kind": [{"id": "tst.E001", "cause": "port_in_use", "title": "t", "hint": "h"}]}
    good = {"name": "x", "kind": "tst.E001", "role": "cause", "tokens": ["a"], "pattern": "a(?P<p>\\d+)",
            "confidence": 0.5, "title": "port {p}", "remediation": "r"}
    parse_catalog({**base, "signature": [good]}, register=Registry().finding_kind)
    for bad, message in [
        ({"pattern": "a(("}, "does not compile"),
        ({"title": "port {nope}"}, "never extracts"),
        ({"kind": "tst.E999"}, "not declared"),
        ({"role": "maybe"}, "role"),
        ({"tokens": []}, "prefilter"),
        ({"explains": ["ghost"]}, "explains unknown"),
        ({"candidates": [{"kind": "tst.E001", "confidence": 0.2, "why": "w"}]}, "tell_apart"),
        ({"candidates": [{"kind": "tst.E001", "confidence": 0.2, "why": "w", "tell": "t"}], "tell_apart": "x",
          "tell": "t"}, "listed twice"),
    ]:
        with pytest.raises(CatalogError, match=message):
            parse_catalog({**base, "signature": [{**good, **bad}]}, register=Registry().finding_kind)


def test_unknown_cause_is_rejected():
    with pytest.raises(ValueError, match="vocabulary"):
        parse_catalog({"kind": [{"id": "tst.E001", "cause": "gremlins", "title": "t", "hint": "h"}]},
                      register=Registry().finding_kind)


def test_docs_sections_exist_only_for_catalog_ids():
    from distdoctor.core.docs import docs_root

    text = (docs_root() / "findings" / "log.md").read_text()
    documented = set(re.findall(r"^## (log\.[IWEC]\d{3})\b", text, re.M))
    assert documented == set(CATALOG.kinds)


def test_every_symptom_and_crash_has_ranked_alternatives():
    """No distributed failure without candidates: what survivors see and how a rank died always fit several causes."""
    bare = [s.name for s in CATALOG.signatures if s.role in ("symptom", "crash") and len(s.candidates) < 2]
    assert bare == []
