"""`stacks --slurm-job` on a 130-node job: the nodes read in groups (one srun each, a bounded number at once),
their reports merged into one verdict over 1,040 ranks that names the late rank."""

# srun and squeue here are stand-ins (this machine's SLURM cluster has one node): squeue names 130
# nodes; srun answers, for each node of its --nodelist, the JSON report `distdoctor stacks
# --slurm-node` gives there (8 ranks per node, three reads each; rank 517 sleeps while the others
# wait in all_reduce #12), and records how many sruns ran at once.

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

from distdoctor.stacks import slurm
from distdoctor.stacks.slurm import look_slurm_job, node_groups

NODES, PER_NODE, LATE = 130, 8, 517

FAKE_SRUN = textwrap.dedent("""
    import fcntl, json, os, sys, time
    sys.path.insert(0, {repo!r})
    from distdoctor.diagnosis.snapshot import Frame, GroupProgress, PendingOp, RankSnapshot
    from distdoctor.stacks.job import JobView
    args = sys.argv[1:]
    nodes = args[args.index("--nodelist") + 1].split(",") if "--nodelist" in args else ["node000"]
    count = {state!r}
    with open(count, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX); fh.seek(0); now, top = map(int, (fh.read() or "0 0").split())
        fh.seek(0); fh.truncate(); fh.write(f"{{now + 1}} {{max(top, now + 1)}}")
    time.sleep(0.3)
    wait = Frame("train.py", 55, "main", "loss.backward()")
    sleep = Frame("train.py", 41, "main", "time.sleep(3600)")
    c10d = Frame("torch/distributed/distributed_c10d.py", 2950, "all_reduce")
    for node in nodes:
        base = int(node[4:]) * {per_node}
        snaps, history = [], {{}}
        for rank in range(base, base + {per_node}):
            def look(t):
                if rank == {late}:
                    return RankSnapshot(rank, host=node, pid=1000 + rank, status="running", where=sleep, time=t,
                                        proc_state="S", stack=(sleep,), groups=(GroupProgress("0", (), 11, 11),))
                op = PendingOp("all_reduce", 12, ((4,),), ("Float",), "scheduled", 10.0)
                return RankSnapshot(rank, host=node, pid=1000 + rank, status="running", where=wait, time=t,
                                    proc_state="S", stack=(wait, c10d), groups=(GroupProgress("0", (), 12, 11, op),))
            history[rank] = [look(t) for t in (0.0, 0.5, 1.0)]
            snaps.append(history[rank][-1])
        view = JobView("job", snaps, world_size={world}, launcher="torchrun", nodes=[node], history=history,
                       reads={{r: 3 for r in history}})
        print(json.dumps({{"data": {{"stacks": {{"nodes": [node], "jobs": [view.to_dict()]}}}}}}))
    with open(count, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX); fh.seek(0); now, top = map(int, fh.read().split())
        fh.seek(0); fh.truncate(); fh.write(f"{{now - 1}} {{top}}")
""")


def test_130_nodes_are_read_in_bounded_groups_and_one_verdict_names_the_late_rank(tmp_path: Path):
    state = tmp_path / "running"
    srun = tmp_path / "srun"
    srun.write_text(f"#!{sys.executable}\n" + FAKE_SRUN.format(repo=str(Path(__file__).resolve().parents[2]),
                                                                 state=str(state), per_node=PER_NODE, late=LATE,
                                                                 world=NODES * PER_NODE))
    squeue = tmp_path / "squeue"
    squeue.write_text(f"#!/bin/sh\necho 'node[000-{NODES - 1:03d}]'\n")
    for script in (srun, squeue):
        os.chmod(script, 0o755)
    report = look_slurm_job("4242", srun=str(srun), squeue=str(squeue), timeout_s=5.0)
    stacks = report.data["stacks"]
    assert stacks["sruns"] == len(node_groups([f"node{i:03d}" for i in range(NODES)])) == 3
    assert len(stacks["nodes"]) == NODES
    _, most_at_once = map(int, state.read_text().split())
    assert 1 <= most_at_once <= slurm.MAX_SRUNS
    late = next(f for f in report.findings if f.id == "job.E002")
    assert late.ranks == (LATE,) and "train.py:41" in late.title
    assert f"ranks 0-{LATE - 1}, {LATE + 1}-{NODES * PER_NODE - 1} wait in all_reduce #12" in late.detail
    assert not [f for f in report.findings if f.id in ("stacks.E006", "stacks.W003")]


def test_a_small_job_is_one_srun_over_its_allocation():
    assert node_groups([]) == [[]] and node_groups(["a", "b"]) == [[]]
    assert node_groups([f"n{i}" for i in range(65)], size=64) == [[f"n{i}" for i in range(64)], ["n64"]]


def test_the_node_list_comes_from_squeue_expanded(tmp_path: Path):
    squeue = tmp_path / "squeue"
    squeue.write_text("#!/bin/sh\necho 'gpu[01-03],cpu7'\n")
    os.chmod(squeue, 0o755)
    assert slurm.job_nodes("1", str(squeue)) == ["gpu01", "gpu02", "gpu03", "cpu7"]
    assert slurm.job_nodes("1", str(tmp_path / "missing")) == []
    json.dumps(slurm.node_command("1", native=False, timeout_s=5.0))  # plain strings only
