"""The finding kinds of the job diagnosis (job.*), the same whichever source the snapshots came from."""

from __future__ import annotations

from distdoctor.core.registry import finding_kind

CHECK = "job"

EXCEPTION = finding_kind(
    "job.E001", cause="worker_exception", title="A rank raised an exception; its peers' failures followed from it",
    hint="Fix the exception at the named line of that rank; the other ranks' errors (Connection closed by peer, timeouts, SIGTERM) are its consequences")
STRAGGLER = finding_kind(
    "job.E002", cause="straggler_rank", title="A rank has not arrived at the collective the others wait in",
    hint="Look at what the late rank does at the named line (a slow data loader, I/O, rank-0-only work); move that work out of the loop, make it faster, or raise the timeout")
UNEVEN = finding_kind(
    "job.E003", cause="uneven_inputs", title="A rank left the job while the others still issue collectives",
    hint="Give every rank the same number of batches (DistributedSampler(drop_last=True), a fixed step count) or wrap the loop in torch.distributed.algorithms.Join([model])")
MISSING = finding_kind(
    "job.E004", cause="rank_missing", title="A rank ended or stopped answering while the others wait for it",
    hint="Read that rank's own log and the launcher's exit codes: it died (a signal, a crash in C/C++) or is frozen (a C extension holding the GIL, a deadlock)")
KILLED = finding_kind(
    "job.E005", cause="oom_killed_rank", title="A rank was killed by SIGKILL, the out-of-memory killer's signal",
    hint="Check `dmesg` or the scheduler's log for 'Out of memory: Killed process'; lower the batch size, the data loader's workers or prefetch, or give the job more memory")
MISMATCH = finding_kind(
    "job.E006", cause="collective_mismatch", title="Ranks issued different collectives at one sequence number",
    hint="Every rank must issue the same collectives in the same order; look for rank-dependent branches (if rank == 0) around the named lines")
SHAPE = finding_kind(
    "job.E007", cause="shape_mismatch", title="Ranks ran one collective with different tensor sizes",
    hint="Make every rank pass tensors of the same size to this collective (for DDP: the same model on every rank, the same parameters requiring grad)")
DTYPE = finding_kind(
    "job.E008", cause="dtype_mismatch", title="Ranks ran one collective with different dtypes",
    hint="Convert to one dtype on every rank before the collective (for DDP: the same .half()/.to(dtype) calls on every rank's model)")
HANG = finding_kind(
    "job.E009", cause="collective_timeout_hang", title="Every rank waits in the same collective and none completes it",
    hint="Every rank arrived, so suspect the transport: the interface (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME), a firewall between hosts, NCCL's P2P or IB path; run `distdoctor check` and `distdoctor bench` on these hosts")
NOT_HEARD = finding_kind(
    "job.W010", cause="unknown", title="Ranks wait in a collective and the ranks not heard from in time may be why",
    hint="Nothing names a cause yet: the ranks not heard from may be slow to answer (a loaded host or store), frozen, dead or unseen from here; the guard looks again and revises its verdict, or run `distdoctor stacks` on their hosts")
SLOW = finding_kind(
    "job.W011", cause="slow_link", title="Every rank is in one collective that has not completed, but it still moves data",
    hint="Nothing is stuck: the collective is slow (a very large tensor, a slow or shared link); run `distdoctor bench` for the links, send less per collective, or raise hang_timeout above your longest collective")
# Progress over several looks (diagnosis.progress): what the looks prove about a job that is not failing.
RUNNING = finding_kind(
    "job.I001", cause="unknown", title="Running: every rank moved between reads",
    hint="Nothing to do: every rank's stack, sequence numbers or CPU time moved between reads; a job that is slow but moving is not hung")
OPEN = finding_kind(
    "job.I002", cause="unknown", title="The reads do not tell a busy job from a hung one",
    hint="Read for longer (distdoctor stacks --span 10, or --watch); each rank's line says what it did between reads, and what the last read alone would have claimed")
