"""A hostile store peer against a real 2-rank world: no traceback, no hang past the deadline, one report.

The test plays the launcher's part (it hosts the c10d store, as torchrun's agent does, and
the ranks connect to it with TORCHELASTIC_USE_AGENT_STORE=True), so it can write what a foreign
process on MASTER_PORT could write, before the ranks arrive: the c10d store has no
authentication. Each case is one entry of the table below.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta

import pytest

from tests.conftest import json_objects

torch_dist = pytest.importorskip("torch.distributed")

pytestmark = pytest.mark.multiproc
RUN_ID = "hostile"
TIMEOUT_S = 20.0
# The deadline is counted from the CLI's start; the interpreter's own start comes before it.
START_SLACK_S = 5.0


def _roster(text: str):
    return lambda store: store.append("roster", text)


def _set(key: str, value: object):
    return lambda store: store.set(key, json.dumps(value) if not isinstance(value, str) else value)


def _claim_one_then(key: str, value: object):
    def write(store):
        store.add("claim/1", 1)
        store.set(key, json.dumps(value))
        store.append("roster", "1:1;")
    return write


# name -> (what the hostile peer writes, finding IDs the report must carry)
CASES = {
    "roster line with a non-ASCII digit": (_roster("²:1;"), {"rdzv.W020"}),
    "roster line with a 5000-digit rank": (_roster("9" * 5000 + ":1;"), {"rdzv.W020"}),
    "roster line whose check-in never comes": (_roster("1:7;"), {"rdzv.W020"}),
    "200k roster lines": (_roster("".join(f"{i}:1;" for i in range(2, 200_002))), {"rdzv.W020"}),
    "check-in whose findings are a number": (_claim_one_then("checkin/1/1", {"findings": 5}), {"rdzv.W015"}),
    "done list with a non-ASCII digit": (lambda s: s.append("done/collective", "²;"), {"rdzv.W020"}),
    "decision whose accepted is a number": (_set("decision", {"accepted": 5, "size": 2}), {"rdzv.W020"}),
    "claim counter of rank 0 bumped": (lambda s: s.add("claim/0", 1), {"rdzv.W020"}),
    "final word that is not an exit code": (_set("final", {"exit": "x"}), {"rdzv.W020"}),
    "claim counter that is not a number": (_set("claim/1", "abc"), {"rdzv.W020"}),
}


def _run_world(write) -> tuple[list[dict], list[str], list[float], list[int]]:
    store = torch_dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                timeout=timedelta(seconds=30))
    write(torch_dist.PrefixStore(f"distdoctor/{RUN_ID}", store))
    procs = []
    try:
        for rank in range(2):
            env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
                   "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(store.port),
                   "TORCHELASTIC_USE_AGENT_STORE": "True", "DISTDOCTOR_RUN_ID": RUN_ID, "OMP_NUM_THREADS": "1"}
            procs.append((time.monotonic(), subprocess.Popen(
                [sys.executable, "-m", "distdoctor", "check", "--format", "json", "--timeout", str(TIMEOUT_S)],
                env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)))
        outs, errs, took, codes = [], [], [], []
        for started, proc in procs:
            try:
                out, err = proc.communicate(timeout=TIMEOUT_S + 2.0 + START_SLACK_S + 10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                out, err = proc.communicate(timeout=10)
            took.append(time.monotonic() - started)
            outs.append(out)
            errs.append(err)
            codes.append(proc.returncode)
        return [o for out in outs for o in json_objects(out)], errs, took, codes
    finally:
        for _, proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        del store


# extended: "roster line with a non-ASCII digit" covers the same refused-roster-line branch (rdzv.W020);
# the 5000-digit rank is one more input of that kind (also a unit case in test_checkin.py)
EXTENDED_CASES = ("roster line with a 5000-digit rank",)


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.extended) if c in EXTENDED_CASES else c
                                  for c in CASES])
def test_a_hostile_store_peer_gets_a_finding_not_a_crash(case):
    write, expected = CASES[case]
    reports, errs, took, codes = _run_world(write)
    assert not any("Traceback" in e for e in errs), "\n".join(e[-3000:] for e in errs)
    assert max(took) <= TIMEOUT_S + 2.0 + START_SLACK_S, took
    assert len(reports) == 1, f"{len(reports)} reports on stdout: {reports}"
    (report,) = reports
    ids = {f["id"] for f in report["findings"]}
    assert expected <= ids, (ids, report["findings"])
    # The hostile entries cost nothing to the real ranks: both checked in and none is missing.
    assert report["world"]["ranks_missing"] == [] and report["world"]["ranks_reported"] == [0, 1], report["world"]
    assert all(c in (0, 1) for c in codes), codes
