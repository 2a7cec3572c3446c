"""`distdoctor stacks` on real torchrun jobs (DDP on gloo): the hung ones named by rank and line on the first
verdict, the busy one never alarmed, the job left running."""

from __future__ import annotations

import pytest

from tests.stacks.stacks_jobs import TRAIN, distdoctor, finding, hung_job, ids, line_of, report_of, stacks_once

SLEEP_LINE = line_of("time.sleep(3600)")
BACKWARD_LINE = line_of("loss.backward()")
INIT_LINE = line_of("dist.init_process_group(")
RECV_LINE = line_of("dist.recv(")


@pytest.fixture(scope="module")
def sleeping_rank(tmp_path_factory):
    """2 ranks: rank 1 in time.sleep, rank 0 waiting in DDP's gradient all-reduce."""
    with hung_job(tmp_path_factory.mktemp("sleep2"), "sleep", 2) as job:
        yield job


def test_the_sleeping_rank_is_named_with_its_line_and_the_job_keeps_running(sleeping_rank):
    report, code = stacks_once([str(sleeping_rank.pid)])
    late = finding(report, "job.E002")
    assert late is not None, ids(report)
    assert late["ranks"] == [1] and late["cause"] == "straggler_rank"
    assert f"train.py:{SLEEP_LINE}" in late["title"] and "time.sleep(3600)" in late["title"]
    assert f"train.py:{BACKWARD_LINE}" in late["detail"] and "backward (DDP's gradient all-reduce)" in late["detail"]
    assert code == 1
    # The evidence over time: both ranks stayed still across at least three reads over a second.
    assert "rank 0 stayed still in backward (DDP's gradient all-reduce)" in late["detail"]
    assert "rank 1 stayed still at" in late["detail"]
    job = report["data"]["stacks"]["jobs"][0]
    assert min(job["reads"].values()) >= 3 and set(job["history"]) == {"0", "1"}
    groups = finding(report, "stacks.I002")
    assert groups["data"]["groups"] == [[0], [1]]
    assert sleeping_rank.alive() and all(_alive(pid) for pid in sleeping_rank.rank_pids().values())


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_worker_pids_given_by_hand_are_read_alike(sleeping_rank):
    pids = [str(p) for _, p in sorted(sleeping_rank.rank_pids().items())]
    report, _ = stacks_once(pids)
    assert (finding(report, "job.E002") or {}).get("ranks") == [1], report["findings"]
    job = report["data"]["stacks"]["jobs"][0]
    assert sorted(s["pid"] for s in job["snapshots"]) == sorted(int(p) for p in pids)
    # Every thread of every rank is in the JSON report, frames innermost first as py-spy gives them.
    main = next(t for t in job["threads"]["1"] if t["name"] == "MainThread")
    assert main["frames"][0]["line"] == SLEEP_LINE


def test_native_frames_confirm_ddp_gradient_all_reduce(sleeping_rank):
    report, _ = stacks_once(["--native", str(sleeping_rank.pid)])
    assert (finding(report, "job.E002") or {}).get("ranks") == [1], report["findings"]
    waiting = next(s for s in report["data"]["stacks"]["jobs"][0]["snapshots"] if s["rank"] == 0)
    assert waiting["in_collective"] == "backward (DDP's gradient all-reduce)"
    assert any("c10d::Reducer" in n for n in waiting["notes"]), waiting["notes"]
    assert sleeping_rank.alive()


# extended: test_the_sleeping_rank_is_named_with_its_line_and_the_job_keeps_running covers this path (json)
@pytest.mark.extended
def test_markdown_and_terminal_reports_name_the_rank(sleeping_rank):
    for fmt in ("markdown", "rich"):
        result = distdoctor("stacks", "--format", fmt, str(sleeping_rank.pid))
        assert result.returncode == 1 and "Traceback" not in result.stderr
        assert "job.E002" in result.stdout and f"train.py:{SLEEP_LINE}" in result.stdout


def test_py_spy_missing_from_path_is_a_finding(sleeping_rank):
    from tests.stacks.stacks_jobs import child_env

    result = distdoctor("stacks", "--format", "json", str(sleeping_rank.pid), env=child_env(PATH="/nonexistent"))
    report = report_of(result)
    missing = finding(report, "stacks.E002")
    assert missing is not None and result.returncode == 1, ids(report)
    assert "/nonexistent" in missing["detail"]
    assert list(missing["data"]["jobs"].values())[0], missing["data"]


def test_four_ranks_one_asleep_three_in_backward_beside_another_job(tmp_path, sleeping_rank):
    with hung_job(tmp_path, "sleep", 4) as job:
        # No PID: every job on the node (the 2-rank job too, and whatever else runs here);
        # this one is told apart by its ranks' PIDs.
        pids = set(job.rank_pids().values())
        other = set(sleeping_rank.rank_pids().values())

        def ours(report, pids=pids):
            return [f for f in report["findings"] if f["id"] == "job.E002" and _job_pids(report, f) == pids]

        report, _ = stacks_once([])
        late = ours(report)
        assert late and late[0]["ranks"] == [1], ids(report)
        key = late[0]["data"]["job"]
        assert late[0]["detail"].startswith(f"job {key}\n")
        groups = [f for f in report["findings"] if f["id"] == "stacks.I002" and _job_pids(report, f) == pids]
        assert groups[0]["title"] == "ranks 0, 2-3 share one stack; rank 1 differs"
        several = finding(report, "stacks.I001")
        assert several is not None and key in several["data"]["jobs"]
        assert ours(report, other)[0]["data"]["job"] in several["data"]["jobs"]
        assert job.alive() and sleeping_rank.alive()


def _job_pids(report: dict, found: dict) -> set[int]:
    jobs = report["data"]["stacks"]["jobs"]
    key = found.get("data", {}).get("job", jobs[0]["job"] if len(jobs) == 1 else None)
    job = next((j for j in jobs if j["job"] == key), None)
    return {s["pid"] for s in job["snapshots"] if s["pid"] is not None} if job else set()


def test_a_rank_that_exited_is_named_with_its_exit_code_while_the_others_wait(tmp_path):
    # --monitor-interval: torchrun looks at its workers rarely, so the dead rank stays a zombie
    # whose exit status /proc still holds (torchrun would otherwise end the job at once).
    with hung_job(tmp_path, "early_exit", 4, "--monitor-interval", "3600") as job:
        report, code = stacks_once([str(job.pid)])
        dead = finding(report, "job.E004")
        assert dead is not None, ids(report)
        assert dead["ranks"] == [3] and dead["cause"] == "rank_missing"
        assert "exited with code 3" in dead["title"]
        assert "init_process_group (rendezvous)" in dead["detail"] and f"train.py:{INIT_LINE}" in dead["detail"]
        assert code == 1 and job.alive()


def test_every_rank_waiting_in_a_recv_no_peer_matches_is_a_p2p_deadlock(tmp_path):
    with hung_job(tmp_path, "recv", 2) as job:
        report, _ = stacks_once([str(job.pid)])
        hang = finding(report, "job.E006")
        assert hang is not None and hang["ranks"] == [0, 1], ids(report)
        assert "point-to-point" in hang["title"] and "recv" in hang["title"]
        assert f"train.py:{RECV_LINE}" in hang["detail"] and "batch_isend_irecv" in hang["remediation"]
        assert finding(report, "job.E009") is None
        assert job.alive()


def test_reading_the_stacks_sends_the_job_no_signal_and_no_ptrace(sleeping_rank, tmp_path):
    """strace on distdoctor and its py-spy children: no kill, tgkill, ptrace or memory write aimed
    at any process of the job (py-spy --nonblocking only reads with process_vm_readv)."""
    import shutil
    import subprocess
    import sys

    from tests.stacks.stacks_jobs import child_env

    if shutil.which("strace") is None:
        pytest.skip("strace not installed")
    trace = tmp_path / "strace.txt"
    calls = "kill,tgkill,tkill,ptrace,process_vm_writev,pidfd_send_signal,rt_sigqueueinfo,rt_tgsigqueueinfo"
    done = subprocess.run(["strace", "-f", "-qq", "-e", f"trace={calls}", "-o", str(trace), sys.executable, "-m",
                           "distdoctor", "stacks", "--format", "json", str(sleeping_rank.pid)],
                          capture_output=True, text=True, timeout=120, env=child_env())
    if done.returncode not in (0, 1) and "ptrace" in done.stderr:
        pytest.skip(f"strace cannot run here: {done.stderr[-300:]}")
    assert finding(report_of(done), "job.E002") is not None
    job_pids = {str(p) for p in (sleeping_rank.pid, *sleeping_rank.rank_pids().values())}
    syscalls = [line for line in trace.read_text().splitlines() if "(" in line and not line.split(maxsplit=1)[1].startswith(("---", "+++"))]
    aimed = [line for line in syscalls if any(f"({pid}," in line or f", {pid}," in line for pid in job_pids)]
    assert not aimed, aimed
    assert not [line for line in syscalls if "ptrace(" in line], syscalls[:5]
    assert sleeping_rank.alive()


def test_one_rank_given_alone_is_read_and_the_others_are_not_called_missing(sleeping_rank):
    rank0 = sleeping_rank.rank_pids()[0]
    report, _ = stacks_once([str(rank0)])
    partial = finding(report, "stacks.W003")
    assert partial["title"] == "The verdict covers ranks 0 of 2 only", ids(report)
    # Rank 0 waits; whether rank 1 does was not seen: no "every rank waits", no "rank 1 missing".
    assert not [i for i in ids(report) if i.startswith("job.")], ids(report)
    assert "among the ranks seen: every rank waits in backward" in partial["detail"]


BUSY_READS = 3


def test_a_busy_job_read_again_and_again_is_never_alarmed_and_is_said_to_run(tmp_path):
    """The healthy twin: 2 DDP ranks that compute (matrix products, then DDP's backward, ~0.3 s a
    step), each `stacks` run's first verdict taken as it is."""
    with hung_job(tmp_path, "busy", 2) as job:
        verdicts = []
        for _ in range(BUSY_READS):
            report, code = stacks_once([str(job.pid)])
            alarms = [f for f in report["findings"] if f["severity"] in ("error", "warning", "critical")]
            assert not alarms and code == 0, [(f["id"], f["title"], f["detail"]) for f in alarms]
            verdicts.append([i for i in ids(report) if i.startswith("job.")])
        # Each verdict is job.I001 ("running") or, at worst, job.I002 ("cannot tell yet"); never a fault.
        assert all(v in (["job.I001"], ["job.I002"]) for v in verdicts), verdicts
        assert ["job.I001"] in verdicts, verdicts
        running = finding(report, "job.I001") or {}
        assert not running or running["title"].startswith("Running: every rank moved between reads")
        assert job.alive()


MODULE_LEVEL = TRAIN.with_name("module_level.py")


def test_a_module_level_ddp_script_is_read_by_its_source_when_no_frame_shows_the_model(tmp_path):
    """A loop at module level has no frame variables py-spy can read: the script naming
    DistributedDataParallel is the evidence that rank 0, idle in backward, waits in DDP's all-reduce."""
    with hung_job(tmp_path, "sleep", 2, script=MODULE_LEVEL) as job:
        report, code = stacks_once([str(job.pid)])
        late = finding(report, "job.E002")
        assert late is not None and late["ranks"] == [1], ids(report)
        assert "module_level.py:" in late["title"] and "LINE:sleep" in late["title"]
        assert "wraps a model in DistributedDataParallel" in late["detail"] or "DDP's gradient all-reduce" in late["detail"]
        assert code == 1 and job.alive()


def test_a_busy_module_level_ddp_script_is_not_alarmed(tmp_path):
    with hung_job(tmp_path, "busy", 2, script=MODULE_LEVEL) as job:
        report, code = stacks_once([str(job.pid)])
        alarms = [f for f in report["findings"] if f["severity"] in ("error", "warning", "critical")]
        assert not alarms and code == 0, [(f["id"], f["title"], f["detail"]) for f in alarms]
        assert job.alive()
