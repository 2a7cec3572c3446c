import pytest

from distdoctor.core.causes import CAUSES
from distdoctor.core.findings import Finding, FindingKind, Severity, severity_of_id


def test_severity_comes_from_the_id_letter():
    assert severity_of_id("net.E001") is Severity.ERROR
    assert severity_of_id("net.W002") is Severity.WARNING
    assert severity_of_id("net.I003") is Severity.INFO
    assert severity_of_id("net.C004") is Severity.CRITICAL


@pytest.mark.parametrize("bad", ["net.X001", "NET.E001", "net.E01", "netE001", "net.E0001", ""])
def test_malformed_ids_are_rejected(bad):
    with pytest.raises(ValueError):
        severity_of_id(bad)


def test_kind_rejects_unknown_cause_and_multiline_title():
    with pytest.raises(ValueError, match="vocabulary"):
        FindingKind("x.E001", cause="cosmic_rays", title="t", hint="h")
    with pytest.raises(ValueError, match="one line"):
        FindingKind("x.E001", cause="unknown", title="two\nlines", hint="h")


def test_kind_makes_findings_with_defaults_and_overrides():
    kind = FindingKind("x.W001", cause="firewall", title="Default title", hint="Default hint")
    plain = kind()
    assert (plain.title, plain.remediation, plain.severity) == ("Default title", "Default hint", Severity.WARNING)
    specific = kind("Port 29500 filtered", remediation="open it", ranks=[3, 1, 3], hosts=["b", "a", "b"])
    assert specific.ranks == (1, 3)
    assert specific.hosts == ("b", "a")
    assert specific.remediation == "open it"


def test_round_trip_through_dict():
    kind = FindingKind("x.E002", cause="rank_missing", title="t", hint="h")
    finding = kind(detail="d", ranks=[2], hosts=["n"], data={"k": [1, 2]}, check="c", confidence=0.5)
    raw = finding.to_dict()
    assert set(raw) >= {"id", "severity", "cause", "title", "detail", "remediation", "ranks", "hosts", "check"}
    assert raw["severity"] == "error"
    assert Finding.from_dict(raw) == finding


def test_vocabulary_matches_the_shared_reference():
    from pathlib import Path
    import re

    reference = Path(__file__).resolve().parents[2] / "shared" / "causes.md"
    if not reference.exists():
        pytest.skip("shared/causes.md is not beside this checkout")
    names = re.findall(r"^\| `([a-z0-9_]+)` \|", reference.read_text(), re.M)
    assert set(names) == set(CAUSES)
