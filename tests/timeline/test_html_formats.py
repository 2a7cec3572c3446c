"""`--format html` on check, explain, stacks and bench, run as a user runs them, the pages opened in Chromium."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from distdoctor.core.html import HEAD_MARK

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "stacks"))
from stacks_jobs import child_env, hung_job, line_of  # noqa: E402  (the stacks tests' real hung jobs, shared)


def distdoctor(tmp_path: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "distdoctor", *args], capture_output=True, text=True, timeout=timeout,
                          env=child_env(), cwd=tmp_path, stdin=subprocess.DEVNULL)


def opened(browser, path: Path):
    assert path.read_text().startswith(HEAD_MARK)
    page = browser.open(path)
    assert page.errors() == []
    return page


def test_check_writes_a_page_of_its_findings(tmp_path, browser):
    done = distdoctor(tmp_path, "check", "--stage", "local", "--format", "html", "-o", "check.html",
                      "--fail-level", "critical")
    assert done.returncode == 0, done.stderr
    page = opened(browser, tmp_path / "check.html")
    summary = page.evaluate("document.querySelector('.summary').textContent")
    assert summary.split(":")[0] in ("OK", "WARNING", "ERROR") and "checks" in summary


def test_explain_writes_a_page_that_names_the_cause(tmp_path, browser):
    log = tmp_path / "job.log"
    log.write_text("[rank1]: Traceback (most recent call last):\n"
                   '[rank1]:   File "/work/train.py", line 12, in <module>\n'
                   "[rank1]:     loss = model(batch)\n"
                   "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB <b>x</b>\n")
    done = distdoctor(tmp_path, "explain", str(log), "--format", "html", "-o", "explain.html")
    assert done.returncode == 1, done.stderr
    page = opened(browser, tmp_path / "explain.html")
    cards = page.evaluate("[...document.querySelectorAll('.card')].map(c => c.innerText)")
    assert any("out of memory" in c.lower() for c in cards)
    assert page.evaluate("document.querySelectorAll('.card b').length") == 0  # the log's markup stays text


def test_explain_of_a_guard_s_report_directory_draws_its_run(tmp_path, browser):
    from report_dirs import stall, write_dir

    root = write_dir(tmp_path / "reports", ranks=4, stalls=[stall(1, 3, [0, 1, 2], 1.0, 4.0)])
    done = distdoctor(tmp_path, "explain", str(root), "--format", "html", "-o", "explain.html")
    assert done.returncode in (0, 1), done.stderr
    page = opened(browser, tmp_path / "explain.html")
    assert page.evaluate("document.querySelector('.late-label').lastChild.textContent") == "▲ rank 3 on node-a"


# extended: tests/stacks/test_stacks_jobs.py::test_the_sleeping_rank_is_named_with_its_line_and_the_job_keeps_running
# covers this job (json), test_html.py::test_stacks_ranks_are_grouped_with_the_odd_one_first the page
@pytest.mark.extended
@pytest.mark.multiproc
def test_stacks_writes_its_ranks_grouped_with_the_late_one_first(tmp_path, browser):
    with hung_job(tmp_path, "sleep", 3) as job:
        done = distdoctor(tmp_path, "stacks", str(job.pid), "--format", "html", "-o", "stacks.html")
    assert done.returncode == 1, done.stderr
    page = opened(browser, tmp_path / "stacks.html")
    rows = page.evaluate("[...document.querySelectorAll('table tr')].slice(1).map(r => [...r.cells].map(c => c.innerText))")
    assert len(rows[0]) == 6 and rows[0][1] == "1" and f"train.py:{line_of('time.sleep')}" in rows[0][5], rows
    assert sum(int(r[1]) for r in rows) == 3


@pytest.mark.multiproc
def test_bench_writes_the_link_matrix_as_a_heatmap(tmp_path, browser):
    done = distdoctor(tmp_path, "bench", "--nproc", "3", "--sizes", "8,64K", "--ops", "all_reduce", "--iters", "2",
                      "--warmup", "1", "--format", "html", "-o", "bench.html")
    assert done.returncode == 0, done.stderr
    page = opened(browser, tmp_path / "bench.html")
    cells = page.evaluate("[...document.querySelectorAll('svg[aria-label=\"link matrix\"] rect > title')].map(t => t.textContent)")
    assert len(cells) == 6 and all("GB/s" in c for c in cells)
    assert page.evaluate("document.querySelectorAll('table tr').length") == 3  # the sweep: two sizes


def test_a_format_it_does_not_know_is_a_usage_error_naming_html(tmp_path):
    done = distdoctor(tmp_path, "bench", "--format", "pdf")
    assert done.returncode == 2 and "html" in done.stderr
    done = distdoctor(tmp_path, "explain", "-", "--format", "pdf")
    assert done.returncode == 2 and "html" in done.stderr
