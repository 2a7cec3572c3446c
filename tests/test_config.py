import pytest

from distdoctor.core.config import ConfigError, load_config
from distdoctor.core.findings import Severity


def write_pyproject(tmp_path, body):
    path = tmp_path / "pyproject.toml"
    path.write_text(body)
    return path


def test_defaults(tmp_path):
    config = load_config({}, env={}, cwd=tmp_path)
    assert config.fail_level is Severity.ERROR
    assert config.timeout == 60.0
    assert config.stages == ("local", "rendezvous", "collective")
    assert config.sources["timeout"] == "default"


def test_precedence_cli_over_env_over_pyproject(tmp_path):
    write_pyproject(tmp_path, '[tool.distdoctor]\ntimeout = 30\nfail-level = "warning"\nsilence = ["net.W001"]\n')
    env = {"DISTDOCTOR_TIMEOUT": "20", "DISTDOCTOR_SILENCE": "a.W001,b.W002"}
    config = load_config({"timeout": 10}, env=env, cwd=tmp_path)
    assert config.timeout == 10.0 and config.sources["timeout"] == "--timeout"
    assert config.silence == ("a.W001", "b.W002")
    assert config.sources["silence"] == "environment variable DISTDOCTOR_SILENCE"
    assert config.fail_level is Severity.WARNING
    assert "pyproject.toml [tool.distdoctor] fail-level" in config.sources["fail_level"]
    assert load_config({}, env={}, cwd=tmp_path).timeout == 30.0


def test_pyproject_is_found_in_a_parent_directory(tmp_path):
    write_pyproject(tmp_path, "[tool.distdoctor]\ncheck-timeout = 2.5\n")
    nested = tmp_path / "a" / "b"
    nested.mkdir(parents=True)
    assert load_config({}, env={}, cwd=nested).check_timeout == 2.5


@pytest.mark.parametrize(
    "source, expected",
    [
        ({"env": {"DISTDOCTOR_TIMEOUT": "soon"}}, "environment variable DISTDOCTOR_TIMEOUT"),
        ({"env": {"DISTDOCTOR_FAIL_LEVEL": "fatal"}}, "DISTDOCTOR_FAIL_LEVEL: unknown severity"),
        ({"cli": {"stages": ["local", "warmup"]}}, "--stages"),
        ({"cli": {"timeout": -1}}, "positive"),
        ({"pyproject": "[tool.distdoctor]\ntimeout = true\n"}, "[tool.distdoctor] timeout"),
        ({"pyproject": "[tool.distdoctor]\ncolour = 1\n"}, "unknown setting 'colour'"),
        ({"pyproject": "[tool.distdoctor\ntimeout = 1\n"}, "is not valid TOML"),
        ({"pyproject": "[tool]\ndistdoctor = 3\n"}, "must be a table"),
        ({"pyproject": "[tool.distdoctor]\nsilence = [1, 2]\n"}, "silence"),
    ],
)
def test_bad_values_name_their_source(tmp_path, source, expected):
    if "pyproject" in source:
        write_pyproject(tmp_path, source["pyproject"])
    with pytest.raises(ConfigError) as info:
        load_config(source.get("cli", {}), env=source.get("env", {}), cwd=tmp_path)
    assert expected in str(info.value)


def test_unrelated_distdoctor_variables_are_ignored(tmp_path):
    assert load_config({}, env={"DISTDOCTOR_SITE_IFACE": "ib0"}, cwd=tmp_path).timeout == 60.0
