"""The adversarial matrix: hostile environment values, configuration, --checks-dir plugins and
secrets, each case with the promise it tests — never a traceback, never past the deadline + 2 s,
never an empty output, never a secret in any output.

Cases run in-process where only the logic matters (configuration, redaction, a local run on a
fuzzed environment) and through the CLI where the exit path matters (exit code, the report
written before the exit, output not corrupted by plugins).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from distdoctor.core.config import ConfigError, load_config
from distdoctor.core.findings import FindingKind
from distdoctor.core.redact import REDACTED, redact_text, scrub, secret_values
from distdoctor.core.report import build_report

REPO = Path(__file__).resolve().parents[2]
SECRETS = ("s3cretpw9", "hunter2secret", "hf_abcdefghijklmnopqrst", "tok3n5ecret", "ghp_0123456789abcdefABCDEF")
# What the CLI cases leave to the machine: starting the interpreter on a loaded 2-core host is
# inside the deadline (it counts from the process's start), so only the deadline's slack is added.
SLACK_S = 2.0


# -- in-process: configuration ------------------------------------------------------------------

BAD_CONFIG = [
    ({"timeout": 1e9}, {}, "at most"),
    ({"timeout": 1e14}, {}, "at most"),
    ({"timeout": 1e300, "check_timeout": 1e300}, {}, "at most"),
    ({}, {"DISTDOCTOR_TIMEOUT": "1e308"}, "at most"),
    ({}, {"DISTDOCTOR_TIMEOUT": "1e400"}, "at most"),
    ({}, {"DISTDOCTOR_TIMEOUT": "nan"}, "positive"),
    ({}, {"DISTDOCTOR_TIMEOUT": "-1"}, "positive"),
    ({}, {"DISTDOCTOR_CHECK_TIMEOUT": "9" * 400}, "at most"),
    ({}, {"DISTDOCTOR_NPROC": "99999999999999999999999"}, "positive integer"),
    ({}, {"DISTDOCTOR_NPROC": "²"}, "positive integer"),
    ({}, {"DISTDOCTOR_NPROC": "100000"}, "at most 1024"),
    ({}, {"DISTDOCTOR_STAGES": ""}, "at least one"),
    ({}, {"DISTDOCTOR_STAGES": ","}, "at least one"),
    ({"stages": ["local", "x" * 5000]}, {}, "characters"),
    ({}, {"DISTDOCTOR_FORMAT": "\x1b]0;title\x07"}, "expected one of"),
]


@pytest.mark.parametrize("cli,env,message", BAD_CONFIG, ids=[str(i) for i in range(len(BAD_CONFIG))])
def test_bad_configuration_is_a_config_error(tmp_path, cli, env, message):
    with pytest.raises(ConfigError) as info:
        load_config(cli, env=env, cwd=tmp_path)
    assert message in str(info.value) and len(str(info.value)) < 400


BAD_PYPROJECT = [
    ("[tool.distdoctor]\nstages = []\n", "at least one"),
    ("[tool.distdoctor]\ntimeout = " + "[" * 5000 + "]" * 5000 + "\n", "nested too deeply"),
    ("[tool.distdoctor]\ntimeout = " + "9" * 500 + "\n", "at most"),
    ("[tool.distdoctor]\ntimeout = inf\n", "at most"),
    ("[tool.distdoctor]\nsilence = " + "[" * 900 + '"a"' + "]" * 900 + "\n", None),
]


@pytest.mark.parametrize("body,message", BAD_PYPROJECT, ids=[str(i) for i in range(len(BAD_PYPROJECT))])
def test_bad_pyproject_is_a_config_error(tmp_path, body, message):
    (tmp_path / "pyproject.toml").write_text(body)
    try:
        load_config({}, env={}, cwd=tmp_path)
    except ConfigError as exc:
        assert message is None or message in str(exc)
    else:
        assert message is None


# -- in-process: secrets -----------------------------------------------------------------------

LEAKY_TEXT = [
    ("MASTER_ADDR=user:s3cretpw9@host", "s3cretpw9"),
    ("user:s3cretpw9@node-a", "s3cretpw9"),
    ("tcp://user:s3cretpw9@node-a:29500", "s3cretpw9"),
    ("held by PID 7 (python srv.py --password hunter2secret --port 1)", "hunter2secret"),
    ("python srv.py --token=hunter2secret", "hunter2secret"),
    ("python srv.py --api-key hunter2secret", "hunter2secret"),
    ("NCCL_IB_HCA=hf_abcdefghijklmnopqrst", "hf_abcdefghijklmnopqrst"),
    ("DATA_FILE=/tmp/x?token=tok3n5ecret&y=1", "tok3n5ecret"),
    ("https://h/x?password=tok3n5ecret", "tok3n5ecret"),
    ("Authorization: Bearer tok3n5ecret", "tok3n5ecret"),
    ("remote ghp_0123456789abcdefABCDEF rejected", "ghp_0123456789abcdefABCDEF"),
    ("key sk-proj0123456789abcdefgh", "sk-proj0123456789abcdefgh"),
    ("AKIAABCDEFGHIJKLMNOP in env", "AKIAABCDEFGHIJKLMNOP"),
    ("xoxb-123456789012-abcdefghijkl", "xoxb-123456789012-abcdefghijkl"),
    ("opaque aZ3kP9qLm2Xv8Rt1Yw6Nb4Hc7Jd5Fg0Se value", "aZ3kP9qLm2Xv8Rt1Yw6Nb4Hc7Jd5Fg0Se"),
]
HARMLESS_TEXT = [
    "MASTER_ADDR=node-a MASTER_PORT=29500", "tcp://[::1]:29500", "GPU-5a7f3c1e-1234-5678-9abc-def012345678",
    "/home/User1/projects/MyModel2024/checkpoints/step_000100.pt", "torch 2.13.0+cu121",
    "the token is missing from the environment", "task-abcdefghijklmnopqrstuvwxyz",
    "git 0123456789abcdef0123456789abcdef01234567", "rank 3 on node-a:29500", "NCCL_SOCKET_IFNAME=eth0,ib0",
]


@pytest.mark.parametrize("text,secret", LEAKY_TEXT)
def test_secret_shapes_are_redacted(text, secret):
    out = redact_text(text)
    assert secret not in out and REDACTED in out, out


@pytest.mark.parametrize("text", HARMLESS_TEXT)
def test_harmless_text_is_left_alone(text):
    assert redact_text(text) == text


def test_secrets_from_the_environment_leave_no_trace_in_any_field():
    env = {"MASTER_ADDR": "user:s3cretpw9@host", "NCCL_IB_HCA": "hf_abcdefghijklmnopqrst",
           "X_FILE": "/tmp/x?token=tok3n5ecret"}
    kind = FindingKind("t.E001", cause="unknown", title="t", hint="h")
    leaky = kind("cannot resolve s3cretpw9", detail="value hf_abcdefghijklmnopqrst and tok3n5ecret",
                 data={"argv": ["srv", "--password", "hunter2secret"], "password": "x1y2z3"})
    report = build_report([leaky], [{"name": "c", "stage": "local", "status": "fail", "reason": "s3cretpw9"}],
                          secrets=secret_values(env))
    text = json.dumps(report.to_dict())
    assert not any(s in text for s in (*SECRETS, "x1y2z3")), text


@pytest.mark.parametrize("size", [100_000, 1_000_000])
@pytest.mark.parametrize("shape", ["A", "a:", "x@", "a=b&", "Ab1", " --password", "a:b@", "://", "hf_"])
def test_redaction_is_linear(size, shape):
    """A 100 kB or 1 MB value of any shape redacts in well under a deadline a user would set (the
    quadratic pattern took 16 s for 100 kB); bound: a quarter of the default per-check deadline, in CPU
    time (the work itself: wall time on a loaded machine measured the other processes too)."""
    value = (shape * (size // len(shape) + 1))[:size]
    budget = load_config({}, env={}, use_pyproject=False).check_timeout / 4
    started = time.process_time()
    redact_text(value)
    secret_values({"ANY": value})
    assert time.process_time() - started < budget


def test_data_json_cannot_carry_becomes_text():
    kind = FindingKind("t.W001", cause="unknown", title="t", hint="h")
    odd = kind("odd", data={"obj": object(), "set": {1, 2}, 3: b"x", "big": 10**30, "nest": [[[[1]]]]})
    report = build_report([odd])
    assert json.loads(json.dumps(report.to_dict()))["findings"][0]["data"]["big"] == str(10**30)


# -- in-process: a local run on a fuzzed environment ---------------------------------------------

ENV_FUZZ = [
    {"RANK": "A" * 100_000},
    {"FOO": "x" * 1_000_000},
    {"MASTER_ADDR": "user:s3cretpw9@host", "MASTER_PORT": "29500", "RANK": "0", "WORLD_SIZE": "2"},
    {"MASTER_ADDR": "a" * 5000, "MASTER_PORT": "1" * 5000},
    {"MASTER_PORT": "-1", "RANK": "-5", "WORLD_SIZE": "0"},
    {"MASTER_ADDR": "\x1b]0;pwned\x07host", "MASTER_PORT": "29500"},
    {"WORLD_SIZE": "99999999999999999999999", "RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"},
    {"NCCL_IB_HCA": "hf_abcdefghijklmnopqrst", "NCCL_DEBUG_FILE": "/tmp/x?token=tok3n5ecret"},
    {"CUDA_VISIBLE_DEVICES": "," * 10_000},
    {"NCCL_SOCKET_IFNAME": "^" + "=" * 3000},
    {"LOCAL_RANK": "1e9", "LOCAL_WORLD_SIZE": "nan"},
]


@pytest.mark.parametrize("extra", ENV_FUZZ, ids=[str(i) for i in range(len(ENV_FUZZ))])
def test_local_run_on_fuzzed_environment(extra, clean_env):
    from distdoctor.core.render import render
    from distdoctor.machine.host import diagnose_here

    config = load_config({"stages": ["local"], "timeout": 20}, env={}, use_pyproject=False)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("DISTDOCTOR_")}, **extra}
    started = time.monotonic()
    report = diagnose_here(config, env=env, argv=["distdoctor", "check"])
    assert time.monotonic() - started < config.timeout + SLACK_S
    outputs = [render(report, "json"), render(report, "markdown")]
    json.loads(outputs[0])
    text = "\n".join(outputs)
    assert not any(s in text for s in SECRETS), [s for s in SECRETS if s in text]


# -- through the CLI: exit codes, deadlines, the last word -----------------------------------------


@dataclass
class Case:
    name: str
    args: list[str]
    env: dict[str, str] = field(default_factory=dict)
    codes: tuple[int, ...] = (0, 1)
    deadline: float = 30.0
    json: bool = False
    expect: tuple[str, ...] = ()  # substrings of stdout + stderr
    files: dict[str, str] = field(default_factory=dict)  # relative path -> content, in a temp cwd


PLUGIN_PRINTS = """
from distdoctor import check, finding_kind
print("import-time noise {")
K = finding_kind("site.W901", cause="unknown", title="odd data", hint="h")
@check(stage="local", tags=("adv",), emits=(K,))
def chatty(ctx):
    print("check-time noise {")
    yield K("odd data", data={"obj": object(), "set": {1, 2}, 3: b"x", "big": 10**30})
"""
PLUGIN_EXIT_AT_IMPORT = "import os\nos._exit(0)\n"
PLUGIN_EXIT_IN_CHECK = """
import os
from distdoctor import check
@check(stage="local", tags=("adv",))
def leaves(ctx):
    os._exit(0)
"""
PLUGIN_BLOCKS_AT_IMPORT = "import time\ntime.sleep(3600)\n"
PLUGIN_HOLDS_GIL = """
import re
from distdoctor import check
@check(stage="local", tags=("adv",))
def holds_the_lock(ctx):
    re.match(r"(a+)+$", "a" * 60 + "b")  # catastrophic backtracking: hours inside C, lock held
"""
PLUGIN_CLASH = """
from distdoctor import check
@check(stage="local")
def rendezvous_port(ctx):
    return []
"""
PLUGIN_LATE_LARGE = """
import time
from distdoctor import check, finding_kind
K = finding_kind("site.W902", cause="unknown", title="large", hint="h")
@check(stage="local", tags=("adv",), emits=(K,))
def late_and_large(ctx):
    time.sleep(1)
    yield K("large " + "A" * 1_000_000, detail="x:y@" * 250_000, data={"blob": "a=b&" * 250_000})
"""
DEEP = "[tool.distdoctor]\ntimeout = " + "[" * 5000 + "]" * 5000 + "\n"
LOCAL = ["check", "--stage", "local"]

CLI_CASES = [
    Case("huge RANK value, report before exit", ["check", "--timeout", "8", "--format", "json"],
         env={"RANK": "A" * 100_000}, codes=(1, 3), deadline=8, json=True),
    Case("world size beyond int", ["check", "--world-size", "99999999999999999999999"], codes=(2,),
         expect=("--world-size",)),
    Case("timeout 1e9", [*LOCAL, "--timeout", "1e9"], codes=(2,), expect=("at most",)),
    Case("timeout 1e14", [*LOCAL, "--timeout", "1e14"], codes=(2,), expect=("at most",)),
    Case("timeout 1e300 twice", [*LOCAL, "--timeout", "1e300", "--check-timeout", "1e300"], codes=(2,),
         expect=("at most",)),
    Case("DISTDOCTOR_TIMEOUT=1e308", LOCAL, env={"DISTDOCTOR_TIMEOUT": "1e308"}, codes=(2,),
         expect=("DISTDOCTOR_TIMEOUT",)),
    Case("checks-dir name of 300 characters", [*LOCAL, "--checks-dir", "d" * 300], codes=(2,),
         expect=("cannot be read",)),
    Case("pyproject nested 5000 deep", LOCAL, codes=(2,), files={"pyproject.toml": DEEP},
         expect=("nested too deeply",)),
    Case("stages = []", LOCAL[:1], codes=(2,), files={"pyproject.toml": "[tool.distdoctor]\nstages = []\n"},
         expect=("at least one",)),
    Case("--tag netwrok", [*LOCAL, "--tag", "netwrok"], codes=(2,), expect=("did you mean network",)),
    Case("plugin prints and odd data", [*LOCAL, "--tag", "adv", "--checks-dir", "plugins", "--format", "json"],
         files={"plugins/chatty.py": PLUGIN_PRINTS}, json=True, expect=("site.W901",)),
    Case("plugin's late and large finding, report before exit",
         # 20 s: the local stage's other checks take seconds on a loaded machine (8 s ran out once at load 10)
         [*LOCAL, "--tag", "adv", "--timeout", "20", "--checks-dir", "plugins", "--format", "json"],
         files={"plugins/large.py": PLUGIN_LATE_LARGE}, deadline=20, json=True, expect=("site.W902",)),
    Case("plugin os._exit at import", [*LOCAL, "--checks-dir", "plugins", "--format", "json", "--timeout", "20"],
         files={"plugins/leaves.py": PLUGIN_EXIT_AT_IMPORT}, json=True, expect=("ended the process at import",)),
    Case("plugin os._exit in a check", [*LOCAL, "--tag", "adv", "--checks-dir", "plugins", "--format", "json"],
         files={"plugins/leaves.py": PLUGIN_EXIT_IN_CHECK}, json=True, expect=("ended its process",)),
    Case("plugin blocks at import", [*LOCAL, "--timeout", "5", "--checks-dir", "plugins", "--format", "json"],
         files={"plugins/blocks.py": PLUGIN_BLOCKS_AT_IMPORT}, codes=(1, 3), deadline=5, json=True,
         expect=("did not finish within",)),
    Case("check holds the interpreter lock", [*LOCAL, "--timeout", "5", "--checks-dir", "plugins", "--format", "json"],
         files={"plugins/gil.py": PLUGIN_HOLDS_GIL}, codes=(1, 3), deadline=5, json=True,
         expect=("gil.holds_the_lock",)),
    # list has no --timeout: vetting uses the default per-check deadline (10 s) plus the child's start
    Case("list with a plugin that blocks at import", ["list", "--checks-dir", "plugins", "--format", "json"],
         files={"plugins/blocks.py": PLUGIN_BLOCKS_AT_IMPORT}, codes=(0,), deadline=12, json=True,
         expect=("did not finish within",)),
    Case("site network.py shadowing a built-in", [*LOCAL, "--checks-dir", "plugins", "--format", "json", "--timeout", "20"],
         files={"plugins/network.py": PLUGIN_CLASH}, json=True, expect=("already registered by builtin network",)),
    Case("secrets in MASTER_ADDR and harmless names (json)", [*LOCAL, "--format", "json", "--timeout", "20"],
         env={"MASTER_ADDR": "user:s3cretpw9@host", "MASTER_PORT": "29500", "NCCL_IB_HCA": "hf_abcdefghijklmnopqrst",
              "X_FILE": "/tmp/x?token=tok3n5ecret"}, json=True),
    Case("secrets (markdown)", [*LOCAL, "--format", "markdown", "--timeout", "20"],
         env={"MASTER_ADDR": "user:s3cretpw9@host", "MASTER_PORT": "29500"}),
    Case("secrets (plain text)", [*LOCAL, "--timeout", "20", "-v"],
         env={"MASTER_ADDR": "user:s3cretpw9@host", "MASTER_PORT": "29500"}),
    Case("secrets in a rank of a world (json)", ["check", "--timeout", "15", "--format", "json", "-v"],
         env={"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "user:s3cretpw9@host",
              "MASTER_PORT": "29512"}, codes=(1, 3), deadline=15, json=True),
    Case("list with a plugin that prints", ["list", "--checks-dir", "plugins", "--format", "json"],
         files={"plugins/chatty.py": PLUGIN_PRINTS}, codes=(0,), json=True, expect=("site.W901",)),
    Case("env snapshot", ["env"], env={"MASTER_ADDR": "user:s3cretpw9@host", "NCCL_IB_HCA": "hf_abcdefghijklmnopqrst",
                                       "NCCL_TOPO_FILE": "/tmp/x?token=tok3n5ecret"}, codes=(0,), expect=("NCCL_IB_HCA",)),
    Case("env snapshot (json)", ["env", "--format", "json"], env={"MASTER_ADDR": "user:s3cretpw9@host",
         "NCCL_IB_HCA": "hf_abcdefghijklmnopqrst", "NCCL_TOPO_FILE": "/tmp/x?token=tok3n5ecret"}, codes=(0,), json=True),
]


def _run_case(case: Case, cwd: Path, extra_env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, float]:
    """Run the CLI; (its result, seconds until its first word, on stdout or stderr).

    The first word is what the deadline promises: a report (or a usage error) by then. The
    interpreter's teardown after it (up to a few seconds when torch was still loading on an
    abandoned thread) is bounded separately, by the slack of the final wait.
    """
    for rel, content in case.files.items():
        (cwd / rel).parent.mkdir(parents=True, exist_ok=True)
        (cwd / rel).write_text(textwrap.dedent(content))
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISTDOCTOR_")}
    env.update({"PYTHONPATH": str(REPO), **case.env, **(extra_env or {})})
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "distdoctor", *case.args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    first: list[float] = []
    chunks: dict[int, list[bytes]] = {1: [], 2: []}

    def drain(stream, key: int) -> None:
        while True:
            chunk = stream.read1(65536)
            if not chunk:
                return
            if not first:
                first.append(time.monotonic() - started)
            chunks[key].append(chunk)

    readers = [threading.Thread(target=drain, args=(proc.stdout, 1), daemon=True),
               threading.Thread(target=drain, args=(proc.stderr, 2), daemon=True)]
    for reader in readers:
        reader.start()
    try:
        proc.wait(timeout=case.deadline + 30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    for reader in readers:
        reader.join(timeout=10)
    out, err = (b"".join(chunks[k]).decode("utf-8", "replace") for k in (1, 2))
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), (first[0] if first else float("inf"))


def _assert_promises(case: Case, result: subprocess.CompletedProcess, wall: float) -> None:
    both = result.stdout + result.stderr
    assert "Traceback" not in both, both[-3000:]
    assert result.returncode in case.codes, (result.returncode, both[-3000:])
    assert wall < case.deadline + SLACK_S, f"{case.name}: first word after {wall:.1f}s, deadline {case.deadline}s"
    assert both.strip(), f"{case.name}: no output at all"
    leaked = [s for s in SECRETS if s in both]
    assert not leaked, (leaked, both[-3000:])
    if case.json:
        json.loads(result.stdout)  # exactly one JSON document: nothing printed around it
    for text in case.expect:
        assert text in both, (text, both[-3000:])


# extended: "secrets in MASTER_ADDR and harmless names (json)" covers this path (the report is scrubbed before any
# renderer draws it); markdown is another output format of it
EXTENDED_CASES = {"secrets (markdown)"}


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name, marks=pytest.mark.extended if c.name in EXTENDED_CASES else ())
                                  for c in CLI_CASES])
def test_cli_case(case, tmp_path):
    result, wall = _run_case(case, tmp_path)
    _assert_promises(case, result, wall)


HOLDER = """
import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
print(s.getsockname()[1], flush=True)
time.sleep(120)
"""


def test_port_holders_command_line_is_redacted(tmp_path):
    """The port-in-use finding quotes the holder's command line: its --password must not show."""
    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    holder = subprocess.Popen([sys.executable, str(script), "--password", "hunter2secret"], stdout=subprocess.PIPE,
                              text=True)
    try:
        port = holder.stdout.readline().strip()
        case = Case("port held", [*LOCAL, "--format", "json", "--timeout", "20"], json=True,
                    env={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "RANK": "0", "WORLD_SIZE": "2",
                         "LOCAL_RANK": "0"})
        result, wall = _run_case(case, tmp_path)
        _assert_promises(case, result, wall)
        report = json.loads(result.stdout)
        held = [f for f in report["findings"] if f["cause"] == "port_in_use"]
        assert held and "holder.py --password <redacted>" in json.dumps(held), held
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=10)
