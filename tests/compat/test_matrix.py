"""compat/: the smoke set runs and judges real jobs; the matrix prints and writes what it got."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from tests.local_faults.conftest import REPO, base_env


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"compat_{name}", REPO / "compat" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


matrix, smoke = load("matrix"), load("smoke")


def test_the_check_case_passes_on_this_torch_and_says_so_in_one_json_line():
    """The smoke set as matrix.py runs it (its own process, the checkout on the path): one real case."""
    env = base_env(PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, str(REPO / "compat" / "smoke.py"), "--only", "check"], env=env,
                          capture_output=True, text=True, timeout=300)
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0 and len(lines) == 1, (done.stdout, done.stderr)
    assert lines[0]["case"] == "check" and lines[0]["ok"] is True and lines[0]["seconds"] > 0


def test_an_unknown_case_is_a_usage_error():
    done = subprocess.run([sys.executable, str(REPO / "compat" / "smoke.py"), "--only", "chek"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "unknown case(s) chek" in done.stderr


def test_the_report_is_found_in_output_with_other_lines_before_it():
    report = {"schema": "distdoctor.report/1", "findings": [{"id": "job.E002", "cause": "straggler_rank", "ranks": [1]}]}
    text = "a warning { not json\n" + json.dumps(report, indent=2) + "\ntrailing line\n"
    found = smoke.json_object(text)
    assert found == report
    assert smoke.names(smoke.findings_of(found), "straggler_rank", 1)
    assert not smoke.names(smoke.findings_of(found), "straggler_rank", 0)
    assert smoke.json_object("no report here") is None


def results():
    ok = matrix.Result("2.14.1", build="2.14.1+cu130 (CUDA 13.0)", numpy="2.4.6", python="3.11.7", setup_s=80, smoke_s=200,
                       cases={c: {"case": c, "ok": True, "seconds": 10, "why": ""} for c in matrix.CASES})
    old = matrix.Result("2.1.2", build="2.1.2+cu121 (CUDA 12.1)", numpy="1.26.4 (numpy<2)", python="3.11.7", setup_s=160,
                        smoke_s=300, cases={c: {"case": c, "ok": c != "guard-late", "seconds": 10,
                                                "why": "still running at the deadline" if c == "guard-late" else ""}
                                            for c in matrix.CASES})
    broken = matrix.Result("9.9.9", error="torch==9.9.9 could not be installed: no matching distribution")
    return [old, ok, broken]


def test_the_table_has_a_row_per_release_and_a_mark_per_case():
    rows = matrix.table(results(), list(matrix.CASES)).splitlines()
    assert len(rows) == 2 + 3
    assert rows[2].startswith("| 2.1.2+cu121 (CUDA 12.1) | 1.26.4 (numpy<2) |") and rows[2].count("✗") == 1
    assert rows[3].count("✓") == len(matrix.CASES) and "80 s + 200 s" in rows[3]
    assert rows[4].count("n/a") == len(matrix.CASES) and "environment failed" in rows[4]
    listed = matrix.failures(results())
    assert "torch 2.1.2, guard: DDP straggler: still running at the deadline" in listed
    assert "torch 9.9.9: torch==9.9.9 could not be installed" in listed
    assert [r.ok for r in results()] == [False, True, False]


def test_ci_runs_every_case_on_the_oldest_release_and_its_chosen_cases_on_the_newest():
    releases = [matrix.RELEASES[0], matrix.RELEASES[-1]]
    assert matrix.ci_cases(releases[0], releases) == []  # [] is every case
    newest = matrix.ci_cases(releases[-1], releases)
    assert newest == list(matrix.CI_NEWEST_CASES) and set(newest) < set(matrix.CASES)
    assert matrix.ci_cases(releases[0], releases[:1]) == []  # one release asked for: all of it


def test_write_docs_rewrites_only_the_block(tmp_path, monkeypatch):
    page = tmp_path / "compatibility.md"
    page.write_text(f"# title\nkept above\n\n{matrix.BEGIN}\nold table\n{matrix.END}\n\nkept below\n")
    monkeypatch.setattr(matrix, "DOCS", page)
    matrix.write_docs(results(), list(matrix.CASES), "python compat/matrix.py --write-docs")
    text = page.read_text()
    assert text.startswith("# title\nkept above\n\n" + matrix.BEGIN) and text.endswith(matrix.END + "\n\nkept below\n")
    assert "old table" not in text and "| 2.14.1+cu130 (CUDA 13.0) |" in text
    assert "Produced by `python compat/matrix.py --write-docs`" in text and "Failures:" in text


def test_the_docs_page_has_the_block_the_matrix_writes():
    text = (REPO / "docs" / "compatibility.md").read_text()
    assert text.count(matrix.BEGIN) == 1 and text.count(matrix.END) == 1
    assert all(matrix.HEADINGS[c] in text for c in matrix.CASES)  # the columns are explained
