"""Each rule names its mistake at the right line, and stays quiet on correct code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from distdoctor.core.findings import Severity
from distdoctor.lint import lint_paths, lint_text
from distdoctor.lint.rules import rules_by_id

HERE = Path(__file__).parent
SCRIPTS = sorted((HERE / "scripts").glob("*.py"))
CLEAN = sorted((HERE / "clean").glob("*.py"))
_ID = re.compile(r"lint\.[IWEC]\d{3}")


def expected(path: Path) -> set[tuple[str, int]]:
    """`# expect: lint.E002, lint.W007` on a line: those findings, at that line."""
    out = set()
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if "# expect:" in line:
            out |= {(i, number) for i in _ID.findall(line.split("# expect:", 1)[1])}
    return out


def found(path: Path) -> set[tuple[str, int]]:
    return {(f.id, f.data["line"]) for f in lint_paths([str(path)]).findings}


@pytest.mark.parametrize("path", SCRIPTS + CLEAN, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_findings_are_exactly_the_marked_lines(path):
    assert found(path) == expected(path)


def test_every_rule_is_exercised_by_a_script():
    marked = {i for path in SCRIPTS for i, _ in expected(path)}
    assert set(rules_by_id()) <= marked, sorted(set(rules_by_id()) - marked)


@pytest.mark.parametrize("path", CLEAN, ids=lambda p: p.name)
def test_scripts_in_the_style_of_pytorch_examples_have_no_error(path):
    report = lint_paths([str(path)])
    assert not [f.id for f in report.findings if f.severity >= Severity.ERROR]
    assert report.exit_code() == 0


@pytest.mark.parametrize("rule", list(rules_by_id().values()), ids=lambda r: r.id)
def test_documented_examples(rule):
    """The wrong example is flagged on the line its comment names; the right one is not flagged."""
    wrong = [f for f in lint_text(rule.wrong, "wrong.py").findings if f.id == rule.id]
    assert wrong, f"{rule.id}: its wrong example is not flagged"
    marked = [n for n, line in enumerate(rule.wrong.splitlines(), 1) if line.endswith(f"# {rule.id}")]
    assert [f.data["line"] for f in wrong] == marked
    assert rule.id not in {f.id for f in lint_text(rule.right, "right.py").findings}


@pytest.mark.parametrize("source", [
    "import torch.distributed as dist\nif dist.get_rank() == 0:\n    dist.broadcast(t, 0)\n",
    "import torch.distributed\nif torch.distributed.get_rank() == 0:\n    torch.distributed.broadcast(t, 0)\n",
    "from torch import distributed as d\nif d.get_rank() == 0:\n    d.broadcast(t, 0)\n",
    "from torch.distributed import broadcast, get_rank\nif get_rank() == 0:\n    broadcast(t, 0)\n",
    "from torch.distributed import broadcast as b\nimport torch\ndist = torch.distributed\nif dist.get_rank() == 0:\n    b(t, 0)\n",
    "from torch.distributed.distributed_c10d import broadcast\nif rank == 0:\n    broadcast(t, 0)\n",
], ids=["as-dist", "full-path", "from-torch", "from-import", "assigned-alias", "c10d-path"])
def test_aliases_resolve(source):
    findings = lint_text(source).findings
    assert [(f.id, f.data["line"]) for f in findings] == [("lint.E004", len(source.splitlines()))]


def test_a_name_that_only_looks_like_torch_is_not_flagged():
    source = "import mylib as dist\nif dist.get_rank() == 0:\n    dist.broadcast(t, 0)\n"
    assert lint_text(source).findings == []


def test_across_functions_of_one_module():
    source = (
        "import torch\nimport torch.distributed as dist\n\n"
        "def sync(t):\n    dist.all_reduce(t)\n\n"
        "def report(t):\n    sync(t)\n\n"
        "def main(t):\n    if dist.get_rank() == 0:\n        report(t)\n"
    )
    findings = lint_text(source).findings
    assert [(f.id, f.data["line"]) for f in findings] == [("lint.E004", 12)]
    assert "through `report()`" in findings[0].detail


def test_every_finding_carries_its_location():
    report = lint_paths([str(HERE / "scripts" / "temporaries.py")])
    for finding in report.findings:
        data = finding.data
        assert data["path"].endswith("temporaries.py") and data["line"] >= 1 and data["col"] >= 1
        assert data["source"].strip() and data["source"].strip() in finding.detail


def test_columns_count_characters_not_bytes():
    source = "import torch.distributed as dist\nx = 'é'; dist.isend(t, 1)\n"
    (finding,) = lint_text(source).findings
    assert finding.data["col"] == len("x = 'é'; ") + 1


def test_a_syntax_error_is_a_finding_at_its_line_and_other_files_are_still_linted(tmp_path):
    (tmp_path / "broken.py").write_text("import torch\n\ndef f(:\n    pass\n")
    (tmp_path / "good.py").write_text("import torch.distributed as dist\ndist.isend(t, 1)\n")
    report = lint_paths([str(tmp_path)])
    by_id = {f.id: f for f in report.findings}
    assert by_id["lint.W001"].data["line"] == 3 and "SyntaxError" in by_id["lint.W001"].detail
    assert by_id["lint.E002"].data["path"].endswith("good.py")


def test_undecodable_bytes_are_a_finding(tmp_path):
    (tmp_path / "latin.py").write_bytes(b"# -*- coding: utf-8 -*-\nx = '\xff\xfe'\n")
    (finding,) = lint_paths([str(tmp_path / "latin.py")]).findings
    assert finding.id == "lint.W001" and "decoded" in finding.detail


def test_lint_never_imports_or_runs_the_code(tmp_path):
    marker = tmp_path / "ran"
    (tmp_path / "evil.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('x')\nimport torch.distributed as dist\n"
        "raise SystemExit(3)\n")
    lint_paths([str(tmp_path)])
    assert not marker.exists()


def test_suppression_comment_silences_one_rule_on_its_line():
    source = (
        "import torch.distributed as dist\n"
        "req = dist.irecv(t, 0)  # distdoctor: ignore[lint.W003]\n"
        "req2 = dist.irecv(t, 0)  # distdoctor: ignore[lint.E002]\n"
        "dist.isend(t, 1)  # distdoctor: ignore\n"
        "dist.isend(\n    t, 1,  # distdoctor: ignore[lint.E002, lint.W003]\n)\n"
    )
    report = lint_text(source)
    assert [(f.id, f.data["line"]) for f in report.findings] == [("lint.W003", 3)]
    assert sorted((f.id, f.data["line"]) for f in report.silenced) == [
        ("lint.E002", 4), ("lint.E002", 5), ("lint.W003", 2)]


def test_absurdly_nested_code_is_a_finding_not_a_crash():
    source = "import torch.distributed as dist\nx = dist.get_rank()" + " + 1" * 50000 + "\n"
    (finding,) = lint_text(source).findings
    assert finding.id == "lint.W001" and "nested too deeply" in finding.detail


@pytest.mark.parametrize("rule_id, source", [
    ("lint.E009", "from torch.distributed import init_process_group as ipg\nfrom torch.nn import DataParallel as DP\n"
                  "ipg('nccl')\nm = DP(m)  # <-\n"),
    ("lint.E002", "from torch.distributed import isend as send_async\nsend_async(t, 1)  # <-\n"),
    ("lint.E006", "import torch.utils.data as tud\nimport torch.distributed as dist\ndist.init_process_group('gloo')\n"
                  "s = tud.DistributedSampler(d, num_replicas=2, rank=1)  # <-\n"),
    ("lint.E013", "from torch import distributed as D\nr = D.get_world_size()  # <-\nD.init_process_group('gloo')\n"),
    ("lint.W011", "import os, torch\nimport torch.distributed as dist\nr = int(os.environ['RANK'])\n"
                  "x = torch.zeros(1, device=f'cuda:{r}')  # <-\n"),
    ("lint.W017", "import torch as T\nfrom torch.nn.parallel import DistributedDataParallel\nm = DistributedDataParallel(m)\n"
                  "T.save(m.state_dict(), 'a.pt')  # <-\n"),
    ("lint.E005", "from torch.distributed import all_reduce as ar\nimport torch\nar(x.clone())  # <-\n"),
], ids=lambda v: v if isinstance(v, str) and v.startswith("lint.") else "")
def test_other_rules_through_aliases(rule_id, source):
    findings = [f for f in lint_text(source).findings if f.id == rule_id]
    marked = [n for n, line in enumerate(source.splitlines(), 1) if line.endswith("# <-")]
    assert [f.data["line"] for f in findings] == marked
