"""Resolve the names a module uses to the qualified names of what they import (aliases included)."""

from __future__ import annotations

import ast

# Where torch exposes the same object under several paths, the canonical one is kept.
_CANONICAL_PREFIXES: tuple[tuple[str, str], ...] = (
    ("torch.distributed.distributed_c10d.", "torch.distributed."),
    ("torch.nn.parallel.distributed.", "torch.nn.parallel."),
    ("torch.nn.parallel.data_parallel.", "torch.nn.parallel."),
    ("torch.nn.DataParallel", "torch.nn.parallel.DataParallel"),
    ("torch.utils.data.distributed.", "torch.utils.data."),
    ("torch.utils.data.sampler.", "torch.utils.data."),
    ("torch.utils.data.dataloader.", "torch.utils.data."),
    ("torch.distributed._composable.fsdp.", "torch.distributed.fsdp."),
    ("torch.distributed.fsdp.fully_sharded_data_parallel.", "torch.distributed.fsdp."),
    ("torch.random.manual_seed", "torch.manual_seed"),
)


def canonical(qualname: str) -> str:
    for prefix, replacement in _CANONICAL_PREFIXES:
        if qualname.startswith(prefix):
            return replacement + qualname[len(prefix):]
    return qualname


def add_import(node: ast.stmt, aliases: dict[str, str]) -> None:
    """Record the local names an import (or a `dist = torch.distributed` alias) binds."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.asname:
                aliases[alias.asname] = alias.name
            else:
                root = alias.name.split(".", 1)[0]
                aliases[root] = root
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
        for alias in node.names:
            if alias.name != "*":
                aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        dotted = dotted_name(node.value)
        if dotted and "." in dotted and dotted.split(".", 1)[0] in aliases:
            aliases.setdefault(node.targets[0].id, dotted)


def dotted_name(node: ast.AST) -> str | None:
    """`a.b.c` for a Name/Attribute chain, else None."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def resolve(node: ast.AST, aliases: dict[str, str]) -> str | None:
    """The canonical qualified name of a Name/Attribute chain whose root is an import, else None."""
    dotted = dotted_name(node)
    if dotted is None:
        return None
    root, _, rest = dotted.partition(".")
    target = aliases.get(root)
    if target is None:
        return None
    return canonical(f"{target}.{rest}" if rest else target)


def last_part(node: ast.AST) -> str | None:
    """The final identifier of a call's function (`f` in `a.b.f` or `f`)."""
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None
