"""A throw-away single-node SLURM cluster (munged + slurmctld + slurmd) for the launcher tests."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.conftest import free_port

DAEMONS = ("munged", "slurmctld", "slurmd", "srun", "sinfo")
CPUS = 4


def missing_programs() -> list[str]:
    return [name for name in DAEMONS if shutil.which(name) is None]


def why_not_runnable() -> str | None:
    """Why a cluster cannot be started here (None: it can)."""
    missing = missing_programs()
    if missing:
        return f"SLURM/munge not installed ({', '.join(missing)} missing): apt-get install slurm-wlm munge"
    if os.geteuid() != 0:
        return "slurmd must run as root to start tasks as the submitting user"
    try:
        pwd.getpwnam("munge")
    except KeyError:
        return "no 'munge' user (the munge package creates it)"
    return None


@dataclass
class SlurmCluster:
    root: Path
    host: str = field(default_factory=lambda: socket.gethostname().split(".")[0])
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self.root / "munge" / "munge.socket"

    def env(self, **extra: str) -> dict[str, str]:
        """The environment a client (srun, sinfo) needs to talk to this cluster."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_", "PMI", "RANK", "WORLD_SIZE", "LOCAL_", "MASTER_"))}
        env.update(SLURM_CONF=str(self.conf), **extra)
        return env

    def start(self, timeout: float = 60.0) -> None:
        self.root.chmod(0o755)  # munged runs as user munge and must reach its directory
        self._start_munge()
        self._write_conf()
        logs = self.root / "logs"
        self._spawn("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)], logs / "slurmctld.out")
        self._spawn("slurmd", ["slurmd", "-D", "-f", str(self.conf), "-N", self.host], logs / "slurmd.out")
        self._wait_idle(timeout)

    def stop(self) -> None:
        # slurmd first (it holds the tasks), munged last (the others talk to it while stopping).
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.processes.pop(name, None)
            if proc is None or proc.poll() is not None:
                continue
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)

    def log_tail(self, chars: int = 3000) -> str:
        out = []
        for path in sorted((self.root / "logs").glob("*")):
            text = path.read_text(errors="replace")[-chars:]
            out.append(f"--- {path.name}\n{text}")
        return "\n".join(out)

    # -- parts ------------------------------------------------------------------------------
    def _spawn(self, name: str, argv: list[str], log: Path, user: str | None = None) -> None:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            self.processes[name] = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=self.env(), user=user, start_new_session=True,
            )

    def _start_munge(self) -> None:
        munge = pwd.getpwnam("munge")
        base = self.root / "munge"
        base.mkdir(mode=0o700)
        key = base / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        for path in (base, key):
            os.chown(path, munge.pw_uid, munge.pw_gid)
        self._spawn("munged", [
            "munged", "--foreground", "--force", f"--socket={self.munge_socket}", f"--key-file={key}",
            f"--pid-file={base / 'munged.pid'}", f"--seed-file={base / 'munged.seed'}",
            f"--log-file={base / 'munged.log'}",
        ], self.root / "logs" / "munged.out", user="munge")
        deadline = time.monotonic() + 15
        while not self.munge_socket.exists():
            if self.processes["munged"].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("munged did not start:\n" + self.log_tail())
            time.sleep(0.1)
        # The socket's directory must be reachable by slurm daemons and clients (root here).
        base.chmod(0o755)

    def _write_conf(self) -> None:
        state = self.root / "state"
        spool = self.root / "spool"
        for path in (state, spool, self.root / "logs"):
            path.mkdir(exist_ok=True)
        lines = [
            "ClusterName=distdoctor-test",
            f"SlurmctldHost={self.host}",
            f"SlurmctldPort={free_port()}",
            f"SlurmdPort={free_port()}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={state}",
            f"SlurmdSpoolDir={spool}",
            f"SlurmctldPidFile={self.root / 'slurmctld.pid'}",
            f"SlurmdPidFile={self.root / 'slurmd.pid'}",
            f"SlurmctldLogFile={self.root / 'logs' / 'slurmctld.log'}",
            f"SlurmdLogFile={self.root / 'logs' / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SlurmdParameters=config_overrides",
            "SchedulerType=sched/builtin",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "MpiDefault=none",
            "ReturnToService=2",
            "JobCompType=jobcomp/none",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "SwitchType=switch/none",
            "LaunchParameters=use_interactive_step",
            f"NodeName={self.host} CPUs={CPUS} State=UNKNOWN",
            f"PartitionName=test Nodes={self.host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES",
        ]
        self.conf.write_text("\n".join(lines) + "\n")

    def _wait_idle(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            for name, proc in self.processes.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode}:\n" + self.log_tail())
            try:
                result = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], env=self.env(), capture_output=True, text=True, timeout=10)
                state = result.stdout.strip() or result.stderr.strip()
            except subprocess.TimeoutExpired:
                state = "sinfo timed out"
            if state == "idle":
                return
            time.sleep(0.5)
        raise RuntimeError(f"the node did not become idle in {timeout:g}s (sinfo: {state!r}):\n" + self.log_tail())


def running_cluster(prefix: str):
    """A pytest fixture's body: a started cluster (skip when this machine cannot run one), stopped after."""
    import tempfile

    import pytest

    why = why_not_runnable()
    if why:
        pytest.skip(why)
    root = Path(tempfile.mkdtemp(prefix=prefix))
    cluster = SlurmCluster(root)
    try:
        cluster.start()
    except RuntimeError as exc:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
        pytest.fail(f"could not start the test SLURM cluster: {exc}")
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
