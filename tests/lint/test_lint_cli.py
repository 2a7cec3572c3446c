"""`distdoctor lint` on the command line: formats, SARIF validity, selection, config, stdin, exit codes.

sarif-schema-2.1.0.json beside this file is the OASIS SARIF 2.1.0 JSON schema (its `$id` is the
canonical location in oasis-tcs/sarif-spec), in its errata revision, unmodified.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from typer.testing import CliRunner

from distdoctor.cli import app
from tests.conftest import REPO, distdoctor_cmd

HERE = Path(__file__).parent
SCRIPTS = HERE / "scripts"
runner = CliRunner()
BROKEN_P2P = "import torch.distributed as dist\ndist.isend(t, dst=1)\n"


def invoke(args, **kwargs):
    return runner.invoke(app, ["lint", *args], catch_exceptions=False, **kwargs)


def test_json_report_has_the_shared_contract_and_exit_1_on_errors():
    result = invoke([str(SCRIPTS / "p2p_requests.py"), "--format", "json"])
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["schema"] == "distdoctor.report/1" and report["status"] == "error"
    assert report["world"]["launcher"] == "lint"
    first = report["findings"][0]
    assert first["id"] == "lint.E002" and first["cause"] == "collective_timeout_hang"
    assert set(first["data"]) >= {"path", "line", "col", "source"}


def test_clean_code_exits_0_and_warnings_alone_do_not_fail(tmp_path):
    (tmp_path / "ok.py").write_text("import torch.distributed as dist\nreq = dist.irecv(t, 0)\n")
    result = invoke([str(tmp_path), "--format", "json"])
    assert result.exit_code == 0, result.stdout
    assert [f["id"] for f in json.loads(result.stdout)["findings"]] == ["lint.W003"]
    assert invoke([str(tmp_path), "--fail-level", "warning"]).exit_code == 1


def test_rich_output_names_file_line_and_fix():
    result = invoke([str(SCRIPTS / "ordering.py")])
    assert result.exit_code == 1
    assert "lint.E013" in result.stdout and "ordering.py:12:" in result.stdout
    assert "fix:" in result.stdout and "\x1b[" not in result.stdout


def test_markdown():
    result = invoke([str(SCRIPTS / "ordering.py"), "--format", "markdown"])
    assert result.exit_code == 1 and "| error | `lint.E013` |" in result.stdout


def test_stdin_with_a_name():
    result = invoke(["-", "--stdin-filename", "train.py", "--format", "json"], input=BROKEN_P2P)
    assert result.exit_code == 1
    (finding,) = json.loads(result.stdout)["findings"]
    assert finding["data"]["path"] == "train.py" and finding["data"]["line"] == 2


def test_select_and_ignore_by_id_glob_and_prefix():
    path = str(SCRIPTS / "p2p_requests.py")

    def ids(*extra):
        return {f["id"] for f in json.loads(invoke([path, "-f", "json", *extra]).stdout)["findings"]}

    assert ids() == {"lint.E002", "lint.W003"}
    assert ids("--select", "lint.W003") == {"lint.W003"}
    assert ids("--select", "lint.W*") == {"lint.W003"}
    assert ids("--ignore", "lint.E") == {"lint.W003"}
    assert ids("--select", "lint.E002,lint.W003", "--ignore", "lint.E002") == {"lint.W003"}


def test_unknown_rule_missing_path_and_bad_format_are_usage_errors(tmp_path):
    assert invoke([str(SCRIPTS), "--select", "lint.X999"]).exit_code == 2
    assert invoke([str(tmp_path / "nope.py")]).exit_code == 2
    assert invoke([str(SCRIPTS), "--format", "xml"]).exit_code == 2


def test_config_in_pyproject(tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text(
        '[tool.distdoctor]\nfail_level = "error"\n\n'
        '[tool.distdoctor.lint]\nignore = ["lint.E002"]\nexclude = ["vendored"]\n')
    (tmp_path / "train.py").write_text(BROKEN_P2P + "req = dist.irecv(t, 0)\n")
    (tmp_path / "vendored").mkdir()
    (tmp_path / "vendored" / "x.py").write_text(BROKEN_P2P)
    monkeypatch.chdir(tmp_path)
    result = invoke([".", "-f", "json"])
    assert result.exit_code == 0, result.stdout
    assert [(f["id"], f["data"]["path"]) for f in json.loads(result.stdout)["findings"]] == [
        ("lint.W003", "./train.py")]
    # The command line wins over the file.
    assert invoke([".", "--ignore", "lint.W003"]).exit_code == 1
    # `check` reads the same pyproject.toml and accepts the lint table.
    from distdoctor.core.config import load_config

    assert load_config(cwd=tmp_path).fail_level.label == "error"


def test_bad_config_is_a_usage_error(tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text('[tool.distdoctor.lint]\nselekt = ["lint.E002"]\n')
    (tmp_path / "a.py").write_text("x = 1\n")
    monkeypatch.chdir(tmp_path)
    result = invoke(["a.py"])
    assert result.exit_code == 2 and "selekt" in result.output


@pytest.fixture(scope="module")
def sarif_schema():
    return json.loads((HERE / "sarif-schema-2.1.0.json").read_text())


def test_sarif_validates_against_the_official_schema(sarif_schema, tmp_path):
    (tmp_path / "suppressed.py").write_text("import torch.distributed as dist\ndist.isend(t, 1)  # distdoctor: ignore\n")
    (tmp_path / "broken.py").write_text("def f(:\n")
    result = invoke([str(SCRIPTS), str(tmp_path), "--format", "sarif"])
    assert result.exit_code == 1
    log = json.loads(result.stdout)
    jsonschema.Draft7Validator.check_schema(sarif_schema)
    jsonschema.Draft7Validator(sarif_schema).validate(log)
    run = log["runs"][0]
    rules = run["tool"]["driver"]["rules"]
    assert log["version"] == "2.1.0" and {r["id"] for r in rules} >= {"lint.E002", "lint.W001", "lint.I014"}
    results = run["results"]
    levels = {r["ruleId"]: r["level"] for r in results}
    assert levels["lint.E002"] == "error" and levels["lint.W003"] == "warning" and levels["lint.I014"] == "note"
    for r in results:
        assert rules[r["ruleIndex"]]["id"] == r["ruleId"]
        assert r["locations"][0]["physicalLocation"]["region"]["startLine"] >= 1
    suppressed = [r for r in results if r.get("suppressions")]
    assert [r["locations"][0]["physicalLocation"]["region"]["startLine"] for r in suppressed] == [2]


def test_sarif_validation_would_catch_a_broken_log(sarif_schema):
    result = invoke([str(SCRIPTS / "ordering.py"), "--format", "sarif"])
    log = json.loads(result.stdout)
    log["runs"][0]["results"][0]["level"] = "fatal"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(sarif_schema).validate(log)


def test_sarif_paths_are_relative_to_the_working_directory(monkeypatch):
    monkeypatch.chdir(REPO)
    result = invoke(["tests/lint/scripts/ordering.py", "--format", "sarif"])
    location = json.loads(result.stdout)["runs"][0]["results"][0]["locations"][0]["physicalLocation"]
    assert location["artifactLocation"] == {"uri": "tests/lint/scripts/ordering.py", "uriBaseId": "SRCROOT"}


def test_as_a_process_from_stdin_never_a_traceback():
    proc = subprocess.run(distdoctor_cmd("lint", "-", "--format", "json"), input="def broken(:\n",
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    (finding,) = json.loads(proc.stdout)["findings"]
    assert finding["id"] == "lint.W001" and "Traceback" not in proc.stderr
