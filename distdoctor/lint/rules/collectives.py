"""Collectives that not every rank reaches, and collectives whose output is thrown away."""

from __future__ import annotations

import ast

from distdoctor.lint.index import CallSite, ModuleIndex
from distdoctor.lint.names import resolve
from distdoctor.lint.ranks import is_membership_condition, is_rank_condition, rank_guarded
from distdoctor.lint.rules.base import COLLECTIVES, Hit, dist_calls, local_closure, rule
from distdoctor.core.registry import finding_kind

RANK_CONDITIONAL = finding_kind(
    "lint.E004", cause="collective_mismatch",
    title="A collective runs only on some ranks",
    hint="Call the collective on every rank of the group (move it out of the rank check, or add it to the other branch).",
)
TEMPORARY_OUTPUT = finding_kind(
    "lint.E005", cause="param_divergence",
    title="A collective writes its result into a temporary that is thrown away",
    hint="Put the value in a named tensor, pass that tensor, and read the result from it afterwards.",
)


@rule(
    RANK_CONDITIONAL,
    wrong="import torch.distributed as dist\n\nif dist.get_rank() == 0:\n    dist.broadcast(t, src=0)  # lint.E004\n",
    right="import torch.distributed as dist\n\ndist.broadcast(t, src=0)\n",
)
def rank_conditional_collective(index: ModuleIndex):
    if not dist_calls(index, COLLECTIVES):
        return  # no collective anywhere in the module
    reach = _collectives_reached(index)
    # (id of an if-test, side) -> collective name -> first call there
    sides: dict[tuple[int, bool], dict[str, CallSite]] = {}
    scope_of: dict[int, object] = {}
    calls_by_name: dict[str, list[CallSite]] = {}
    for call in index.calls:
        names = _collectives_of(call, index, reach)
        for name in names:
            calls_by_name.setdefault(name, []).append(call)
        for test, in_body in call.guards:
            if not names or not is_rank_condition(test):
                continue
            if _subgroup_member_call(call, test):
                continue
            scope_of[id(test)] = call.function or call.cls
            for name in names:
                sides.setdefault((id(test), in_body), {}).setdefault(name, call)
    for (test_id, side), found in sides.items():
        other = sides.get((test_id, not side), {})
        for name, call in found.items():
            if name in other or _matched_elsewhere(sides, scope_of, test_id, name) \
                    or _called_outside_branch(calls_by_name[name], call, test_id, side):
                continue
            via = "" if call.callee == name else f" (through `{call.name}()`, which calls it)"
            yield Hit(call.node, title=f"`{name}` runs only on the ranks that take this branch",
                      detail=f"`{name}`{via} is inside a rank-dependent `if` and the other branch does not call "
                             "it: the ranks that skip it never join, and the ones that call it wait forever.")


def _subgroup_member_call(call: CallSite, test) -> bool:
    """`if rank in group_ranks: all_reduce(t, group=g)`: only the members of g take part, as they should."""
    group = call.keyword("group")
    return group is not None and not (isinstance(group, ast.Constant) and group.value is None) \
        and is_membership_condition(test)


def _called_outside_branch(calls: list[CallSite], call: CallSite, test_id: int, side: bool) -> bool:
    """The same collective elsewhere in the function, off this branch: the other ranks' call (elif chains,
    `if rank not in members: barrier(); return` ... `barrier()`)."""
    return any(other.function is call.function and other is not call
               and not any(id(t) == test_id and s == side for t, s in other.guards)
               for other in calls)


def _collectives_of(call: CallSite, index: ModuleIndex, reach: dict[int, set[str]]) -> set[str]:
    if call.qualname and call.qualname.startswith("torch.distributed.") and call.callee in COLLECTIVES:
        return {call.callee}
    names: set[str] = set()
    for callee in index.local_callees(call):
        names |= reach.get(id(callee), set())
    return names


def _collectives_reached(index: ModuleIndex) -> dict[int, set[str]]:
    """For each function of the module, the collectives it calls, directly or through its callees."""
    direct: dict[int, set[str]] = {}
    for call in dist_calls(index, COLLECTIVES):
        direct.setdefault(id(call.function), set()).add(call.callee)
    reach: dict[int, set[str]] = {}
    for functions in index.functions.values():
        for function in functions:
            names: set[str] = set()
            for fn in local_closure(index, function):
                names |= direct.get(id(fn), set())
            if names:
                reach[id(function)] = names
    return reach


def _matched_elsewhere(sides, scope_of, test_id: int, name: str) -> bool:
    """The same collective under another rank check of the same function (the zero-first pattern)."""
    scope = scope_of.get(test_id)
    return any(other_test != test_id and scope_of.get(other_test) is scope and name in found
               for (other_test, _side), found in sides.items())


# collective -> (position, keyword) of the argument that receives the result, and whether that
# argument is output only (then any temporary loses data) or also input (a constant-only
# temporary there is a synchronisation dummy, not a mistake).
_OUTPUT_ARG: dict[str, tuple[int, str, bool]] = {
    "broadcast": (0, "tensor", False), "all_reduce": (0, "tensor", False), "reduce": (0, "tensor", False),
    "broadcast_object_list": (0, "object_list", False),
    "all_gather": (0, "tensor_list", True), "all_gather_into_tensor": (0, "output_tensor", True),
    "reduce_scatter": (0, "output", True), "reduce_scatter_tensor": (0, "output", True),
    "all_to_all_single": (0, "output", True), "all_to_all": (0, "output_tensor_list", True),
    "all_gather_object": (0, "object_list", True), "recv": (0, "tensor", True), "irecv": (0, "tensor", True),
    "scatter": (0, "tensor", True), "gather": (1, "gather_list", True), "gather_object": (1, "object_gather_list", True),
}
_SENT_FROM_SOURCE = frozenset({"broadcast", "broadcast_object_list"})
_FACTORIES = frozenset({
    "tensor", "zeros", "ones", "empty", "full", "zeros_like", "ones_like", "empty_like", "full_like", "rand",
    "randn", "randint", "arange", "linspace", "cat", "concat", "stack", "Tensor", "FloatTensor", "LongTensor",
    "IntTensor", "DoubleTensor", "HalfTensor", "BoolTensor", "ByteTensor",
})
_NEW_TENSOR_METHODS = frozenset({"clone", "new_tensor", "new_zeros", "new_ones", "new_empty", "new_full"})
# Conversions return their receiver when nothing changes, so they are temporary only on a temporary.
_CONVERSIONS = frozenset({"to", "cuda", "cpu", "float", "double", "half", "bfloat16", "long", "int", "contiguous",
                          "view", "reshape", "flatten", "unsqueeze", "squeeze"})


@rule(
    TEMPORARY_OUTPUT,
    wrong="import torch\nimport torch.distributed as dist\n\ndist.broadcast(torch.tensor(lr), src=0)  # lint.E005\n",
    right="import torch\nimport torch.distributed as dist\n\nlr_t = torch.tensor(lr)\ndist.broadcast(lr_t, src=0)\n"
          "lr = lr_t.item()\n",
)
def temporary_output(index: ModuleIndex):
    for call in dist_calls(index, _OUTPUT_ARG):
        position, keyword, output_only = _OUTPUT_ARG[call.callee]
        arg = call.arg(position, keyword)
        if arg is None or not _is_temporary(arg, index):
            continue
        if not output_only and not _carries_data(arg, index):
            continue  # e.g. all_reduce(torch.zeros(1)) used as a barrier
        if call.callee in _SENT_FROM_SOURCE and rank_guarded(call.guards):
            continue  # the source rank's side of a broadcast: what it sends may be a temporary
        text = ast.get_source_segment(index.text, arg) or "the argument"
        yield Hit(call.node, detail=f"`{call.callee}` writes its result into `{text}`, a new object that no name "
                                    "refers to: the value each rank receives is lost.")


def _is_temporary(node: ast.AST, index: ModuleIndex) -> bool:
    if isinstance(node, (ast.List, ast.Tuple, ast.ListComp)):
        return True
    if isinstance(node, ast.BinOp):
        return True
    if isinstance(node, ast.Call):
        func = node.func
        if call_is_torch_factory(node, index):
            return True
        if isinstance(func, ast.Attribute):
            if func.attr in _NEW_TENSOR_METHODS:
                return True
            if func.attr in _CONVERSIONS:
                return _is_temporary(func.value, index)
    return False


def call_is_torch_factory(node: ast.Call, index: ModuleIndex) -> bool:
    qualname = resolve(node.func, index.aliases)
    return bool(qualname and qualname.startswith("torch.") and qualname.rsplit(".", 1)[-1] in _FACTORIES
                and qualname.count(".") == 1)


def _carries_data(node: ast.AST, index: ModuleIndex) -> bool:
    """Does the temporary hold a value from the program (a variable), not only constants?"""
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, (ast.Name, ast.Attribute, ast.Subscript)):
            return True
        if isinstance(current, ast.Call):
            stack.extend(current.args)  # keywords (device=, dtype=) are not the value
            func = current.func
            if isinstance(func, ast.Attribute) and not call_is_torch_factory(current, index):
                stack.append(func.value)  # the receiver of x.clone()
            continue
        stack.extend(child for child in ast.iter_child_nodes(current) if isinstance(child, ast.expr))
    return False
