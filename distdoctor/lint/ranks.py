"""What in a module's source stands for a rank: rank-dependent conditions, global-rank values."""

from __future__ import annotations

import ast
import re

from distdoctor.lint.index import FunctionNode, ModuleIndex
from distdoctor.lint.names import dotted_name, last_part

# Identifiers that hold a rank (rank, local_rank, global_rank, self.gpu_rank, args.rank, ...).
_RANK_NAME = re.compile(r"(^|_)(rank|rank_id|rank_idx|process_index|local_process_index)$|^(gpu|gpu_id|local_gpu)$", re.I)
# Identifiers and calls that say "this is the main / rank-zero process".
_MAIN_NAME = re.compile(
    r"^(is_)?(main|master|primary|rank_?zero|rank0|local_main|local_master|main_process|master_process|"
    r"local_main_process|main_worker|world_process_zero|local_process_zero|chief|leader|coordinator)(_process|_rank|_worker|_node)?$",
    re.I,
)
_RANK_CALLS = {"get_rank", "get_local_rank", "get_global_rank", "get_node_rank", "get_group_rank", "get_process_index"}
_RANK_ENV = {"RANK", "LOCAL_RANK", "GROUP_RANK", "NODE_RANK", "SLURM_PROCID", "SLURM_LOCALID", "OMPI_COMM_WORLD_RANK",
             "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_RANK"}
_GLOBAL_ENV = {"RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"}


def identifier(node: ast.AST) -> str | None:
    """The last identifier of a name or attribute (`rank` for `self.args.rank`)."""
    return last_part(node)


def is_rank_value(node: ast.AST) -> bool:
    """An expression that is a rank: a rank-named variable, get_rank(), os.environ["RANK"]."""
    if isinstance(node, ast.Call):
        if identifier(node.func) == "int" and node.args:
            return is_rank_value(node.args[0])
        name = identifier(node.func)
        if name in _RANK_CALLS:
            return True
        if name in ("get", "getenv") and node.args and _env_key(node.args[0]) in _RANK_ENV:
            return True
        return False
    if isinstance(node, ast.Subscript):
        return _env_key(node.slice) in _RANK_ENV
    while isinstance(node, ast.BinOp):
        node = node.left  # rank % gpus_per_node
    name = identifier(node)
    return bool(name and _RANK_NAME.search(name))


def is_main_flag(node: ast.AST) -> bool:
    """`is_main_process`, `self.is_master`, `accelerator.is_main_process`, `is_main_process()`."""
    if isinstance(node, ast.Call):
        node = node.func
    name = identifier(node)
    return bool(name and _MAIN_NAME.match(name))


def _env_key(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _is_all_ranks_constant(node: ast.AST) -> bool:
    """-1 ("not distributed") and None compare equal on every rank alike."""
    if isinstance(node, ast.Constant):
        return node.value is None or (isinstance(node.value, (int, float)) and node.value < 0)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return True
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return all(_is_all_ranks_constant(e) for e in node.elts)
    return False


def is_rank_condition(test: ast.AST) -> bool:
    """Does this `if` test take different values on different ranks?"""
    if isinstance(test, ast.BoolOp):
        return any(is_rank_condition(v) for v in test.values)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return is_rank_condition(test.operand)
    if isinstance(test, ast.Compare):
        operands = [test.left, *test.comparators]
        ranky = [o for o in operands if is_rank_value(o)]
        if not ranky:
            return False
        others = [o for o in operands if not is_rank_value(o)]
        if any(_is_all_ranks_constant(o) for o in others):
            return False
        if len(test.ops) == 1 and isinstance(test.ops[0], ast.GtE) and _is_zero(test.comparators[0]):
            return False  # rank >= 0: every rank
        return True
    if is_main_flag(test):
        return True
    if isinstance(test, ast.Call):
        return identifier(test.func) in _RANK_CALLS
    if isinstance(test, (ast.Name, ast.Attribute)):
        return is_rank_value(test)  # `if rank:` is true on every rank but 0
    return False


def _is_zero(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value == 0


def rank_guarded(guards) -> bool:
    return any(is_rank_condition(test) for test, _in_body in guards)


def global_rank_names(index: ModuleIndex) -> dict[int, set[str]]:
    """Per function (id, 0 for module level): dotted names that hold the *global* rank.

    A name qualifies by its provenance: assigned from get_rank() or the RANK variable (or from
    a function of this module that returns such a value), named global_rank, or a parameter
    that a call in this module passes such a value to.
    """
    held: dict[int, set[str]] = {0: {"global_rank"}}
    returning: set[str] = set()
    for _round in range(2):
        for statement, function in index.assigns:
            value = getattr(statement, "value", None)
            if value is None or not (_is_global_rank_source(value) or _calls_one_of(value, returning)):
                continue
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            for target in targets:
                dotted = dotted_name(target)
                if dotted:
                    held.setdefault(_key(function), set()).add(dotted)
        if _round or len(held) == 1 and len(held[0]) == 1:
            break  # nothing holds the global rank: no function can return it
        returning = _functions_returning_global_rank(index, held)
    _pass_to_parameters(index, held)
    return held


def _calls_one_of(value: ast.AST, names: set[str]) -> bool:
    return isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in names


def _functions_returning_global_rank(index: ModuleIndex, held: dict[int, set[str]]) -> set[str]:
    return {function.name for node, function in index.returns
            if function is not None and not isinstance(function, ast.Lambda) and node.value is not None
            and holds_global_rank(node.value, function, held)}


def _key(function: FunctionNode | None) -> int:
    return id(function) if function is not None else 0


def _is_global_rank_source(value: ast.AST) -> bool:
    if isinstance(value, ast.Call):
        name = identifier(value.func)
        if name == "int" and value.args:
            return _is_global_rank_source(value.args[0])
        if name in ("get_rank", "get_global_rank"):
            return True
        if name in ("get", "getenv") and value.args and _env_key(value.args[0]) in _GLOBAL_ENV:
            return True
        return False
    if isinstance(value, ast.Subscript):
        return _env_key(value.slice) in _GLOBAL_ENV
    return False


def holds_global_rank(node: ast.AST, function: FunctionNode | None, held: dict[int, set[str]]) -> bool:
    if _is_global_rank_source(node):
        return True
    dotted = dotted_name(node)
    if dotted is None:
        return False
    if dotted in held.get(_key(function), ()) or dotted.rsplit(".", 1)[-1] == "global_rank":
        return True
    # self.x assigned in another method of the class.
    return dotted.startswith("self.") and any(dotted in names for names in held.values())


def _pass_to_parameters(index: ModuleIndex, held: dict[int, set[str]]) -> None:
    """`demo(rank)` where rank holds the global rank: demo's parameter holds it too (one hop)."""
    for call in index.calls:
        callees = index.local_callees(call)
        if not callees:
            continue
        for position, arg in enumerate(call.node.args):
            if isinstance(arg, ast.Starred) or not holds_global_rank(arg, call.function, held):
                continue
            for callee in callees:
                params = [a.arg for a in callee.args.posonlyargs + callee.args.args]
                if params and params[0] in ("self", "cls"):
                    params = params[1:]
                if position < len(params):
                    held.setdefault(id(callee), set()).add(params[position])


def is_membership_condition(test: ast.AST) -> bool:
    """`rank in group_ranks`, `lo <= rank < hi`: is this rank a member of some subgroup?"""
    if isinstance(test, ast.BoolOp):
        return any(is_membership_condition(v) for v in test.values)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return is_membership_condition(test.operand)
    if not isinstance(test, ast.Compare) or not is_rank_condition(test):
        return False
    if any(isinstance(op, (ast.In, ast.NotIn)) for op in test.ops):
        return not all(isinstance(c, (ast.List, ast.Tuple, ast.Set)) and all(isinstance(e, ast.Constant) for e in c.elts)
                       for c in test.comparators)
    return len(test.ops) == 2  # a range: lo <= rank < hi
