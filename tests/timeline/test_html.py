"""The HTML report as people see it: rendered by a real headless Chromium, at 4 and at 4,096 ranks, with hostile text."""

from __future__ import annotations

import re

import pytest

from distdoctor.core.findings import Finding, Severity
from distdoctor.core.html import render_html
from distdoctor.timeline.html_run import run_page
from distdoctor.timeline.html_stalls import MAX_LANES, MAX_STALLS_DRAWN
from distdoctor.core.report import Report, WorldSummary
from distdoctor.timeline.job_report import job_report
from distdoctor.timeline.material import read_material
from report_dirs import snapshot, stall, steady_dumps, write_dir

HOSTILE = '<img src=x onerror="document.title=\'pwned\'"><script>document.title="pwned"</script>'


def page_of(browser, tmp_path, html, name="report.html"):
    path = tmp_path / name
    path.write_text(html, encoding="utf-8")
    return browser.open(path)


def lane_labels(page):
    return page.evaluate("[...document.querySelectorAll('svg[aria-label=\"stall timeline\"] text title')]"
                         ".map(t => t.parentNode.textContent.replace(t.textContent, ''))")


def bar_titles(page, color):
    return page.evaluate(f"[...document.querySelectorAll('rect[fill=\"{color}\"] > title')].map(t => t.textContent)")


def test_a_straggler_s_run_shows_the_late_rank_and_its_line(tmp_path, browser):
    root = write_dir(tmp_path / "R", ranks=4, stalls=[stall(1, 2, [0, 1, 3], 1.0, 4.5), stall(2, 2, [0, 1, 3], 9.0, 4.6)],
                     dumps=steady_dumps(4, 40, gap=(10, 4.5)))
    page = page_of(browser, tmp_path, run_page(job_report(read_material([root]))))
    assert page.errors() == []
    assert page.evaluate("document.scripts.length") == 0
    assert lane_labels(page) == ["rank 0 on node-a", "rank 1 on node-a", "▲ rank 2 on node-a", "rank 3 on node-a"]
    late_label = page.evaluate("document.querySelector('.late-label').lastChild.textContent")
    assert late_label == "▲ rank 2 on node-a"
    late = sorted(bar_titles(page, "#d32f2f"))
    assert len(late) == 2 and all("rank 2 late" in t and "train.py:14" in t and "job.E002" in t for t in late)
    assert "4.5 s" in late[0] and "4.6 s" in late[1]
    text = page.evaluate("document.body.innerText")
    assert re.search(r"rank 2 on node-a\s+2\s+9\.1", text), text  # the straggler profile: 2 stalls, 9.1 s late
    assert "train.py:14 (2x)" in text


def test_no_stall_and_no_recorder_says_what_the_record_lacks(tmp_path, browser):
    root = write_dir(tmp_path / "R", ranks=2, stalls=[])
    page = page_of(browser, tmp_path, run_page(job_report(read_material([root]))))
    assert page.errors() == []
    lacks = page.evaluate("[...document.querySelectorAll('.lacks li')].map(li => li.textContent)")
    assert any("no flight-recorder dump" in x for x in lacks) and any("no stall" in x for x in lacks)
    assert "0 stalls past the hang timeout" in page.evaluate("document.body.innerText")


def test_text_from_the_job_is_shown_never_run(tmp_path, browser):
    snaps = {1: snapshot(1, host=HOSTILE, status="raised",
                         error={"type": "ValueError", "message": HOSTILE, "time": 1_795_000_003.0})}
    root = write_dir(tmp_path / "R", ranks=2, stalls=[stall(1, 1, [0], 1.0, 2.0, where=f"x.py:1 {HOSTILE}", title=HOSTILE)],
                     snapshots=snaps)
    report = job_report(read_material([root]))
    report.findings.append(Finding(id="job.E001", severity=Severity.ERROR, cause="straggler_rank", title=HOSTILE,
                                   detail=HOSTILE, remediation=HOSTILE, ranks=(1,), hosts=(HOSTILE,)))
    html = run_page(report)
    assert "<script" not in html.lower() and "<img" not in html.lower()  # escaped: &lt;script&gt;
    page = page_of(browser, tmp_path, html)
    assert page.errors() == []
    assert page.evaluate("document.title") != "pwned"
    assert page.evaluate("document.querySelectorAll('script, img').length") == 0
    assert HOSTILE in page.evaluate("document.body.innerText")  # shown as the text it is
    assert any(HOSTILE in t for t in bar_titles(page, "#d32f2f"))


@pytest.mark.parametrize("ranks", [1024, 4096])
def test_many_ranks_are_grouped_into_lanes_and_the_odd_ones_stay_visible(tmp_path, browser, ranks):
    late_ranks = [7, 300, 1000]
    stalls = [stall(i, late_ranks[i % 3], [r for r in range(ranks) if r != late_ranks[i % 3]], i * 5.0, 2.0)
              for i in range(1, 31)]
    root = write_dir(tmp_path / "R", ranks=ranks, stalls=stalls)
    html = run_page(job_report(read_material([root])))
    assert len(html) < 2 << 20
    page = page_of(browser, tmp_path, html)
    assert page.errors() == []
    labels = lane_labels(page)
    assert len(labels) <= MAX_LANES
    assert {"▲ rank 7 on node-a", "▲ rank 300 on node-a", "▲ rank 1000 on node-a"} <= set(labels)
    others = [x for x in labels if not x.startswith("▲")]
    assert len(others) == 1 and others[0].startswith("ranks 0-6, 8-299"), others  # every waiting rank: one lane
    assert page.evaluate("document.documentElement.scrollHeight") < 4000


def test_thousands_of_stalls_are_drawn_within_the_bound(tmp_path, browser):
    stalls = [stall(i, i % 2, [1 - i % 2], i * 2.0, 0.5 + (i % 10) / 10) for i in range(1, 3001)]
    root = write_dir(tmp_path / "R", ranks=2, stalls=stalls)
    html = run_page(job_report(read_material([root])))
    page = page_of(browser, tmp_path, html)
    assert page.errors() == []
    assert len(bar_titles(page, "#d32f2f")) == MAX_STALLS_DRAWN
    assert "3000 stalls over" in page.evaluate("document.body.innerText")
    assert f"the {MAX_STALLS_DRAWN} longest drawn" in page.evaluate("document.body.innerText")


def stacks_report(ranks: int, late_rank: int) -> Report:
    snaps = []
    for rank in range(ranks):
        late = rank == late_rank
        snaps.append({"rank": rank, "host": "node-a", "status": "running", "proc_state": "S",
                      "where": {"file": "train.py", "line": 14 if late else 21, "code": "time.sleep(60)" if late else "loss.backward()"},
                      "in_collective": None if late else "backward (DDP's gradient all-reduce)", "groups": []})
    return Report(findings=[], world=WorldSummary(size=ranks, launcher="stacks"),
                  data={"stacks": {"jobs": [{"job": "torchrun 123", "nodes": ["node-a"], "snapshots": snaps}]}})


@pytest.mark.parametrize(("ranks", "late", "others"), [(4, 2, "0-1, 3"), (1024, 5, "0-4, 6-1023")])
def test_stacks_ranks_are_grouped_with_the_odd_one_first(tmp_path, browser, ranks, late, others):
    page = page_of(browser, tmp_path, render_html(stacks_report(ranks, late)))
    assert page.errors() == []
    rows = page.evaluate("[...document.querySelectorAll('table tr')].slice(1).map(r => [...r.cells].map(c => c.innerText))")
    assert rows[0][0] == str(late) and "train.py:14" in rows[0][5]
    assert rows[1][0] == others and rows[1][1] == str(ranks - 1) and "backward" in rows[1][4]


def bench_report(size: int, slow: tuple[int, int]) -> Report:
    from distdoctor.bench.assemble import assemble  # the bench's own judge names the slow link

    links = [{"a": a, "b": b, "bytes": 1 << 20, "iters": 10, "lat_us": 50.0, "bw_gbs": 0.05 if (a, b) == slow else 1.0}
             for a in range(size) for b in range(a + 1, size)]
    data, findings = assemble(size=size, hosts={r: "node-a" for r in range(size)}, sweeps={}, links=links, routes={},
                              stopped={}, backend="gloo")
    return Report(findings=findings, world=WorldSummary(size=size, launcher="bench"), data={"bench": data})


@pytest.mark.parametrize("size", [8, 200])
def test_bench_s_link_matrix_is_a_heatmap_with_the_slow_link_marked(tmp_path, browser, size):
    report = bench_report(size, (2, 5))
    assert [f.id for f in report.findings] == ["bench.W002"]
    page = page_of(browser, tmp_path, render_html(report, title="distdoctor bench"))
    assert page.errors() == []
    marked = page.evaluate("[...document.querySelectorAll('rect[stroke=\"#d32f2f\"] > title')].map(t => t.textContent)")
    assert len(marked) == 2 and all("ranks 2 and 5" in t and "named slow" in t for t in marked)
    cells = page.evaluate("document.querySelectorAll('svg[aria-label=\"link matrix\"] rect[fill^=\"rgb\"]').length")
    assert cells == (size * size - size if size <= 64 else 64 * 64)  # binned: pairs inside a bin fill its diagonal


def test_the_page_checker_sees_a_page_that_runs_something(tmp_path, browser):
    # The "no console error" assertions above can fail: a page that tries to run or load something is caught.
    hostile = render_html(Report(findings=[])).replace("</main>", "<script>console.error('ran')</script></main>")
    page = page_of(browser, tmp_path, hostile, name="hostile.html")
    assert any("Content Security Policy" in e for e in page.errors())
