"""torch.distributed used before init_process_group on a straight path through a function."""

from __future__ import annotations

import ast

from distdoctor.lint.index import CallSite, ModuleIndex
from distdoctor.lint.rules.base import COLLECTIVES, INIT_CALLS, RANK_QUERIES, Hit, local_closure, rule
from distdoctor.core.registry import finding_kind

BEFORE_INIT = finding_kind(
    "lint.E013", cause="pg_not_initialized",
    title="torch.distributed is used before init_process_group",
    hint="Call dist.init_process_group(...) first; read the rank from the environment (RANK, LOCAL_RANK) if it is needed earlier.",
)
_NEEDS_GROUP = frozenset(f"torch.distributed.{n}" for n in RANK_QUERIES | COLLECTIVES)
# Statements whose body runs unconditionally, once, in order.
_STRAIGHT_BLOCKS = (ast.With, ast.AsyncWith)


@rule(
    BEFORE_INIT,
    wrong="import torch.distributed as dist\n\nrank = dist.get_rank()  # lint.E013\ndist.init_process_group('nccl')\n",
    right="import torch.distributed as dist\n\ndist.init_process_group('nccl')\nrank = dist.get_rank()\n",
)
def used_before_init(index: ModuleIndex):
    initialising = _initialising_functions(index)
    if not initialising and not index.calls_to(*INIT_CALLS):
        return
    # A decorated function may get its process group from the decorator.
    scopes = [(None, index.tree.body)] + [(f, f.body) for fns in index.functions.values() for f in fns
                                          if not f.decorator_list]
    for function, body in scopes:
        yield from _scan_block(index, function, _straight_statements(body), initialising)


def _initialising_functions(index: ModuleIndex) -> set[int]:
    """Functions of the module that call init_process_group, directly or through their callees."""
    direct = {id(c.function) for c in index.calls_to(*INIT_CALLS) if c.function is not None}
    out = set()
    for functions in index.functions.values():
        for function in functions:
            if any(id(fn) in direct for fn in local_closure(index, function)):
                out.add(id(function))
    return out


def _straight_statements(body: list[ast.stmt]) -> list[ast.stmt]:
    out: list[ast.stmt] = []
    for statement in body:
        if isinstance(statement, _STRAIGHT_BLOCKS):
            out.extend(_straight_statements(statement.body))
        else:
            out.append(statement)
    return out


def _scan_block(index: ModuleIndex, function, statements: list[ast.stmt], initialising: set[int]):
    by_statement: dict[int, list[CallSite]] = {id(statement): [] for statement in statements}
    for call in index.calls_in(function):
        if id(call.statement) in by_statement and not call.guards and not _in_conditional_expr(call):
            by_statement[id(call.statement)].append(call)
    early: list[CallSite] = []
    for statement in statements:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        calls = by_statement[id(statement)]
        if any(c.qualname in INIT_CALLS or any(id(f) in initialising for f in index.local_callees(c)) for c in calls):
            for call in early:
                yield Hit(call.node, detail=f"`{call.callee}()` runs at line {call.node.lineno}, before the process group "
                                            f"is initialised at line {statement.lineno}: it raises (or, on old "
                                            "torch, returns a default) there.")
            return
        early.extend(c for c in calls if c.qualname in _NEEDS_GROUP)


def _in_conditional_expr(call: CallSite) -> bool:
    """Calls inside `x if c else y`, `a and b`, lambdas or comprehensions do not run unconditionally."""
    return isinstance(call.parent, (ast.IfExp, ast.BoolOp, ast.Lambda, ast.comprehension,
                                    ast.ListComp, ast.DictComp, ast.SetComp, ast.GeneratorExp))
