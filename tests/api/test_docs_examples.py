"""The examples in docs/api.md and docs/pytest.md are the files in docs/examples/, and they run."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from distdoctor.core.docs import finding_doc

DOCS = Path(__file__).resolve().parents[2] / "docs"
EXAMPLES = DOCS / "examples"
INCLUDE = re.compile(r"<!-- example: (?P<path>[^ ]+) -->\n```python\n(?P<code>.*?)```", re.S)


def included(page: str) -> dict[str, str]:
    return {m["path"]: m["code"] for m in INCLUDE.finditer((DOCS / page).read_text())}


@pytest.mark.parametrize("page", ["api.md", "pytest.md"])
def test_pages_show_the_example_files_verbatim(page):
    blocks = included(page)
    assert blocks, f"{page} includes no example"
    for path, code in blocks.items():
        assert code == (DOCS / path).read_text(), f"{page}: the block for {path} is out of date"


def torchrun(script: str, timeout: float = 120) -> str:
    """torchrun --standalone --nproc-per-node=2 <script>, launched once and judged as it ends."""
    code, out = _torchrun_once(script, timeout)
    assert code == 0, out
    return out


def _torchrun_once(script: str, timeout: float) -> tuple[int, str]:
    """torchrun --standalone --nproc-per-node=2 <script>; killed by PID on timeout."""
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                             str(EXAMPLES / script)], cwd=EXAMPLES, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    return proc.returncode, out


@pytest.mark.multiproc
def test_train_preflight_example_runs_clean_under_torchrun():
    out = torchrun("train_preflight.py")
    assert "distdoctor preflight: ok on 2 ranks, 4 tensors compared" in out


@pytest.mark.multiproc
def test_catch_mismatch_example_raises_on_both_ranks():
    out = torchrun("catch_mismatch.py")
    for rank in (0, 1):
        assert f"rank {rank}: preflight raised ['spec.E001', 'spec.I007']" in out
    assert "0.weight: rank 0: [32, 16]; rank 1: [64, 16]" in out


@pytest.mark.multiproc
def test_pytest_page_examples_pass(pytester: pytest.Pytester):
    shutil.copy(EXAMPLES / "test_distributed_example.py", pytester.path)
    # The other python blocks of pytest.md (the fixture example) run as tests too.
    text = (DOCS / "pytest.md").read_text()
    snippets = [code for code in re.findall(r"```python\n(.*?)```", text, re.S)
                if code not in included("pytest.md").values()]
    assert snippets
    for i, code in enumerate(snippets):
        (pytester.path / f"test_snippet_{i}.py").write_text(code)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes.get("errors", 0) == 0, result.stdout.str()
    assert outcomes.get("passed", 0) + outcomes.get("skipped", 0) == 5


def test_every_spec_pre_init_id_is_documented_with_its_cause():
    import distdoctor.embedded.bounded_init as gi
    import distdoctor.embedded.setup_checks as pc
    import distdoctor.checks._support.tensor_specs as ts
    from distdoctor.core.findings import FindingKind

    kinds = [v for m in (ts, pc, gi) for v in vars(m).values() if isinstance(v, FindingKind)]
    assert {k.id.split(".")[0] for k in kinds} == {"spec", "pre", "init"}
    for kind in kinds:
        section = finding_doc(kind.id)
        assert section is not None, f"{kind.id} has no section in docs/findings/"
        assert f"**Cause:** `{kind.cause}`" in section, kind.id
        assert f"**Severity:** {kind.severity.label}" in section, kind.id
