"""How each rank reads the data: DistributedSampler arguments, set_epoch, shuffling loaders."""

from __future__ import annotations

import ast

from distdoctor.lint.index import ModuleIndex
from distdoctor.lint.rules.base import DDP_WRAPPERS, Hit, inits_process_group, rule
from distdoctor.core.registry import finding_kind

_SAMPLER = "torch.utils.data.DistributedSampler"
_LOADER = "torch.utils.data.DataLoader"

LITERAL_SAMPLER = finding_kind(
    "lint.E006", cause="rank_config_error",
    title="DistributedSampler is given a literal num_replicas or rank",
    hint="Leave num_replicas and rank out (the sampler asks the process group), or pass dist.get_world_size() / dist.get_rank().",
)
NO_SET_EPOCH = finding_kind(
    "lint.W007", cause="uneven_inputs",
    title="A shuffling DistributedSampler is never told the epoch",
    hint="Call sampler.set_epoch(epoch) at the start of every epoch, on every rank.",
)
SHUFFLE_WITHOUT_SAMPLER = finding_kind(
    "lint.W008", cause="uneven_inputs",
    title="A DataLoader shuffles the whole dataset on every rank",
    hint="Give the DataLoader sampler=DistributedSampler(dataset) (and drop shuffle=True) so that each rank reads its own shard.",
)


@rule(
    LITERAL_SAMPLER,
    wrong=("import torch.distributed as dist\nfrom torch.utils.data import DistributedSampler\n\n"
           "dist.init_process_group('nccl')\nsampler = DistributedSampler(dataset, num_replicas=4, rank=0)  # lint.E006\n"),
    right=("import torch.distributed as dist\nfrom torch.utils.data import DistributedSampler\n\n"
           "dist.init_process_group('nccl')\nsampler = DistributedSampler(dataset)\n"),
)
def literal_sampler_arguments(index: ModuleIndex):
    if not _uses_torch_distributed(index):
        return  # e.g. a unit test of the sampler that plays each rank in turn
    for call in index.calls_to(_SAMPLER):
        literal = [name for position, name in ((1, "num_replicas"), (2, "rank"))
                   if isinstance(call.arg(position, name), ast.Constant)
                   and isinstance(call.arg(position, name).value, int)]
        if literal:
            values = ", ".join(f"{n}={call.arg(p, n).value}" for p, n in ((1, "num_replicas"), (2, "rank")) if n in literal)
            yield Hit(call.node, detail=f"{values} is fixed in the source: on any other world size or rank the "
                                        "ranks read overlapping or missing shards of the data.")


@rule(
    NO_SET_EPOCH,
    wrong=("from torch.utils.data import DataLoader, DistributedSampler\n\n"
           "sampler = DistributedSampler(dataset)  # lint.W007\nloader = DataLoader(dataset, sampler=sampler)\n"
           "for epoch in range(10):\n    for batch in loader:\n        step(batch)\n"),
    right=("from torch.utils.data import DataLoader, DistributedSampler\n\n"
           "sampler = DistributedSampler(dataset)\nloader = DataLoader(dataset, sampler=sampler)\n"
           "for epoch in range(10):\n    sampler.set_epoch(epoch)\n    for batch in loader:\n        step(batch)\n"),
)
def sampler_without_set_epoch(index: ModuleIndex):
    # Only a module that holds the epoch loop can be judged; elsewhere set_epoch may live beside it.
    if index.calls_named("set_epoch") or not any("epoch" in name.lower() for name in index.loop_targets):
        return
    for call in index.calls_to(_SAMPLER):
        shuffle = call.arg(3, "shuffle")
        if isinstance(shuffle, ast.Constant) and not shuffle.value:
            continue
        if call.has_star_kwargs() or _handed_to_other_code(index, call) or _is_evaluation_data(call):
            continue
        yield Hit(call.node, detail="The sampler shuffles with a seed derived from its epoch, which stays 0: every "
                                    "epoch visits the data in the same order on every rank.")


@rule(
    SHUFFLE_WITHOUT_SAMPLER,
    wrong=("import torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
           "from torch.utils.data import DataLoader\n\n"
           "dist.init_process_group('nccl')\nmodel = DDP(model)\n"
           "loader = DataLoader(dataset, batch_size=32, shuffle=True)  # lint.W008\n"),
    right=("import torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
           "from torch.utils.data import DataLoader, DistributedSampler\n\n"
           "dist.init_process_group('nccl')\nmodel = DDP(model)\n"
           "loader = DataLoader(dataset, batch_size=32, sampler=DistributedSampler(dataset))\n"),
)
def shuffle_without_sampler(index: ModuleIndex):
    if not inits_process_group(index) or not index.calls_to(*DDP_WRAPPERS):
        return  # without data parallelism (tensor/pipeline parallel) every rank should read the same data
    for call in index.calls_to(_LOADER):
        shuffle = call.arg(2, "shuffle")
        if not (isinstance(shuffle, ast.Constant) and shuffle.value is True):
            continue
        if call.has_star_kwargs() or call.arg(3, "sampler") is not None or call.keyword("batch_sampler") is not None:
            continue
        yield Hit(call.node, detail="This script starts a process group, yet the loader has no sampler: every rank "
                                    "iterates the whole dataset, so each epoch does the same work world-size times.")


def _handed_to_other_code(index: ModuleIndex, sampler) -> bool:
    """The sampler is passed to a function other than DataLoader, which may call set_epoch itself."""
    parent = sampler.parent
    if not isinstance(parent, ast.Assign) or len(parent.targets) != 1:
        return False
    name = ast.unparse(parent.targets[0])
    for call in index.calls:
        if call.qualname == _LOADER:
            continue
        values = [*call.node.args, *(k.value for k in call.node.keywords)]
        if any(ast.unparse(v) == name for v in values if isinstance(v, (ast.Name, ast.Attribute))):
            return True
    return False


def _is_evaluation_data(sampler) -> bool:
    """Validation/test samplers: their order does not matter, so a fixed one is harmless."""
    dataset = sampler.arg(0, "dataset")
    text = ast.unparse(dataset).lower() if dataset is not None else ""
    return any(word in text for word in ("val", "test", "eval"))


def _uses_torch_distributed(index: ModuleIndex) -> bool:
    return any(c.qualname and c.qualname.startswith("torch.distributed.") for c in index.calls) \
        or "RANK" in index.strings or "WORLD_SIZE" in index.strings
