"""docs/findings/lint.md documents every lint ID with its cause and the rule's own examples."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from distdoctor.core.docs import finding_doc
from distdoctor.core.registry import REGISTRY
from distdoctor.lint import all_ids
from distdoctor.lint.rules import rules_by_id

REPO = Path(__file__).resolve().parents[2]


def test_every_lint_id_has_a_section_with_its_cause():
    for finding_id in all_ids():
        section = finding_doc(finding_id)
        assert section, f"{finding_id} has no section in docs/findings/lint.md"
        causes = re.findall(r"\*\*Cause:\*\* `([a-z_]+)`", section)
        assert causes == [REGISTRY.kinds[finding_id].cause], finding_id
        assert "Wrong:" in section and "Right:" in section, finding_id


def test_the_documented_examples_are_the_ones_the_tests_run():
    for rule in rules_by_id().values():
        section = finding_doc(rule.id)
        assert f"```python\n{rule.wrong.rstrip()}\n```" in section, rule.id
        assert f"```python\n{rule.right.rstrip()}\n```" in section, rule.id


def test_lint_imports_only_core_and_itself():
    for path in (REPO / "distdoctor" / "lint").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                if name.startswith("distdoctor"):
                    assert name.startswith(("distdoctor.core", "distdoctor.lint")), f"{path}: {name}"
                assert not name.startswith("torch"), f"{path}: lint must not import torch ({name})"


def test_pre_commit_hook_definition_runs_the_lint_command():
    text = (REPO / ".pre-commit-hooks.yaml").read_text()
    assert "id: distdoctor-lint" in text and "entry: distdoctor lint" in text and "types: [python]" in text
