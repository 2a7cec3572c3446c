"""Random seeds that differ per rank while nothing makes the initial parameters agree."""

from __future__ import annotations

import ast

from distdoctor.lint.index import ModuleIndex
from distdoctor.lint.ranks import is_rank_value
from distdoctor.lint.rules.base import Hit, dist_calls, rule, wraps_model
from distdoctor.core.registry import finding_kind

RANK_SEED = finding_kind(
    "lint.W016", cause="param_divergence",
    title="The torch seed depends on the rank and nothing synchronises the initial parameters",
    hint="Seed torch identically on every rank before building the model (or broadcast the parameters / wrap in DDP); add the rank only to data-side seeds.",
)
_SEEDS = ("torch.manual_seed", "torch.cuda.manual_seed", "torch.cuda.manual_seed_all")


@rule(
    RANK_SEED,
    wrong=("import torch\nimport torch.distributed as dist\n\ndist.init_process_group('gloo')\n"
           "torch.manual_seed(1234 + dist.get_rank())  # lint.W016\nmodel = torch.nn.Linear(10, 10)\n"
           "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nmodel(x).sum().backward()\nopt.step()\n"),
    right=("import torch\nimport torch.distributed as dist\n\ndist.init_process_group('gloo')\n"
           "torch.manual_seed(1234)\nmodel = torch.nn.Linear(10, 10)\n"
           "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nmodel(x).sum().backward()\nopt.step()\n"),
)
def rank_dependent_seed(index: ModuleIndex):
    if wraps_model(index) or dist_calls(index, ("broadcast", "broadcast_object_list", "all_reduce")):
        return  # DDP/FSDP broadcast rank 0's parameters; a manual broadcast does the same
    if not (index.calls_named("backward") and index.calls_named("step")):
        return  # nothing is trained here: a per-rank seed only makes per-rank data
    for call in index.calls_to(*_SEEDS):
        if call.node.args and _mentions_rank(call.node.args[0]):
            yield Hit(call.node, detail=f"`{ast.unparse(call.node.args[0])}` differs per rank, so every rank "
                                        "initialises different parameters and no DDP/FSDP wrap or broadcast "
                                        "in this module makes them agree.")


def _mentions_rank(node: ast.AST) -> bool:
    return any(is_rank_value(n) for n in ast.walk(node) if isinstance(n, (ast.Name, ast.Attribute, ast.Call, ast.Subscript)))
