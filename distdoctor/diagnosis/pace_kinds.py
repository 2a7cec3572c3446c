"""The finding kinds of the slow-rank judgment (slow.*): who the job waits for, what it costs, where and why."""

from __future__ import annotations

from distdoctor.core.registry import finding_kind

CHECK = "slow"

SLOW_RANK = finding_kind(
    "slow.W001", cause="straggler_rank", title="A rank makes the others wait at every step",
    hint="Look at the named line of the slow rank and the cause measured there; give every rank the same work, or move the extra work out of the step")
CONTENDED = finding_kind(
    "slow.W002", cause="cpu_oversubscription", title="A rank waits for a CPU (another process or thread shares its cores) and the others wait for it",
    hint="Give the rank cores of its own: move the other process away, pin each rank to its own cores (taskset, numactl, the launcher's binding), set OMP_NUM_THREADS to the cores per rank")
SPREAD = finding_kind(
    "slow.W003", cause="straggler_rank", title="The ranks take turns making the others wait: no one rank to blame, the spread",
    hint="Steps of uneven length on every rank: bucket samples by length, plan Python's GC at the same step on every rank (gc.freeze(), gc.disable() and gc.collect() every N steps), keep other work off the ranks' cores")
CONTENTION_ALL = finding_kind(
    "slow.W004", cause="cpu_oversubscription", title="Every rank waits for a CPU: the ranks contend for cores, no one rank to blame",
    hint="Fewer ranks or threads per host than cores: lower --nproc-per-node or OMP_NUM_THREADS, or give the job more cores")
STAGES = finding_kind(
    "slow.I005", cause="unknown", title="Ranks wait in point-to-point calls for another stage: a question of balance between stages, not a straggler",
    hint="Pipeline stages wait on each other by design; balance the layers per stage, or use more micro-batches to fill the pipeline")
BLIND = finding_kind(
    "slow.I006", cause="unknown", title="What the slow-rank accounting cannot measure on this job, and why",
    hint="Waits inside NCCL collectives need their durations: set TORCH_NCCL_ENABLE_TIMING=1 with the flight recorder on; CPU contention needs /proc/<pid>/task/<tid>/schedstat (Linux with schedstats)")
