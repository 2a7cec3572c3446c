"""Functions that run inside each rank of a real 2-rank gloo world (via distdoctor.testing).

Each asserts what the guard did *on this rank*; "raised on both ranks" is checked by both
ranks asserting that they raised. Lines that tests name are marked ``# LINE:<tag>``.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

import distdoctor
from distdoctor import GuardError


def line_of(tag: str) -> str:
    """'<this file>:<n>' of the line marked '# LINE:<tag>', the path shown as the guard shows it."""
    from distdoctor.diagnosis.frames import display_path

    with open(__file__) as f:
        for number, text in enumerate(f, 1):
            if text.rstrip().endswith(f"# LINE:{tag}"):
                return f"{display_path(__file__)}:{number}"
    raise AssertionError(f"no line tagged {tag}")


def expect_guard_error(fn) -> GuardError:
    try:
        fn()
    except GuardError as exc:
        return exc
    raise AssertionError(f"no GuardError on rank {dist.get_rank()}")


def only(error: GuardError, finding_id: str):
    found = [f for f in error.report.findings if f.id == finding_id]
    assert len(found) == 1, [(f.id, f.title) for f in error.report.findings]
    return found[0]


def shape_mismatch() -> None:
    distdoctor.guard(verify="all")
    rank = dist.get_rank()
    t = torch.randn(2, 3) if rank == 0 else torch.randn(3, 2)
    err = expect_guard_error(lambda: dist.broadcast(t, src=0))  # LINE:shape
    finding = only(err, "guard.E001")
    assert finding.cause == "shape_mismatch" and finding.ranks in ((0,), (1,)), finding
    assert "[2, 3]" in finding.title and "[3, 2]" in finding.title, finding.title
    text = str(err)
    assert f"rank 0: broadcast #0 (float32[2, 3], src 0) at {line_of('shape')}" in text, text
    assert f"rank 1: broadcast #0 (float32[3, 2], src 0) at {line_of('shape')}" in text, text
    # The group is still usable: nothing ran, nothing corrupted.
    ok = torch.ones(2)
    dist.all_reduce(ok)
    assert ok.tolist() == [2.0, 2.0]


def dtype_mismatch() -> None:
    distdoctor.guard(verify="all")
    rank = dist.get_rank()
    if rank == 0:
        t = torch.zeros(4, dtype=torch.float32)
        err = expect_guard_error(lambda: dist.broadcast(t, src=0))  # LINE:dtype0
    else:
        t = torch.zeros(4, dtype=torch.float64)
        err = expect_guard_error(lambda: dist.broadcast(t, src=0))  # LINE:dtype1
    finding = only(err, "guard.E002")
    assert finding.cause == "dtype_mismatch", finding
    assert f"rank 0: float32 at {line_of('dtype0')}" in finding.title, finding.title
    assert f"rank 1: float64 at {line_of('dtype1')}" in finding.title, finding.title


def order_mismatch() -> None:
    distdoctor.guard(verify="all")
    a, b = torch.ones(3), torch.ones(3)
    if dist.get_rank() == 0:
        dist.all_reduce(a)  # LINE:first
        err = expect_guard_error(lambda: dist.broadcast(b, src=0))  # LINE:order0
    else:
        dist.all_reduce(a)  # LINE:first
        err = expect_guard_error(lambda: dist.all_reduce(b))  # LINE:order1
    finding = only(err, "guard.E004")
    assert finding.cause == "collective_mismatch", finding
    assert "rank 0 called broadcast; rank 1 called all_reduce" in finding.title, finding.title
    text = str(err)
    assert f"rank 0: broadcast #1 (float32[3], src 0) at {line_of('order0')}" in text, text
    assert f"rank 1: all_reduce #1 (float32[3], op SUM) at {line_of('order1')}" in text, text


def healthy_loop() -> None:
    g = distdoctor.guard(verify="all")
    rank, world = dist.get_rank(), dist.get_world_size()
    for step in range(20):
        t = torch.full((4,), float(rank + step))
        dist.all_reduce(t)
        assert t[0].item() == sum(r + step for r in range(world))
        dist.broadcast(t, src=step % world)
        out = [torch.zeros(4) for _ in range(world)]
        dist.all_gather(out, torch.full((4,), float(rank)))
        objs = [None]
        if rank == 0:
            objs = [{"step": step}]
        dist.broadcast_object_list(objs, src=0)
        assert objs[0] == {"step": step}
        peer = 1 - rank
        if rank == 0:
            dist.send(torch.ones(2), dst=peer)
            work = dist.irecv(torch.zeros(2), src=peer)
            work.wait()
        else:
            buf = torch.zeros(2)
            dist.recv(buf, src=peer)
            dist.isend(buf, dst=peer).wait()
    dist.barrier()
    assert g.findings == [], g.findings
    assert g.recorder.seqs[g.groups[id(dist.group.WORLD)][0]] == 20 * 4 + 1


def dropped_isend(seen_file: str) -> None:
    """isend without wait(): reported when dropped. The receive then often never completes (gloo
    drops the send with its Work), so the guard's hang diagnosis may end the job too."""
    g = distdoctor.guard(hang_timeout=3)
    t = torch.ones(8)
    if dist.get_rank() == 0:
        dist.isend(t, dst=1)  # LINE:dropped
        assert [f.id for f in g.findings] == ["guard.E009"], g.findings
        finding = g.findings[0]
        assert f"isend #0 to rank 1 at {line_of('dropped')}" in finding.title, finding.title
        assert finding.cause == "collective_timeout_hang"
        with open(seen_file, "w") as f:
            f.write(finding.title)
    else:
        dist.recv(t, src=0)  # LINE:recv
        assert g.findings == []
    dist.barrier()


def pending_at_destroy(report_dir: str) -> None:
    g = distdoctor.guard(report_dir=report_dir)
    t = torch.ones(8)
    if dist.get_rank() == 1:
        keep = dist.irecv(t, src=0)  # LINE:pending
        dist.barrier()
        g.shutdown("destroyed")
        assert [f.id for f in g.findings] == ["guard.W010"], g.findings
        assert f"irecv #0 from rank 0 at {line_of('pending')}" in g.findings[0].title
        dist.send(t, dst=0)
        keep.wait()
    else:
        dist.barrier()
        dist.recv(t, src=1)
        dist.send(t, dst=1)


def straggler(line_file: str) -> None:
    distdoctor.guard(hang_timeout=3, verify="sample")
    t = torch.ones(4)
    dist.all_reduce(t)
    if dist.get_rank() == 1:
        with open(line_file, "w") as f:
            f.write(f"{time.time()}\n")
        time.sleep(60)  # LINE:sleep
    dist.all_reduce(t)  # LINE:wait
    raise AssertionError("the all_reduce returned although rank 1 sleeps")


def uneven_loop() -> None:
    """Rank 1 gets 3 batches, rank 0 gets 5: rank 1 leaves the loop and reaches the final barrier."""
    distdoctor.guard()
    batches = 5 if dist.get_rank() == 0 else 3
    t = torch.ones(2)
    for _ in range(batches):
        err = None
        try:
            dist.all_reduce(t)  # LINE:loop
        except GuardError as exc:
            err = exc
            break
    else:
        try:
            dist.barrier()  # LINE:after
        except GuardError as exc:
            err = exc
    assert err is not None, f"no GuardError on rank {dist.get_rank()}"
    finding = only(err, "guard.E005")
    assert finding.cause == "uneven_inputs" and finding.ranks == (1,), finding
    assert f"Rank 1 left the loop at {line_of('loop')} and called barrier" in finding.title, finding.title
    assert f"rank 1: barrier #3 at {line_of('after')}" in str(err)


def frozen_rank() -> None:
    """Rank 1 stops (SIGSTOP) before an all_reduce: it cannot answer; rank 0 names it missing."""
    import os
    import signal

    distdoctor.guard(hang_timeout=3)
    t = torch.ones(2)
    dist.all_reduce(t)
    if dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    dist.all_reduce(t)  # LINE:frozen


def recreated_group() -> None:
    """The process group destroyed and created again mid-run: the guard starts again on the new one."""
    first = distdoctor.guard(hang_timeout=30)
    store = dist.distributed_c10d._get_default_store()
    dist.all_reduce(torch.ones(2))
    dist.destroy_process_group()
    assert first.shut_down and not first.watch.thread.is_alive()
    dist.init_process_group("gloo", store=dist.PrefixStore("again", store), rank=int(__import__("os").environ["RANK"]),
                            world_size=int(__import__("os").environ["WORLD_SIZE"]))
    second = distdoctor.guard(hang_timeout=30)
    assert second is not first and second.watch.thread.is_alive() and second.watch.side is not None
    t = torch.ones(2)
    dist.all_reduce(t)
    assert t.tolist() == [2.0, 2.0] and second.recorder.calls == 1 and first.recorder.calls == 1
    assert dist.all_reduce.__distdoctor_original__ is second.originals["all_reduce"]
