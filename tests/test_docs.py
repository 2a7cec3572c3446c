"""Every finding ID is documented exactly once, and every documented cause is in the vocabulary."""

import re
from collections import Counter
from pathlib import Path

from distdoctor.core.causes import CAUSES
from distdoctor.core.config import Config
from distdoctor.core.docs import all_headings, finding_doc
from distdoctor.dispatch import load_every_kind

REPO = Path(__file__).resolve().parents[1]


def registry_with_site_checks():
    return load_every_kind(Config(checks_dirs=(str(REPO / "checks"),)))


def test_every_registered_id_has_a_docs_entry():
    registry = registry_with_site_checks()
    assert not registry.load_problems, [p.detail for p in registry.load_problems]
    missing = sorted(i for i in registry.kinds if finding_doc(i) is None)
    assert not missing, f"finding IDs without a section in docs/findings/: {missing}"


def test_no_id_is_documented_twice():
    counts = Counter(finding_id for _, finding_id in all_headings())
    assert not [i for i, n in counts.items() if n > 1]


def test_documented_causes_are_in_the_vocabulary_and_match_the_code():
    registry = registry_with_site_checks()
    for finding_id, kind in registry.kinds.items():
        section = finding_doc(finding_id)
        causes = re.findall(r"\*\*Cause:\*\* `([a-z0-9_]+)`", section)
        assert causes, f"{finding_id}: the docs section names no cause"
        assert all(c in CAUSES for c in causes), finding_id
        assert kind.cause in causes, f"{finding_id}: docs say {causes}, code says {kind.cause}"


def test_every_cause_is_documented_in_the_causes_page():
    text = (REPO / "docs" / "causes.md").read_text()
    for cause in CAUSES:
        assert f"`{cause}`" in text, cause
