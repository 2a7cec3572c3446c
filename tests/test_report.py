import json

from distdoctor.core.findings import FindingKind, Severity
from distdoctor.core.render import make_console, render_json, render_markdown, render_rich, summary_line
from distdoctor.core.report import SCHEMA, WorldSummary, build_report, format_ranks, format_where

ERR = FindingKind("t.E001", cause="rank_missing", title="Rank missing", hint="Start it")
WARN = FindingKind("t.W002", cause="firewall", title="Filtered", hint="Open the port")


def test_format_ranks():
    assert format_ranks([0, 1, 2, 3, 5, 7, 8]) == "0-3, 5, 7-8"
    assert format_ranks([]) == ""


def test_identical_findings_from_many_ranks_merge_with_ranks_per_host():
    findings = [WARN(ranks=[r], hosts=["node-a" if r < 8 else "node-b"]) for r in range(12)]
    report = build_report(findings)
    (merged,) = report.findings
    assert merged.ranks == tuple(range(12))
    assert merged.data["where"] == {"node-a": list(range(8)), "node-b": [8, 9, 10, 11]}
    assert format_where(merged) == "ranks 0-7 on node-a; ranks 8-11 on node-b"


def test_merging_a_large_world_keeps_every_rank():
    findings = [WARN(ranks=[r], hosts=[f"node-{r // 8}"]) for r in range(8192)]
    (merged,) = build_report(findings).findings
    assert len(merged.ranks) == 8192
    assert len(merged.data["where"]) == 1024


def test_status_and_exit_codes():
    assert build_report([]).status == "ok"
    warn = build_report([WARN()])
    assert (warn.status, warn.exit_code(), warn.exit_code(Severity.WARNING)) == ("warning", 0, 1)
    err = build_report([ERR(), WARN()])
    assert (err.status, err.exit_code()) == ("error", 1)
    cut = build_report([WARN()], incomplete=True)
    assert (cut.status, cut.exit_code()) == ("incomplete", 3)


def test_silencing_is_counted():
    report = build_report([ERR(), WARN()], silence=["t.E*"])
    assert [f.id for f in report.findings] == ["t.W002"]
    assert report.to_dict()["silenced"] == {"count": 1, "ids": ["t.E001"]}
    assert "1 silenced (t.E001)" in summary_line(report)
    assert report.exit_code() == 0


def test_json_matches_the_contract():
    world = WorldSummary(size=4, launcher="torchrun", ranks_reported=(0, 1, 2), ranks_missing=(3,))
    checks = [{"name": "x.y", "stage": "local", "status": "fail", "duration_s": 0.1}]
    raw = json.loads(render_json(build_report([ERR(ranks=[3])], checks, world=world, duration_s=1.5)))
    assert raw["schema"] == SCHEMA
    assert raw["status"] == "error"
    assert raw["world"] == {"size": 4, "launcher": "torchrun", "ranks_reported": [0, 1, 2], "ranks_missing": [3]}
    (finding,) = raw["findings"]
    for key, kind in [("id", str), ("severity", str), ("cause", str), ("title", str), ("detail", str),
                      ("remediation", str), ("ranks", list), ("hosts", list), ("check", str)]:
        assert isinstance(finding[key], kind), key
    assert raw["checks"] == checks
    assert raw["duration_s"] == 1.5


def test_rich_rendering_is_plain_text_off_a_terminal(tmp_path):
    report = build_report([ERR(ranks=[3], hosts=["node-b"], detail="waited 10s"), WARN()])
    path = tmp_path / "out.txt"
    with path.open("w") as handle:
        render_rich(report, make_console(handle))
    text = path.read_text()
    assert "\x1b[" not in text
    assert "Errors (1)" in text and "Warnings (1)" in text
    assert text.index("t.E001") < text.index("t.W002")  # most severe first
    assert "fix: Start it" in text and "docs: distdoctor show t.E001" in text
    assert "where: rank 3 on node-b" in text
    assert text.strip().splitlines()[-1].startswith("ERROR: 1 error, 1 warning")


def test_quiet_rendering_shows_only_errors(tmp_path):
    path = tmp_path / "out.txt"
    with path.open("w") as handle:
        render_rich(build_report([ERR(), WARN()]), make_console(handle), quiet=True)
    text = path.read_text()
    assert "t.E001" in text and "t.W002" not in text


def test_markdown_has_a_table_and_escapes_pipes():
    text = render_markdown(build_report([ERR(title="a | b", detail="line1\nline2")]))
    assert "| severity | ID | cause |" in text
    assert "a \\| b" in text
    assert "<details>" in text


def test_a_pairing_given_by_the_check_is_kept_and_multi_host_findings_are_not_misattributed():
    own = WARN(ranks=[0, 5], hosts=["a", "b"], data={"where": {"a": [0], "b": [5]}})
    (merged,) = build_report([own]).findings
    assert format_where(merged) == "rank 0 on a; rank 5 on b"
    unpaired = ERR(ranks=[0, 5], hosts=["a", "b"])
    (merged,) = build_report([unpaired]).findings
    assert "where" not in merged.data
    assert format_where(merged) == "ranks 0, 5 on a, b"
