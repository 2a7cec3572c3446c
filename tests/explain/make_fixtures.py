"""Produce the explain fixtures FOR REAL: run each fault with torch on this machine, keep the output.

    python tests/explain/make_fixtures.py            # every scenario
    python tests/explain/make_fixtures.py port_in_use gloo_recv_timeout

Each scenario starts real processes (plain python, or torchrun) on loopback with small timeouts,
under a hard wall-clock limit; leftovers are killed by process group. What they print (stdout and
stderr merged, as a user's terminal or a scheduler's log file would hold it) is written to
fixtures/<name>.log. The test suite reads the stored fixtures and never regenerates them:
output depends on the torch version, so regenerate after a torch upgrade and re-run the tests.

GPU-only messages cannot be produced on a CPU machine; those fixtures are written by hand from
the formats in the torch and NCCL sources and listed as synthetic in fixtures/README.md.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
FIXTURES = HERE / "fixtures"
HARD_LIMIT_S = 60.0
TRACEBACK_HEADER = "Traceback (most recent call last):"

SCENARIOS: dict[str, Callable[[Path], str]] = {}
# Scenarios that write a directory of per-rank logs themselves.
DIRECTORY_SCENARIOS = {"per_rank_sigkill"}


def scenario(fn: Callable[[Path], str]) -> Callable[[Path], str]:
    SCENARIOS[fn.__name__] = fn
    return fn


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def base_env(**extra: object) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "MASTER_", "LOCAL_", "TORCH"))}
    env.update({"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"})
    env.update({k: str(v) for k, v in extra.items()})
    return env


def write_script(tmp: Path, name: str, code: str) -> Path:
    path = tmp / name
    path.write_text(PRELUDE + textwrap.dedent(code))
    return path


def run(cmd: list[str], env: dict[str, str], *, limit: float = HARD_LIMIT_S, cwd: Path | None = None) -> str:
    """Run one process (its own process group), merge stdout+stderr, kill the group at the limit."""
    proc = subprocess.Popen(
        cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        out = b""
    finally:
        _kill_group(proc)
    return out.decode("utf-8", "replace")


def run_ranks(script: Path, world_size: int, *, env: dict[str, object] | None = None, limit: float = HARD_LIMIT_S,
              ranks: list[int] | None = None, master_port: int | None = None) -> dict[int, str]:
    """Start one plain python process per rank (env:// rendezvous); return each rank's output."""
    port = master_port or free_port()
    procs: dict[int, subprocess.Popen] = {}
    for rank in ranks if ranks is not None else range(world_size):
        rank_env = base_env(RANK=rank, WORLD_SIZE=world_size, LOCAL_RANK=rank, MASTER_ADDR="127.0.0.1",
                            MASTER_PORT=port, **(env or {}))
        procs[rank] = subprocess.Popen([sys.executable, str(script)], env=rank_env, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, start_new_session=True)
    outputs: dict[int, str] = {}
    deadline = time.monotonic() + limit
    try:
        for rank, proc in procs.items():
            try:
                out, _ = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                out = b""
            outputs[rank] = out.decode("utf-8", "replace")
    finally:
        for proc in procs.values():
            _kill_group(proc)
    return outputs


def torchrun(script: Path, nproc: int, *extra_args: str, env: dict[str, object] | None = None,
             limit: float = HARD_LIMIT_S) -> str:
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
           f"--master-port={free_port()}", *extra_args, str(script)]
    return run(cmd, base_env(**(env or {})), limit=limit)


def _kill_group(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)


PRELUDE = """\
import os, sys, time, datetime
import torch
import torch.distributed as dist
RANK = int(os.environ.get("RANK", "0"))
"""


# -- rendezvous and store ----------------------------------------------------------------------

@scenario
def port_in_use(tmp: Path) -> str:
    """init_process_group as rank 0 while another process already listens on MASTER_PORT."""
    script = write_script(tmp, "train.py", """
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=5))
    """)
    with socket.socket() as squatter:
        squatter.bind(("0.0.0.0", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        return run_ranks(script, 1, master_port=port, limit=30)[0]


@scenario
def port_in_use_torchrun(tmp: Path) -> str:
    """torchrun's own store cannot bind --master-port because something else holds it."""
    script = write_script(tmp, "train.py", """
        dist.init_process_group("gloo")
    """)
    with socket.socket() as squatter:
        squatter.bind(("0.0.0.0", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=1", f"--master-port={port}", str(script)]
        return run(cmd, base_env(), limit=40)


@scenario
def env_missing(tmp: Path) -> str:
    """A training script started with python instead of its launcher: no RANK, WORLD_SIZE..."""
    script = write_script(tmp, "train.py", """
        dist.init_process_group("gloo")
    """)
    return run([sys.executable, str(script)], base_env(), limit=30)


@scenario
def store_connect_timeout(tmp: Path) -> str:
    """A non-zero rank whose master never starts: the store client gives up after its timeout."""
    script = write_script(tmp, "train.py", """
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=3))
    """)
    return run_ranks(script, 2, ranks=[1], limit=40)[1]


@scenario
def hostname_unresolvable(tmp: Path) -> str:
    script = write_script(tmp, "train.py", """
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=3))
    """)
    env = base_env(RANK=1, WORLD_SIZE=2, MASTER_ADDR="trainer-0.no-such-domain.invalid", MASTER_PORT=free_port())
    return run([sys.executable, str(script)], env, limit=40)


@scenario
def missing_rank(tmp: Path) -> str:
    """WORLD_SIZE=2 but only rank 0 is started: the master store waits for the other and times out."""
    script = write_script(tmp, "train.py", """
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=4))
    """)
    return run_ranks(script, 2, ranks=[0], limit=40)[0]


@scenario
def torchrun_rendezvous_timeout(tmp: Path) -> str:
    """torchrun --nnodes=2 with only one node: the c10d rendezvous never completes."""
    script = write_script(tmp, "train.py", "\n")
    port = free_port()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1",
           "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=job42",
           "--rdzv-conf=join_timeout=5", str(script)]
    return run(cmd, base_env(), limit=50)


# -- gloo collectives --------------------------------------------------------------------------

@scenario
def gloo_connection_closed(tmp: Path) -> str:
    """Rank 1 dies (os._exit) in the middle of a training loop; rank 0's all_reduce loses its peer."""
    script = write_script(tmp, "train.py", """
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=10))
        t = torch.ones(1 << 16)
        for step in range(100000):
            if RANK == 1 and step == 20:
                os._exit(1)
            dist.all_reduce(t)
    """)
    return run_ranks(script, 2, limit=40)[0]


@scenario
def gloo_recv_timeout(tmp: Path) -> str:
    """Rank 0 waits in recv() for a rank that never sends, with a 3 s process-group timeout."""
    script = write_script(tmp, "train.py", """
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=3))
        t = torch.zeros(4)
        if RANK == 0:
            dist.recv(t, src=1)
        else:
            time.sleep(8)
    """)
    return run_ranks(script, 2, limit=40)[0]


@scenario
def gloo_allreduce_timeout(tmp: Path) -> str:
    """Rank 1 is busy for longer than the 3 s timeout while rank 0 waits in all_reduce."""
    script = write_script(tmp, "train.py", """
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=3))
        t = torch.ones(8)
        if RANK == 1:
            time.sleep(8)
        dist.all_reduce(t)
    """)
    return run_ranks(script, 2, limit=40)[0]


@scenario
def monitored_barrier(tmp: Path) -> str:
    """monitored_barrier names the rank that did not arrive."""
    script = write_script(tmp, "train.py", """
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=10))
        if RANK == 1:
            time.sleep(8)
        dist.monitored_barrier(timeout=datetime.timedelta(seconds=3))
    """)
    return run_ranks(script, 2, limit=40)[0]


def _detail_mismatch(tmp: Path, rank0: str, rank1: str) -> str:
    script = write_script(tmp, "train.py", f"""
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=5))
        if RANK == 0:
            {rank0}
        else:
            {rank1}
    """)
    return run_ranks(script, 2, env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}, limit=40)[0]


@scenario
def detail_collective_mismatch(tmp: Path) -> str:
    return _detail_mismatch(tmp, "dist.all_reduce(torch.ones(4))", "dist.broadcast(torch.ones(4), src=0)")


@scenario
def detail_shape_mismatch(tmp: Path) -> str:
    return _detail_mismatch(tmp, "dist.all_reduce(torch.ones(4))", "dist.all_reduce(torch.ones(5))")


@scenario
def detail_dtype_mismatch(tmp: Path) -> str:
    return _detail_mismatch(tmp, "dist.all_reduce(torch.ones(4))",
                            "dist.all_reduce(torch.ones(4, dtype=torch.float64))")


@scenario
def nccl_not_built(tmp: Path) -> str:
    """backend="nccl" on a CPU-only torch build."""
    script = write_script(tmp, "train.py", """
        dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=5))
    """)
    return run_ranks(script, 1, limit=30)[0]


@scenario
def pg_not_initialized(tmp: Path) -> str:
    script = write_script(tmp, "train.py", """
        t = torch.ones(2)
        dist.all_reduce(t)
    """)
    return run([sys.executable, str(script)], base_env(), limit=30)


@scenario
def ddp_unused_parameters(tmp: Path) -> str:
    """A DDP model with a branch that never contributes to the loss."""
    script = write_script(tmp, "train.py", """
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=10))

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.used = torch.nn.Linear(4, 4)
                self.unused = torch.nn.Linear(4, 4)

            def forward(self, x):
                return self.used(x)

        model = torch.nn.parallel.DistributedDataParallel(Net())
        for step in range(2):
            model(torch.randn(2, 4)).sum().backward()
    """)
    return run_ranks(script, 2, limit=40)[0]


@scenario
def gloo_wrong_interface(tmp: Path) -> str:
    """GLOO_SOCKET_IFNAME names an interface this host does not have."""
    script = write_script(tmp, "train.py", """
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=5))
    """)
    return run_ranks(script, 1, env={"GLOO_SOCKET_IFNAME": "ib9"}, limit=30)[0]


@scenario
def launch_deprecated_local_rank(tmp: Path) -> str:
    """The deprecated torch.distributed.launch passes --local-rank, which the script's argparse rejects."""
    script = write_script(tmp, "train.py", """
        import argparse
        parser = argparse.ArgumentParser()
        parser.add_argument("--epochs", type=int, default=1)
        args = parser.parse_args()
    """)
    cmd = [sys.executable, "-m", "torch.distributed.launch", "--nproc-per-node=1", f"--master-port={free_port()}",
           str(script)]
    return run(cmd, base_env(), limit=40)


@scenario
def uneven_inputs(tmp: Path) -> str:
    """Rank 1 has fewer batches; DDP's Join context with throw_on_early_termination reports it."""
    script = write_script(tmp, "train.py", """
        from torch.distributed.algorithms.join import Join
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=10))
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
        batches = 5 if RANK == 0 else 3
        with Join([model], throw_on_early_termination=True):
            for _ in range(batches):
                model(torch.randn(2, 4)).sum().backward()
    """)
    return run_ranks(script, 2, limit=40)[0]


@scenario
def per_rank_sigkill(tmp: Path) -> str:
    """Three ranks, each logging to its own file (no torchrun); rank 2 is SIGKILLed mid-training.

    Written as per_rank_sigkill/rank<N>.log; returns a listing for the console.
    """
    script = write_script(tmp, "train.py", """
        import logging, signal
        logging.basicConfig(format="%(asctime)s %(levelname)s [rank" + str(RANK) + "] %(message)s", level=logging.INFO)
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=10))
        logging.info("joined the process group, world size %d", dist.get_world_size())
        t = torch.ones(1 << 16)
        for step in range(100000):
            if RANK == 2 and step == 20:
                os.kill(os.getpid(), signal.SIGKILL)
            dist.all_reduce(t)
            if step % 10 == 0:
                logging.info("step %d", step)
    """)
    outputs = run_ranks(script, 3, limit=40)
    out_dir = FIXTURES / "per_rank_sigkill"
    out_dir.mkdir(exist_ok=True)
    for rank, text in outputs.items():
        (out_dir / f"rank{rank}.log").write_text(text.replace(str(tmp), "/tmp/job"), encoding="utf-8")
    return "".join(f"rank{rank}.log: {len(text.splitlines())} lines\n" for rank, text in outputs.items())


# -- torchrun and signals ----------------------------------------------------------------------

KILL_SCRIPT = """
    import signal
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=10))
    t = torch.ones(1 << 16)
    for step in range(100000):
        if RANK == {victim} and step == 20:
            {how}
        dist.all_reduce(t)
"""


def _torchrun_kill(tmp: Path, nproc: int, victim: int, how: str) -> str:
    script = write_script(tmp, "train.py", KILL_SCRIPT.format(victim=victim, how=how))
    # A monitor interval of 2 s leaves the survivors time to report what they saw, as on a busy node.
    return torchrun(script, nproc, "--monitor-interval=2", limit=50)


@scenario
def torchrun_sigkill(tmp: Path) -> str:
    """Rank 3 of 4 is SIGKILLed (what the OOM killer does); ranks 0-2 then lose their peer."""
    return _torchrun_kill(tmp, 4, 3, "os.kill(os.getpid(), signal.SIGKILL)")


@scenario
def torchrun_sigsegv(tmp: Path) -> str:
    return _torchrun_kill(tmp, 2, 1, "import ctypes; ctypes.string_at(0)")


@scenario
def torchrun_sigabrt(tmp: Path) -> str:
    return _torchrun_kill(tmp, 2, 1, "os.abort()")


# -- a job torchelastic restarted, run as a new user would -----------------------------------------

STALE_RESTART_SCRIPT = """
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=20))
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
config = {"lr": 0.1}
for step in range(4):
    if attempt == 0 and step == 2 and RANK == 1:
        print(config["batch_size"])
    dist.all_reduce(torch.ones(2))
    print(f"rank {RANK} attempt {attempt} step {step}", flush=True)
"""


@scenario
def elastic_restart_stale(tmp: Path) -> str:
    """torchrun --standalone --nproc-per-node 2 --max-restarts 1, the plain env:// init a new user writes:
    attempt 0's rank 1 raises KeyError; torch 2.13's restart reads the Gloo addresses attempt 0 left in
    the agent's store, and a rank's connectFullMesh is refused on loopback (one host). Whether a
    restart meets a stale address is a race: the job is run until one does (most runs recover)."""
    script = write_script(tmp, "train.py", STALE_RESTART_SCRIPT)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "--max-restarts", "1", str(script)]
    for _ in range(12):
        out = run(cmd, base_env(), limit=120)
        if "connectFullMesh failed" in out and "Connection refused" in out:
            return out
    raise RuntimeError("12 restarts all recovered: no stale address met")


@scenario
def ddp_uneven_exit_abort(tmp: Path) -> str:
    """torchrun --tee 3, 2 ranks, DDP, rank 1 with one batch more: rank 0 says it is done and, as its
    interpreter ends, dies of SIGABRT ("terminate called without an active exception": gloo's thread
    at exit); rank 1's backward loses its peer. The abort at exit is a race (about 1 run in 8 on a
    2-core machine): the job is run until rank 0 dies of it."""
    script = tmp / "train.py"
    shutil.copy(HERE / "jobs" / "train_job.py", script)  # the job test_real_jobs.py runs, at a stable path
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "--tee", "3",
           str(script)]
    for _ in range(60):
        out = run(cmd, base_env(OMP_NUM_THREADS=1, SCENARIO="ddp_uneven"), limit=120)
        if "rank 0 done" in out and re.search(r"rank\s+: 0 \(local_rank: 0\)\n\s+exitcode\s+: -6", out):
            return out
    raise RuntimeError("60 runs without rank 0 aborting at exit")


@scenario
def spawn_consequence_first(tmp: Path) -> str:
    """mp.spawn, rank 1 raises at step 2 and rank 0 loses its peer, while the parent is starved (SIGSTOP
    for 4 s, as on an overloaded machine): both processes have ended when it looks, and mp.spawn prints
    the error of process 0 (the consequence) and never rank 1's own. `wrapped_job.py spawn_raise`."""
    script = tmp / "wrapped_job.py"
    shutil.copy(HERE / "jobs" / "wrapped_job.py", script)
    console = tmp / "console.log"
    with open(console, "wb") as out:
        proc = subprocess.Popen([sys.executable, str(script), "spawn_raise"], env=base_env(PORT=free_port()),
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + HARD_LIMIT_S
        while "rank 1 step 0" not in console.read_text() and time.monotonic() < deadline:
            time.sleep(0.02)
        proc.send_signal(signal.SIGSTOP)
        time.sleep(4)
        proc.send_signal(signal.SIGCONT)
        proc.wait(timeout=HARD_LIMIT_S)
    finally:
        _kill_group(proc)
    text = console.read_text()
    if "-- Process 0 terminated with the following error" not in text:
        raise RuntimeError("mp.spawn printed another process's error than rank 0's")
    return text


@scenario
def elastic_interleaved_tracebacks(tmp: Path) -> str:
    """torchrun --max-restarts 1 without --tee (one console): attempt 0's rank 1 raises; in attempt 1 both
    ranks' connectFullMesh is refused at the same moment and their tracebacks (no [rankN]: prefix: no
    process group yet) interleave line by line, one exception line glued to the other's carets.
    `wrapped_job.py elastic_restart`; a race (about 1 run in 12): the job is run until they interleave."""
    script = tmp / "wrapped_job.py"
    shutil.copy(HERE / "jobs" / "wrapped_job.py", script)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "--max-restarts", "1", str(script), "elastic_restart"]
    for _ in range(60):
        out = run(cmd, base_env(), limit=120)
        if f"{TRACEBACK_HEADER}\n{TRACEBACK_HEADER}\n" in out and "connectFullMesh failed" in out:
            return out
    raise RuntimeError("60 runs without the two ranks' tracebacks interleaving")


def main(names: list[str]) -> int:
    FIXTURES.mkdir(parents=True, exist_ok=True)
    chosen = names or list(SCENARIOS)
    unknown = [n for n in chosen if n not in SCENARIOS]
    if unknown:
        print(f"unknown scenario(s): {', '.join(unknown)}; known: {', '.join(SCENARIOS)}", file=sys.stderr)
        return 2
    for name in chosen:
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix=f"dd-fixture-{name}-") as tmp:
            text = SCENARIOS[name](Path(tmp))
        # The temp path is random per run; a stable name keeps regenerated fixtures diffable.
        text = text.replace(tmp, "/tmp/job")
        if name in DIRECTORY_SCENARIOS:
            print(text, end="")
        else:
            (FIXTURES / f"{name}.log").write_text(text, encoding="utf-8")
        print(f"{name}: {len(text.splitlines())} lines in {time.monotonic() - started:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
