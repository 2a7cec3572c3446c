"""A rank that cannot hand its results to rank 0 prints its own complete report, on every path.

Real processes on loopback: a rank started alone against a port where nothing listens, where a
listener refuses the store's handshake, where a listener never accepts (connects dropped), a
rank 0 killed mid-run (its store gone, or a launcher's store that outlives it), a deadline
passing on a non-zero rank while rank 0 is gone, and too little time for the world. The control:
a rank whose rank 0 reported stays quiet on stdout.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import pytest

from tests.conftest import deadline_bound, free_port, json_objects, recent_startup_s

pytestmark = pytest.mark.multiproc


def timeout_s(base: float = 6.0) -> int:
    """The run's deadline: ``base`` seconds of work after torch's start-up on this machine now
    (a rank that spent its whole deadline importing torch would rightly report a cut-off). "Now" is the
    start-up timed within the last two minutes: the session's first figure was outlasted by a load burst
    later in a run (a rank alone before a listener that never accepts was cut off with no finding yet)."""
    return round(base + 2 * recent_startup_s())


def rank_env(rank: int, port: int, **extra: str) -> dict[str, str]:
    scrub = ("DISTDOCTOR_", "TORCHELASTIC_", "SLURM_", "OMPI_", "PMI_", "PMIX_", "JSM_", "PET_", "PYTEST_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(scrub)
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), NO_COLOR="1", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[2]),
                                                        os.environ.get("PYTHONPATH", "")])))
    env.update(extra)
    return env


class Rank:
    def __init__(self, env: dict[str, str], *args: str, timeout: float | None = None, fmt: str = "json") -> None:
        timeout = timeout_s() if timeout is None else timeout
        fmt_args = [] if fmt == "terminal" else ["--format", fmt]
        self.started = time.monotonic()
        self.popen = subprocess.Popen([sys.executable, "-m", "distdoctor", "check", *fmt_args, "--timeout", str(timeout),
                                       *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      start_new_session=True)
        self.timeout = timeout
        self.stdout = self.stderr = ""
        self.code: int | None = None
        self.elapsed = 0.0

    def wait(self) -> "Rank":
        try:
            self.stdout, self.stderr = self.popen.communicate(timeout=deadline_bound(self.timeout) + 30)
        except subprocess.TimeoutExpired:
            self.kill()
            self.stdout, self.stderr = self.popen.communicate(timeout=10)
        self.code = self.popen.returncode
        self.elapsed = time.monotonic() - self.started
        return self

    def kill(self) -> None:
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def describe(self) -> str:
        return f"exit {self.code} after {self.elapsed:.1f}s\nstdout:\n{self.stdout[-3000:]}\nstderr:\n{self.stderr[-3000:]}"


@contextmanager
def ranks(*started: Rank):
    try:
        yield started
    finally:
        for rank in started:
            rank.kill()
            rank.popen.wait(timeout=10)


def own_report(rank: Rank) -> dict:
    """Exactly one JSON object on stdout, this rank's, with its local stage in it."""
    assert "Traceback" not in rank.stderr, rank.describe()
    objects = json_objects(rank.stdout)
    assert len(objects) == 1, f"{len(objects)} reports\n{rank.describe()}"
    (report,) = objects
    assert report["world"]["ranks_reported"] == [1], report["world"]
    local = [c for c in report["checks"] if c["stage"] == "local"]
    assert len(local) >= 10 and all(c["ranks"] == [1] for c in local), local
    return report


def ids(report: dict) -> set[str]:
    return {f["id"] for f in report["findings"]}


# extended: [json] covers this path (rdzv.C001, rank 1's own report) and parses it; only the rendering differs
@pytest.mark.parametrize("fmt", ["json", pytest.param("markdown", marks=pytest.mark.extended),
                                 pytest.param("terminal", marks=pytest.mark.extended)])
def test_a_rank_alone_with_nothing_listening_prints_its_own_report(fmt):
    port = free_port()
    with ranks(Rank(rank_env(1, port), fmt=fmt)) as (rank1,):
        rank1.wait()
    assert rank1.code == 1, rank1.describe()
    assert rank1.elapsed < deadline_bound(rank1.timeout), rank1.describe()
    if fmt == "json":
        report = own_report(rank1)
        (unreachable,) = [f for f in report["findings"] if f["id"] == "rdzv.C001"]
        assert unreachable["ranks"] == [1] and "connection refused" in unreachable["title"], unreachable
        return
    assert "Traceback" not in rank1.stderr, rank1.describe()
    header = "distdoctor report" if fmt == "markdown" else "ERROR: 1 critical"
    assert rank1.stdout.count(header) == 1, rank1.describe()
    assert "rdzv.C001" in rank1.stdout and "nothing listens" in rank1.stdout, rank1.describe()


def test_a_listener_that_refuses_the_stores_handshake_gets_a_report_from_the_rank():
    # Something listens at MASTER_PORT but closes every connection at once: not rank 0's store.
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    server.settimeout(0.2)
    stop = threading.Event()

    def refuse() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            conn.close()

    thread = threading.Thread(target=refuse, daemon=True)
    thread.start()
    try:
        with ranks(Rank(rank_env(1, server.getsockname()[1]))) as (rank1,):
            rank1.wait()
    finally:
        stop.set()
        thread.join(timeout=5)
        server.close()
    assert rank1.code in (1, 3), rank1.describe()
    report = own_report(rank1)
    severe = [f for f in report["findings"] if f["severity"] in ("error", "critical") and 1 in f["ranks"]]
    assert severe, report["findings"]


def test_a_listener_that_never_accepts_gets_a_report_from_the_rank():
    # The accept queue is full and nothing accepts: further connects are dropped (as by a filter).
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(0)
    port = holder.getsockname()[1]
    filler = socket.create_connection(("127.0.0.1", port), timeout=2)
    try:
        with ranks(Rank(rank_env(1, port))) as (rank1,):
            rank1.wait()
    finally:
        filler.close()
        holder.close()
    assert rank1.code in (1, 3), rank1.describe()
    assert rank1.elapsed < deadline_bound(rank1.timeout), rank1.describe()
    report = own_report(rank1)
    severe = [f for f in report["findings"] if f["severity"] in ("error", "critical") and 1 in f["ranks"]]
    assert severe and {f["cause"] for f in severe} & {"port_in_use", "firewall", "master_unreachable"}, severe


def wait_for_file(path: Path, proc: Rank, bound: float) -> None:
    until = time.monotonic() + bound
    while not path.exists():
        assert proc.popen.poll() is None, proc.wait().describe()
        assert time.monotonic() < until, f"{path} never appeared"
        time.sleep(0.05)


def test_rank_0_killed_mid_run_leaves_rank_1_reporting_for_itself(tmp_path):
    # Rank 0 hosts the store; it hangs after the collectives (so rank 1 is past them too) and is
    # killed: its store goes with it, and rank 1 learns that while it waits for the final word.
    port, mark = free_port(), tmp_path / "hung"
    timeout = timeout_s(14)
    rank0 = Rank(rank_env(0, port, DISTDOCTOR_TESTING="1", DISTDOCTOR_TEST_HANG="0:gather",
                          DISTDOCTOR_TEST_HANG_FILE=str(mark)), timeout=timeout)
    rank1 = Rank(rank_env(1, port), timeout=timeout)
    with ranks(rank0, rank1):
        wait_for_file(mark, rank0, deadline_bound(timeout))
        rank0.kill()
        rank1.wait()
    assert rank1.code == 3, rank1.describe()
    report = own_report(rank1)
    assert report["status"] == "incomplete"
    cut = [f for f in report["findings"] if f["id"] == "core.E004"]
    assert cut and 0 in cut[0]["ranks"] and "final report" in cut[0]["detail"], report["findings"]
    passed = {c["name"] for c in report["checks"] if c["stage"] == "collective" and c["status"] == "pass"}
    assert "collective.all_reduce" in passed, report["checks"]


@contextmanager
def launcher_store(with_store: bool = False):
    """A c10d store this test hosts, as torchrun's agent does: it outlives rank 0."""
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60))
    try:
        yield (store.port, store) if with_store else store.port
    finally:
        del store


def test_rank_0_killed_under_a_launchers_store_leaves_rank_1_reporting_at_its_deadline(tmp_path):
    mark = tmp_path / "hung"
    timeout = timeout_s(6)
    with launcher_store() as port:
        agent = {"TORCHELASTIC_USE_AGENT_STORE": "True"}
        rank0 = Rank(rank_env(0, port, DISTDOCTOR_TESTING="1", DISTDOCTOR_TEST_HANG="0:rendezvous",
                              DISTDOCTOR_TEST_HANG_FILE=str(mark), **agent), timeout=timeout)
        rank1 = Rank(rank_env(1, port, **agent), timeout=timeout)
        with ranks(rank0, rank1):
            wait_for_file(mark, rank0, deadline_bound(timeout))
            rank0.kill()
            rank1.wait()
    assert rank1.code in (1, 3), rank1.describe()
    assert rank1.elapsed < deadline_bound(timeout), rank1.describe()
    report = own_report(rank1)
    assert "rdzv.E002" in ids(report), report["findings"]  # rank 0 never published its decision


def test_the_deadline_on_a_hung_rank_1_whose_rank_0_is_gone_gives_rank_1s_report(tmp_path):
    # Both ranks hang after the collectives; rank 0 is killed. Only rank 1's watchdog is left.
    port, mark0, mark1 = free_port(), tmp_path / "hung0", tmp_path / "hung1"
    timeout = timeout_s(9)
    hang = {"DISTDOCTOR_TESTING": "1"}
    rank0 = Rank(rank_env(0, port, DISTDOCTOR_TEST_HANG="0:gather", DISTDOCTOR_TEST_HANG_FILE=str(mark0), **hang),
                 timeout=timeout)
    rank1 = Rank(rank_env(1, port, DISTDOCTOR_TEST_HANG="1:gather", DISTDOCTOR_TEST_HANG_FILE=str(mark1), **hang),
                 timeout=timeout)
    with ranks(rank0, rank1):
        wait_for_file(mark0, rank0, deadline_bound(timeout))
        wait_for_file(mark1, rank1, deadline_bound(timeout))
        rank0.kill()
        rank1.wait()
    assert rank1.code == 3, rank1.describe()
    assert rank1.elapsed < deadline_bound(timeout), rank1.describe()
    report = own_report(rank1)
    (cut,) = [f for f in report["findings"] if f["id"] == "core.E004"]
    assert cut["check"] == "watchdog" and cut["ranks"] == [0, 1] and cut["data"]["rank0_final_word"] is False, cut


def test_a_hung_rank_1_stays_quiet_when_rank_0_reported_for_it(tmp_path):
    # The control: rank 0 is alive, names rank 1 as stuck and leaves its final word.
    port, mark = free_port(), tmp_path / "hung1"
    timeout = timeout_s(6)
    rank0 = Rank(rank_env(0, port), timeout=timeout)
    rank1 = Rank(rank_env(1, port, DISTDOCTOR_TESTING="1", DISTDOCTOR_TEST_HANG="1:gather",
                          DISTDOCTOR_TEST_HANG_FILE=str(mark)), timeout=timeout)
    with ranks(rank0, rank1):
        rank0.wait()
        rank1.wait()
    assert rank0.code == 3, rank0.describe()
    (report,) = json_objects(rank0.stdout)
    (cut,) = [f for f in report["findings"] if f["id"] == "core.E004"]
    assert 1 in cut["ranks"], cut
    assert rank1.stdout.strip() == "", rank1.describe()
    assert rank1.code == 3, rank1.describe()


def test_a_rank_1_with_too_little_time_for_the_world_reports_for_itself():
    port = free_port()
    with ranks(Rank(rank_env(1, port), timeout=1)) as (rank1,):
        rank1.wait()
    assert rank1.code == 3, rank1.describe()
    assert "Traceback" not in rank1.stderr, rank1.describe()
    reports = json_objects(rank1.stdout)
    if not reports:
        # A 1 s deadline ends the run before or after the rank has read its world, as the load has it. After,
        # in its local stage, the one-report rule holds: it says so in one line on stderr, names the stage and
        # leaves the report to rank 0 (a CI run on a loaded machine took this path).
        said = [line for line in rank1.stderr.splitlines() if line.startswith("distdoctor: rank 1 of 2")]
        assert len(said) == 1 and "core.E004" in said[0], rank1.describe()
        line = said[0]
        assert "did not finish before the run's deadline" in line and "--all-ranks" in line, rank1.describe()
        return
    (report,) = reports
    assert report["status"] == "incomplete" and report["world"]["ranks_reported"] == [1], report
    assert ids(report) & {"core.E004", "core.E005"}, report["findings"]


def test_a_rank_1_whose_environment_describes_no_usable_world_reports_for_itself():
    env = rank_env(1, free_port())
    del env["MASTER_ADDR"]
    with ranks(Rank(env)) as (rank1,):
        rank1.wait()
    assert rank1.code == 1, rank1.describe()
    report = own_report(rank1)
    assert any(f["id"].startswith("launch.") and 1 in f["ranks"] for f in report["findings"]), report["findings"]
    skipped = [c for c in report["checks"] if c["stage"] != "local"]
    assert skipped and all(c["status"] == "skip" and "usable world" in c["reason"] for c in skipped), skipped


def test_an_interrupted_rank_1_whose_rank_0_never_came_reports_for_itself():
    from torch.distributed import PrefixStore

    timeout = timeout_s(30)
    with launcher_store(with_store=True) as (port, store):
        rank1 = Rank(rank_env(1, port, TORCHELASTIC_USE_AGENT_STORE="True"), timeout=timeout)
        with ranks(rank1):
            world = PrefixStore("distdoctor/default", store)
            until = time.monotonic() + deadline_bound(timeout)
            while not world.check(["roster"]):  # rank 1 has checked in and waits for rank 0
                assert rank1.popen.poll() is None and time.monotonic() < until, rank1.wait().describe()
                time.sleep(0.05)
            os.kill(rank1.popen.pid, signal.SIGINT)
            rank1.wait()
    assert rank1.code == 130, rank1.describe()
    report = own_report(rank1)
    (cut,) = [f for f in report["findings"] if f["id"] == "core.E006"]
    assert cut["ranks"] == [0, 1] and cut["data"]["signal"] == "SIGINT", cut


def test_a_run_cut_off_while_it_still_waits_for_the_store_names_what_the_connects_met():
    # The watchdog's partial report of a rank whose deadline passed mid-connect reads the
    # attempts made so far (the same judgement as a finished wait), not only "cut off".
    from distdoctor.world.store_open import WorldSpec, verdict_so_far

    spec = WorldSpec(rank=1, world_size=2, master_addr="127.0.0.1", master_port=29500, store_host="rank0",
                     namespace="test", launcher="manual")
    assert verdict_so_far(spec, []) is None
    error = verdict_so_far(spec, [("timeout", "no answer within 2s", "127.0.0.1")] * 2)
    assert error.cause == "firewall" and error.data["attempts"] == 2 and "127.0.0.1:29500" in str(error)
