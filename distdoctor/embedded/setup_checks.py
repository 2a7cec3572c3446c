"""The DDP set-up checks of ``distdoctor.preflight``: model, DataLoader and tensors on one rank.

Each function looks at live objects of this rank and returns findings (never prints, never
raises: an object that cannot be inspected gives a "could not tell" finding or nothing). The
cross-rank ones (batch counts, versions) take the per-rank values every rank has after
preflight's exchange, so every rank computes the same findings.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from distdoctor.core.findings import Finding
from distdoctor.core.registry import finding_kind
from distdoctor.core.report import format_ranks
from distdoctor.checks._support.tensor_specs import SpecTable, TensorSpec, spec_table

CHECK = "preflight"

MODEL_WRONG_DEVICE = finding_kind(
    "pre.E001",
    cause="device_mismatch",
    title="The model is not on this rank's device",
    hint="model.to(torch.device('cuda', local_rank)) with local_rank = int(os.environ['LOCAL_RANK'])",
)
DATAPARALLEL_IN_MULTIPROCESS = finding_kind(
    "pre.E002",
    cause="launcher_misuse",
    title="nn.DataParallel is used inside a multi-process job",
    hint="Drop nn.DataParallel; wrap the model in DistributedDataParallel (device_ids=[local_rank] on a GPU, none on the CPU)",
)
NO_DISTRIBUTED_SAMPLER = finding_kind(
    "pre.W003",
    cause="rank_config_error",
    title="The DataLoader has no DistributedSampler: every rank reads the whole dataset",
    hint="DataLoader(ds, sampler=DistributedSampler(ds), ...) and call sampler.set_epoch(epoch) each epoch",
)
SAMPLER_WORLD_MISMATCH = finding_kind(
    "pre.E004",
    cause="rank_config_error",
    title="The DistributedSampler's num_replicas or rank disagrees with the process group",
    hint="Create DistributedSampler(ds) after init_process_group and let it read rank and world size from the group",
)
CPU_TENSOR_ON_NCCL = finding_kind(
    "pre.E005",
    cause="cpu_tensor_on_nccl",
    title="CPU tensors are headed for an NCCL process group",
    hint="Move the model and tensors to this rank's GPU before the first collective: .to(torch.device('cuda', local_rank))",
)
UNEVEN_BATCHES = finding_kind(
    "pre.E006",
    cause="uneven_inputs",
    title="Ranks get different numbers of batches",
    hint="Wrap the training loop in torch.distributed.algorithms.join.Join([ddp_model]), or give every rank as many batches",
)
BATCHES_UNKNOWN = finding_kind(
    "pre.I007",
    cause="uneven_inputs",
    title="Could not tell whether the ranks get the same number of batches",
    hint="Nothing to do for an IterableDataset that shards itself; otherwise give the DataLoader a sized dataset",
)
NOT_INITIALIZED = finding_kind(
    "pre.C008",
    cause="pg_not_initialized",
    title="preflight was called before the process group was initialized",
    hint="Call distdoctor.init_process_group(...) (or torch.distributed.init_process_group) before preflight",
)
RANKS_MISSING = finding_kind(
    "pre.E009",
    cause="rank_missing",
    title="Some ranks did not reach preflight within its deadline",
    hint="Look at the named ranks' logs: crashed, stuck before preflight, or much slower; raise timeout= if merely slow",
)
VERSION_DIFFERS = finding_kind(
    "pre.E010",
    cause="version_incompat",
    title="torch or CUDA versions differ from rank 0",
    hint="Install the same torch build on every node (one container image or one environment for the whole job)",
)

MODEL_NOT_WRAPPED = finding_kind(
    "pre.W011",
    cause="param_divergence",
    title="The model is not wrapped in DistributedDataParallel or FSDP",
    hint="Wrap it (DistributedDataParallel(model)); if preflight runs before the wrap pass wrap='later', if no wrapper is intended wrap='never'",
)

# What preflight(wrap=...) accepts: the model is wrapped after preflight, or never on purpose.
WRAP_LATER, WRAP_NEVER = "later", "never"
DDP_WRAPPERS = ("DistributedDataParallel", "FullyShardedDataParallel")


# -- unwrapping ---------------------------------------------------------------------------------


def wrappers_of(model: Any) -> list[str]:
    """The wrapper class names around the user's module, outermost first (DDP, FSDP, DataParallel)."""
    names = []
    current = model
    for _ in range(8):  # wrappers nest a few levels at most; never loop on a cyclic .module
        inner = getattr(current, "module", None)
        kind = type(current).__name__
        if inner is None or kind not in ("DistributedDataParallel", "DataParallel", "FullyShardedDataParallel"):
            break
        names.append(kind)
        current = inner
    return names


def unwrap(model: Any) -> Any:
    current = model
    for _ in wrappers_of(model):
        current = current.module
    return current


def model_spec_table(model: Any, max_samples: int | None) -> Any:
    """Specs of the parameters then buffers of the unwrapped module, by the user's names.

    FSDP1 (``FullyShardedDataParallel``) keeps each rank's shard in flat parameters, whose
    sizes and values differ per rank by design: their names, dtypes and device types are
    compared, their shapes and values are not (reported as not compared, spec.I006). FSDP2
    parameters are DTensors, which tensorspec treats the same way (global shape compared).
    """

    if "FullyShardedDataParallel" in wrappers_of(model):
        specs = [
            TensorSpec(_clean_fsdp_name(name), (), str(p.dtype).removeprefix("torch."), p.device.type, None, 0,
                       NOTE_FSDP_SHARD)
            for name, p in model.named_parameters()
        ]
        buffers = spec_table([(_clean_fsdp_name(n), b) for n, b in model.named_buffers()], max_samples=max_samples)
        return SpecTable(specs + buffers.specs)
    module = unwrap(model)
    return spec_table([*module.named_parameters(), *module.named_buffers()], max_samples=max_samples)


NOTE_FSDP_SHARD = "FSDP shard: each rank holds a different slice; shape and values not compared"


def _clean_fsdp_name(name: str) -> str:
    return name.replace("_fsdp_wrapped_module.", "").replace("_checkpoint_wrapped_module.", "")


# -- local checks ------------------------------------------------------------------------------


def model_findings(model: Any, *, rank: int, world_size: int, local_rank: int | None, backend: str,
                   expected_cuda_index: int | None) -> list[Finding]:
    """The classic DDP placement mistakes of one rank's model."""
    findings: list[Finding] = []
    wrappers = wrappers_of(model)
    try:
        devices = _devices(unwrap(model))
    except Exception as exc:  # an exotic module whose parameters cannot be listed
        return findings + [MODEL_WRONG_DEVICE(
            f"Could not tell where the model's parameters are: {type(exc).__name__}: {exc}",
            ranks=(rank,), check=CHECK, remediation="Nothing to do unless the model is misplaced.")]
    if "DataParallel" in wrappers and world_size > 1:
        findings.append(DATAPARALLEL_IN_MULTIPROCESS(
            f"nn.DataParallel wraps the model in a {world_size}-process job",
            detail=("nn.DataParallel replicates the model over every visible GPU inside this process; "
                    "with one process per GPU the ranks then share GPUs and gradients are not synchronised "
                    f"across processes. Wrappers found: {' > '.join(wrappers)}."),
            remediation=ddp_advice(devices),
            ranks=(rank,), check=CHECK,
        ))
    findings += _placement_findings(devices, "The model", rank=rank, local_rank=local_rank, backend=backend,
                                    expected_cuda_index=expected_cuda_index)
    return findings


def ddp_advice(devices: Mapping[str, list[str]]) -> str:
    """How to wrap this model in DDP, for the device its parameters are on: device_ids only for
    a single GPU (on the CPU, device_ids=[local_rank] raises ValueError)."""
    cuda = sorted(d for d in devices if d.startswith("cuda"))
    if len(cuda) == 1 and len(devices) == 1:
        return ("Drop nn.DataParallel and use DistributedDataParallel(model.to(local_rank), device_ids=[local_rank]) "
                "with local_rank = int(os.environ['LOCAL_RANK'])")
    if cuda:
        return ("Drop nn.DataParallel and use DistributedDataParallel(model) without device_ids: the model spans "
                f"several devices ({', '.join(sorted(devices))}), so DDP must not be given one")
    return ("Drop nn.DataParallel and use DistributedDataParallel(model) without device_ids: the model is on the "
            "CPU, where device_ids must be None (device_ids=[local_rank] raises ValueError)")


def wrap_findings(model: Any, *, rank: int, world_size: int, wrap: str | None) -> list[Finding]:
    """A plain module in a world of N > 1: its gradients are never synchronised unless it is
    wrapped after preflight. Silent when the user said so (wrap='later' or 'never')."""
    if model is None or world_size <= 1 or wrap is not None:
        return []
    wrappers = wrappers_of(model)
    if any(w in DDP_WRAPPERS for w in wrappers) or _is_fsdp2_or_sharded(model):
        return []
    what = f"nn.DataParallel around a {type(unwrap(model)).__name__}" if wrappers else type(model).__name__
    return [MODEL_NOT_WRAPPED(
        f"The model passed to preflight ({what}) is not wrapped in DistributedDataParallel or FSDP "
        f"in a {world_size}-rank job",
        detail=("Unless it is wrapped after preflight, each rank trains its own copy: gradients are never "
                "averaged across ranks, and the copies drift apart even when they start equal (a shared seed "
                "hides this at start). Manual gradient all-reduce or parameter averaging is the exception."),
        ranks=(rank,), check=CHECK,
    )]


def _is_fsdp2_or_sharded(model: Any) -> bool:
    """FSDP2 (fully_shard) changes the module's class in place (FSDPModule in its MRO) and makes
    its parameters DTensors; tensor parallelism leaves DTensors too: both synchronise by design."""
    if any(cls.__name__ == "FSDPModule" for cls in type(model).__mro__):
        return True
    try:
        first = next(iter(model.parameters()), None)
    except Exception:
        return False
    return first is not None and type(first).__name__ == "DTensor"


def tensors_findings(tensors: Mapping[str, Any], *, rank: int, backend: str, local_rank: int | None,
                     expected_cuda_index: int | None) -> list[Finding]:
    devices: dict[str, list[str]] = {}
    for name, tensor in tensors.items():
        device = getattr(tensor, "device", None)
        if device is not None:
            devices.setdefault(str(device), []).append(f"tensors[{name!r}]")
    return _placement_findings(devices, "Tensors passed to preflight", rank=rank, local_rank=local_rank,
                               backend=backend, expected_cuda_index=expected_cuda_index)


def _devices(module: Any) -> dict[str, list[str]]:
    """device string -> names of the parameters/buffers there (a few per device)."""
    out: dict[str, list[str]] = {}
    for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
        names = out.setdefault(str(tensor.device), [])
        if len(names) < 3:
            names.append(name)
    return out


def _is_gpu_only(backend: str) -> bool:
    """nccl alone; a 'cpu:gloo,cuda:nccl' mapping also serves CPU tensors."""
    parts = [p.split(":")[-1].strip().lower() for p in str(backend).split(",")]
    return "nccl" in parts and not any(p in ("gloo", "mpi", "ucc") for p in parts)


def _placement_findings(devices: Mapping[str, list[str]], what: str, *, rank: int, local_rank: int | None,
                        backend: str, expected_cuda_index: int | None) -> list[Finding]:
    findings: list[Finding] = []
    if not devices:
        return findings
    where = "; ".join(f"{dev}: {', '.join(names)}" for dev, names in sorted(devices.items()))
    cpu = [d for d in devices if d == "cpu"]
    if cpu and _is_gpu_only(backend):
        findings.append(CPU_TENSOR_ON_NCCL(
            f"{what} has tensors on the CPU, but the process group's backend is {backend}",
            detail=f"NCCL only moves GPU tensors; a collective on these fails or DDP refuses the model. Devices: {where}",
            ranks=(rank,), check=CHECK,
        ))
    cuda = sorted(d for d in devices if d.startswith("cuda"))
    if cuda and expected_cuda_index is not None:
        wrong = [d for d in cuda if d != f"cuda:{expected_cuda_index}" and d != "cuda"]
        if wrong and len(cuda) == 1:  # several cuda devices: model parallel, deliberately spread
            lr = f" (LOCAL_RANK={local_rank})" if local_rank is not None else ""
            findings.append(MODEL_WRONG_DEVICE(
                f"{what} on rank {rank} is on {wrong[0]}, but this rank's device is cuda:{expected_cuda_index}{lr}",
                detail=("Ranks whose model sits on another rank's GPU share that GPU: out of memory, NCCL "
                        f"'duplicate GPU' errors or a hang. Devices: {where}"),
                ranks=(rank,), check=CHECK,
            ))
    return findings


def dataloader_findings(loader: Any, *, rank: int, world_size: int) -> list[Finding]:
    """Sampler set-up of one rank's DataLoader (duck-typed: any sampler with num_replicas/rank)."""
    if loader is None or world_size <= 1:
        return []
    sampler = _distributed_sampler(loader)
    if sampler is None:
        dataset = getattr(loader, "dataset", None)
        if dataset is not None and not hasattr(dataset, "__len__"):
            return []  # an IterableDataset shards itself (or not): no sampler to judge
        kind = type(getattr(loader, "sampler", None)).__name__
        return [NO_DISTRIBUTED_SAMPLER(
            f"The DataLoader uses {kind}, not a DistributedSampler: every rank reads the whole dataset",
            detail=("Without a DistributedSampler each of the ranks iterates over all samples: an epoch does "
                    f"{world_size}x the work and the ranks train on the same batches."),
            ranks=(rank,), check=CHECK,
        )]
    # Titles stay free of this rank's number so the same mistake on every rank merges into one.
    problems = []
    replicas, sampler_rank = getattr(sampler, "num_replicas", None), getattr(sampler, "rank", None)
    if replicas != world_size:
        problems.append(f"num_replicas={replicas} but the group has {world_size} ranks")
    if sampler_rank != rank:
        problems.append("a rank that is not the process's own rank")
    if not problems:
        return []
    return [SAMPLER_WORLD_MISMATCH(
        f"The DataLoader's {type(sampler).__name__} has " + " and ".join(problems),
        detail=("The sampler shards the dataset for another world: some samples are read by several ranks "
                "and others by none, and batch counts may differ between ranks."),
        ranks=(rank,), data={"num_replicas": replicas, "world_size": world_size}, check=CHECK,
    )]


def _distributed_sampler(loader: Any) -> Any:
    for candidate in (getattr(loader, "sampler", None), getattr(getattr(loader, "batch_sampler", None), "sampler", None)):
        if candidate is not None and hasattr(candidate, "num_replicas") and hasattr(candidate, "rank"):
            return candidate
    return None


def batch_count(loader: Any) -> int | None:
    """len(loader), or None when it has no length (IterableDataset) or len() fails."""
    if loader is None:
        return None
    try:
        return int(len(loader))
    except Exception:
        return None


# -- cross-rank (from values every rank has after the exchange) ---------------------------------


def batch_count_findings(counts: Mapping[int, int | None]) -> list[Finding]:
    """counts: rank -> len(dataloader) (None: unknown). Same answer on every rank."""
    known = {r: c for r, c in counts.items() if c is not None}
    unknown = sorted(r for r, c in counts.items() if c is None)
    if not counts:
        return []
    if unknown and known:
        return [BATCHES_UNKNOWN(
            f"Could not tell the batch count on {_ranks(unknown)} (the DataLoader has no length)",
            ranks=unknown, check=CHECK,
        )]
    if len(set(known.values())) <= 1:
        return []
    by_count: dict[int, list[int]] = {}
    for rank, count in sorted(known.items()):
        by_count.setdefault(count, []).append(rank)
    reference = known.get(0, known[min(known)])
    differing = sorted(r for r, c in known.items() if c != reference)
    spread = "; ".join(f"{_ranks(rs)}: {c} batches" for c, rs in sorted(by_count.items(), key=lambda kv: min(kv[1])))
    return [UNEVEN_BATCHES(
        f"Ranks get different numbers of batches per epoch: {spread}",
        detail=("The ranks that run out first stop joining DDP's gradient all-reduce; the others then wait "
                "in it until the collective times out. drop_last does not help when the ranks' datasets differ "
                "in size: it only drops each rank's own incomplete last batch."),
        remediation=("Wrap the training loop in the Join context manager, which shadows the collectives of the "
                     "ranks that ran out: from torch.distributed.algorithms.join import Join; "
                     "with Join([ddp_model]): for batch in loader: ... . Or give every rank the same number of "
                     "samples (one dataset shared through a DistributedSampler)."),
        ranks=differing, data={"batches": {str(r): c for r, c in sorted(known.items())}}, check=CHECK,
    )]


def version_findings(versions: Mapping[str, Any], reference: Mapping[str, Any], rank: int) -> list[Finding]:
    diffs = [f"{key} {versions.get(key)} (rank 0: {reference.get(key)})"
             for key in ("torch", "cuda") if versions.get(key) != reference.get(key)]
    if not diffs:
        return []
    return [VERSION_DIFFERS(
        f"Rank {rank} runs " + ", ".join(diffs),
        detail="Different builds may disagree on collective semantics or wire formats and fail or hang.",
        ranks=(rank,), data={"versions": dict(versions), "reference": dict(reference)}, check=CHECK,
    )]


def ranks_missing_finding(missing: Sequence[int], world_size: int, timeout: float, waited_by: str) -> Finding:
    return RANKS_MISSING(
        f"{_ranks(missing).capitalize()} of {world_size} did not reach preflight within {timeout:g} s",
        detail=(f"{waited_by} waited for every rank to check in through the process group's store. "
                "The missing ranks crashed, are stuck before preflight (data loading, a previous collective), "
                "or run a different code path that never calls it."),
        ranks=missing, check=CHECK,
    )


def _ranks(ranks: Iterable[int]) -> str:
    ranks = sorted(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + format_ranks(ranks)
