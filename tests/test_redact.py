import pytest

from distdoctor.core.findings import FindingKind
from distdoctor.core.redact import REDACTED, is_secret_name, redact_env, secret_values
from distdoctor.core.report import build_report


@pytest.mark.parametrize(
    "name", ["HF_TOKEN", "WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD", "GITHUB_TOKEN",
             "GOOGLE_APPLICATION_CREDENTIALS", "MY_PASSWD", "SSH_PRIVATE_KEY", "OPENAI_APIKEY", "auth"],
)
def test_secret_names(name):
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ["MASTER_ADDR", "NCCL_IB_PKEY", "PWD", "MONKEY", "NCCL_SOCKET_IFNAME", "KEYBOARD"])
def test_ordinary_names(name):
    assert not is_secret_name(name)


def test_url_passwords_are_redacted_in_any_value():
    env = {"DATA_URL": "https://alice:hunter22@example.org/x"}
    assert redact_env(env)["DATA_URL"] == f"https://alice:{REDACTED}@example.org/x"
    assert "hunter22" in secret_values(env)


def test_report_never_contains_secret_values():
    env = {"HF_TOKEN": "hf_abcdefSECRET", "MASTER_ADDR": "node-a"}
    kind = FindingKind("t.E001", cause="unknown", title="t", hint="h")
    leaky = kind("token hf_abcdefSECRET seen", detail="env HF_TOKEN=hf_abcdefSECRET", data={"v": ["hf_abcdefSECRET"]})
    report = build_report([leaky], secrets=secret_values(env))
    text = str(report.to_dict())
    assert "hf_abcdefSECRET" not in text
    assert REDACTED in report.findings[0].title
