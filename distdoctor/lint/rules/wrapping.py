"""How the model is replicated: DataParallel under a process group, a model never wrapped."""

from __future__ import annotations

import ast

from distdoctor.lint.index import ModuleIndex
from distdoctor.lint.rules.base import Hit, dist_calls, inits_process_group, rule, wraps_model
from distdoctor.core.registry import finding_kind

DATA_PARALLEL = finding_kind(
    "lint.E009", cause="duplicate_gpu",
    title="nn.DataParallel in a script that starts a process group",
    hint="Wrap the model in DistributedDataParallel(model, device_ids=[local_rank]) instead; one process per GPU.",
)
NEVER_WRAPPED = finding_kind(
    "lint.W010", cause="param_divergence",
    title="The model is trained on several ranks but never wrapped in DDP or FSDP",
    hint="Wrap the model in DistributedDataParallel (or FSDP) before building the optimizer, so gradients are averaged.",
)


@rule(
    DATA_PARALLEL,
    wrong="import torch.distributed as dist\nimport torch.nn as nn\n\ndist.init_process_group('nccl')\nmodel = nn.DataParallel(model)  # lint.E009\n",
    right=("import torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n\n"
           "dist.init_process_group('nccl')\nmodel = DDP(model, device_ids=[local_rank])\n"),
)
def data_parallel_with_process_group(index: ModuleIndex):
    if not inits_process_group(index):
        return
    for call in index.calls_to("torch.nn.parallel.DataParallel"):
        if call.guards:
            continue  # typically the single-process branch of a script that can run both ways
        yield Hit(call.node, detail="Each rank's DataParallel replicates the model over every GPU it sees, so the "
                                    "ranks share GPUs, and gradients are not averaged across ranks.")


_TRAINING_CALLS = ("backward", "step")
# Collectives that a script averaging gradients by hand would call.
_MANUAL_SYNC = ("all_reduce", "broadcast", "reduce_scatter", "reduce_scatter_tensor", "all_gather_into_tensor")


@rule(
    NEVER_WRAPPED,
    wrong=("import torch\nimport torch.distributed as dist\n\ndist.init_process_group('nccl')\n"
           "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # lint.W010\nloss.backward()\noptimizer.step()\n"),
    right=("import torch\nimport torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n\n"
           "dist.init_process_group('nccl')\nmodel = DDP(model)\n"
           "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\nloss.backward()\noptimizer.step()\n"),
)
def model_never_wrapped(index: ModuleIndex):
    if not inits_process_group(index) or wraps_model(index) or dist_calls(index, _MANUAL_SYNC):
        return
    if not all(index.calls_named(name) for name in _TRAINING_CALLS):
        return
    if any(q.startswith(("torch.distributed.rpc", "torch.distributed.pipelining", "torch.distributed.tensor"))
           for q in index.aliases.values()):
        return  # model parallelism: the ranks hold different parts, not replicas
    optimizers = [c for c in index.calls if c.qualname and c.qualname.startswith("torch.optim.")
                  and c.node.args and _is_parameters_call(c.node.args[0])]
    for call in optimizers[:1]:
        yield Hit(call.node, detail="The script starts a process group and steps an optimizer, but no model is wrapped "
                                    "in DDP/FSDP and no gradient is all-reduced: each rank trains its own copy.")


def _is_parameters_call(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "parameters"
