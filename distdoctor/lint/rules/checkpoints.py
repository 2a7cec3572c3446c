"""Checkpoint writes that every rank performs at once."""

from __future__ import annotations

import ast

from distdoctor.lint.index import CallSite, ModuleIndex
from distdoctor.lint.ranks import is_main_flag, is_rank_condition, is_rank_value, rank_guarded
from distdoctor.lint.rules.base import Hit, assigned_values, is_multi_rank_script, rule
from distdoctor.core.registry import finding_kind

UNGUARDED_SAVE = finding_kind(
    "lint.W017", cause="rank_config_error",
    title="torch.save runs on every rank",
    hint="Write the checkpoint on one rank (if dist.get_rank() == 0:) and let the others wait at a barrier, or use torch.distributed.checkpoint.",
)


@rule(
    UNGUARDED_SAVE,
    wrong=("import torch\nimport torch.distributed as dist\n\ndist.init_process_group('nccl')\n"
           "torch.save(model.state_dict(), 'ckpt.pt')  # lint.W017\n"),
    right=("import torch\nimport torch.distributed as dist\n\ndist.init_process_group('nccl')\n"
           "if dist.get_rank() == 0:\n    torch.save(model.state_dict(), 'ckpt.pt')\n"),
)
def unguarded_save(index: ModuleIndex):
    if not is_multi_rank_script(index):
        return
    for call in index.calls_to("torch.save"):
        if _guarded(index, call, depth=3):
            continue
        path = call.arg(1, "f")
        if path is not None and _names_a_rank(index, call.function, path, depth=3):
            continue  # one file per rank (sharded state): intended
        if path is not None and _in_memory(index, call.function, path):
            continue  # torch.save into a BytesIO: no file
        if path is not None and _in_temporary_directory(index, call.function, path, depth=3):
            continue  # each process has its own temporary directory
        yield Hit(call.node, detail="Every rank writes the same file at the same time: the writes race on a shared "
                                    "file system and the file can end up truncated or mixed.")


def _guarded(index: ModuleIndex, call: CallSite, depth: int) -> bool:
    if rank_guarded(call.guards):
        return True
    function = call.function
    if function is None or isinstance(function, ast.Lambda):
        return False
    if _returns_early_off_main(function, call.node.lineno) or _main_only_name(function):
        return True
    if depth == 0:
        return False
    callers = [c for c in index.calls_named(function.name) if function in index.local_callees(c)]
    return bool(callers) and all(_guarded(index, c, depth - 1) for c in callers)


def _main_only_name(function) -> bool:
    """save_on_master(), @rank_zero_only, @master_only: the function itself runs on one rank."""
    name = function.name.lower()
    if any(word in name for word in ("on_master", "on_main", "main_process", "rank_zero", "rank0", "on_rank_0")):
        return True
    return any(is_main_flag(d) or "zero_only" in (ast.unparse(d)) or "master_only" in ast.unparse(d)
               for d in function.decorator_list)


def _returns_early_off_main(function, lineno: int) -> bool:
    """`if rank != 0: return` (at the top level of the function, before the call)."""
    for statement in function.body:
        if statement.lineno >= lineno:
            return False
        if isinstance(statement, ast.If) and is_rank_condition(statement.test) and statement.body \
                and isinstance(statement.body[-1], (ast.Return, ast.Raise, ast.Continue)):
            return True
    return False


def _names_a_rank(index: ModuleIndex, function, node: ast.AST, depth: int) -> bool:
    """Does the file name contain the rank (directly or through the variables it is built from)?"""
    for part in ast.walk(node):
        if isinstance(part, (ast.Name, ast.Attribute, ast.Call, ast.Subscript)) and is_rank_value(part):
            return True
        if depth and isinstance(part, ast.Name) and isinstance(part.ctx, ast.Load):
            if any(_names_a_rank(index, function, value, depth - 1)
                   for value in assigned_values(index, function, part.id)):
                return True
    return False


def _in_memory(index: ModuleIndex, function, path: ast.AST) -> bool:
    if isinstance(path, ast.Call):
        return (getattr(path.func, "attr", None) or getattr(path.func, "id", None)) == "BytesIO"
    if isinstance(path, ast.Name):
        return any(_in_memory(index, function, value) for value in assigned_values(index, function, path.id))
    return False


_TEMPORARY = ("tmp_path", "tmpdir", "tmp_path_factory", "mkdtemp", "TemporaryDirectory", "NamedTemporaryFile",
              "mkstemp", "gettempdir")


def _in_temporary_directory(index: ModuleIndex, function, path: ast.AST, depth: int) -> bool:
    """A path under a per-process temporary directory (pytest's tmp_path, tempfile)."""
    for part in ast.walk(path):
        name = getattr(part, "id", None) or getattr(part, "attr", None)
        if name in _TEMPORARY:
            return True
        if depth and isinstance(part, ast.Name) and isinstance(part.ctx, ast.Load):
            if any(_in_temporary_directory(index, function, value, depth - 1)
                   for value in assigned_values(index, function, part.id)):
                return True
    return False
