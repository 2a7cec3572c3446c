"""A lint rule: a finding kind, a function that finds it in a module index, and two examples."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Callable, Iterable

from distdoctor.core.findings import FindingKind
from distdoctor.lint.index import CallSite, ModuleIndex

COLLECTIVES = frozenset({
    "broadcast", "all_reduce", "reduce", "all_gather", "all_gather_into_tensor", "_all_gather_base",
    "gather", "scatter", "reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base", "all_to_all",
    "all_to_all_single", "barrier", "monitored_barrier", "broadcast_object_list", "all_gather_object",
    "gather_object", "scatter_object_list", "new_group", "new_subgroups",
})
RANK_QUERIES = frozenset({"get_rank", "get_world_size", "get_backend", "get_process_group_ranks"})
INIT_CALLS = frozenset({"torch.distributed.init_process_group"})
DDP_WRAPPERS = frozenset({
    "torch.nn.parallel.DistributedDataParallel", "torch.distributed.fsdp.FullyShardedDataParallel",
    "torch.distributed.fsdp.fully_shard", "torch.distributed._composable.replicate.replicate",
    "torch.distributed._composable.replicate", "torch.distributed.tensor.parallel.parallelize_module",
})


@dataclass(frozen=True)
class Hit:
    node: ast.AST
    detail: str = ""
    title: str | None = None


@dataclass(frozen=True)
class Rule:
    kind: FindingKind
    find: Callable[[ModuleIndex], Iterable[Hit]]
    wrong: str
    right: str

    @property
    def id(self) -> str:
        return self.kind.id


RULES: list[Rule] = []


def rule(kind: FindingKind, *, wrong: str, right: str) -> Callable:
    """Register a rule function with its kind and a wrong / right example (tests run both)."""

    def register(find: Callable[[ModuleIndex], Iterable[Hit]]) -> Callable:
        RULES.append(Rule(kind, find, wrong, right))
        return find

    return register


def dist_calls(index: ModuleIndex, names: Iterable[str]) -> list[CallSite]:
    """Calls of torch.distributed.<name>, however the module imported it."""
    return index.calls_to(*(f"torch.distributed.{n}" for n in names))


def inits_process_group(index: ModuleIndex) -> bool:
    return bool(index.calls_to(*INIT_CALLS))


def is_multi_rank_script(index: ModuleIndex) -> bool:
    """The module starts a process group or wraps a model in torch's DDP/FSDP itself."""
    return inits_process_group(index) or bool(index.calls_to(*DDP_WRAPPERS))


# Libraries whose trainers replicate (or shard) the model themselves.
_TRAINING_FRAMEWORKS = frozenset({"accelerate", "deepspeed", "lightning", "pytorch_lightning", "colossalai",
                                  "megatron", "fairscale", "torchtitan"})


def wraps_model(index: ModuleIndex) -> bool:
    """The module wraps a model in DDP/FSDP (torch's or a framework's), or hands it to a training framework."""
    if index.calls_to(*DDP_WRAPPERS):
        return True
    names = set(index.aliases.values())
    return any(n.split(".", 1)[0] in _TRAINING_FRAMEWORKS
               or n.rsplit(".", 1)[-1] in ("DistributedDataParallel", "FullyShardedDataParallel") for n in names)


def assigned_values(index: ModuleIndex, function, name: str) -> list[ast.expr]:
    """The values assigned to a plain name in one function (or at module level)."""
    out = []
    for statement, fn in index.assigns:
        if fn is not function or getattr(statement, "value", None) is None:
            continue
        targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            out.append(statement.value)
    return out


def is_expression_statement(call: CallSite) -> bool:
    return isinstance(call.parent, ast.Expr)


def local_closure(index: ModuleIndex, function, depth: int = 3) -> list:
    """The module's functions reachable from `function` by calls (itself included), up to depth."""
    key = (id(function), depth)
    cached = index.memo.get(key)
    if cached is not None:
        return cached
    seen = {id(function): function}
    frontier = [function]
    for _ in range(depth):
        nxt = []
        for fn in frontier:
            for call in index.calls_in(fn):
                for callee in index.local_callees(call):
                    if id(callee) not in seen:
                        seen[id(callee)] = callee
                        nxt.append(callee)
        frontier = nxt
    index.memo[key] = out = list(seen.values())
    return out
