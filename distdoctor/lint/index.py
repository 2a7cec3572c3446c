"""One walk over a module's tree that records what the rules ask about: calls in their context."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from distdoctor.lint.names import add_import, last_part, resolve

FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
# A guard: the test of an enclosing `if` (or conditional expression) and whether we are in its body.
Guard = tuple[ast.expr, bool]


@dataclass(frozen=True)
class CallSite:
    node: ast.Call
    qualname: str | None  # canonical name when the callee is imported (torch.distributed.broadcast)
    name: str | None  # the callee's last identifier (broadcast, set_epoch, my_helper)
    function: FunctionNode | None  # None at module level
    cls: ast.ClassDef | None
    guards: tuple[Guard, ...]
    parent: ast.AST
    statement: ast.stmt

    @property
    def callee(self) -> str | None:
        """What is called, by its own name: `broadcast` for `bc(...)` after `import broadcast as bc`."""
        return self.qualname.rsplit(".", 1)[-1] if self.qualname else self.name

    def keyword(self, name: str) -> ast.expr | None:
        for kw in self.node.keywords:
            if kw.arg == name:
                return kw.value
        return None

    def has_star_kwargs(self) -> bool:
        return any(kw.arg is None for kw in self.node.keywords)

    def arg(self, index: int, name: str) -> ast.expr | None:
        """A parameter given by position or keyword."""
        value = self.keyword(name)
        if value is not None:
            return value
        args = self.node.args
        if index < len(args) and not any(isinstance(a, ast.Starred) for a in args[: index + 1]):
            return args[index]
        return None


@dataclass
class ModuleIndex:
    path: str
    tree: ast.Module
    text: str
    lines: list[str]
    aliases: dict[str, str]
    calls: list[CallSite] = field(default_factory=list)
    functions: dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]] = field(default_factory=dict)
    # (function or None, name) -> line numbers where the name is read.
    loads: dict[tuple[int, str], list[int]] = field(default_factory=dict)
    assigns: list[tuple[ast.stmt, FunctionNode | None]] = field(default_factory=list)
    returns: list[tuple[ast.Return, FunctionNode | None]] = field(default_factory=list)
    strings: set[str] = field(default_factory=set)
    attributes_read: set[str] = field(default_factory=set)
    memo: dict = field(default_factory=dict)  # per-module caches of the rules (closures)
    loop_targets: set[str] = field(default_factory=set)
    _by_name: dict[str, list[CallSite]] | None = None
    _by_function: dict[int, list[CallSite]] | None = None
    _by_qualname: dict[str, list[CallSite]] | None = None

    def calls_in(self, function: FunctionNode | None) -> list[CallSite]:
        """Calls whose innermost enclosing function is `function` (None: module level)."""
        if self._by_function is None:
            self._by_function = {}
            for call in self.calls:
                self._by_function.setdefault(id(call.function), []).append(call)
        return self._by_function.get(id(function), [])

    def calls_named(self, *names: str) -> list[CallSite]:
        if self._by_name is None:
            self._by_name = {}
            for call in self.calls:
                if call.name:
                    self._by_name.setdefault(call.name, []).append(call)
        out: list[CallSite] = []
        for name in names:
            out.extend(self._by_name.get(name, ()))
        return out

    def calls_to(self, *qualnames: str) -> list[CallSite]:
        """Calls of these canonical qualified names, whatever local alias the module uses."""
        if self._by_qualname is None:
            self._by_qualname = {}
            for call in self.calls:
                if call.qualname:
                    self._by_qualname.setdefault(call.qualname, []).append(call)
        out: list[CallSite] = []
        for qualname in qualnames:
            out.extend(self._by_qualname.get(qualname, ()))
        return out

    def local_callees(self, call: CallSite) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
        """Functions of this module a call may reach: `f()` (not imported) or `self.f()`."""
        func = call.node.func
        if type(func) is ast.Name:
            return self.functions.get(func.id, ()) if func.id not in self.aliases else ()
        if type(func) is ast.Attribute and type(func.value) is ast.Name and func.value.id in ("self", "cls"):
            return self.functions.get(func.attr, ())
        return ()

    def source_line(self, lineno: int) -> str:
        return self.lines[lineno - 1].rstrip("\r\n") if 0 < lineno <= len(self.lines) else ""

    def loaded_after(self, function: FunctionNode | None, name: str, lineno: int) -> bool:
        return any(line >= lineno for line in self.loads.get((id(function), name), ()))


def build_index(path: str, tree: ast.Module, text: str) -> ModuleIndex:
    index = ModuleIndex(path=path, tree=tree, text=text, lines=text.splitlines(), aliases={})
    walker = _Walker(index)
    walker.walk_body(tree.body, None, None, ())
    # Names resolve once every import is known (an import below a use still binds it at run time).
    index.calls = [CallSite(node, resolve(node.func, index.aliases), last_part(node.func), *rest)
                   for node, *rest in walker.raw_calls]
    return index


class _Walker:
    """A hand-written recursion (faster than NodeVisitor) that carries the enclosing context."""

    def __init__(self, index: ModuleIndex) -> None:
        self.index = index
        self.raw_calls: list[tuple] = []

    def walk_body(self, body: list[ast.stmt], function, cls, guards: tuple[Guard, ...]) -> None:
        for statement in body:
            self.walk_statement(statement, function, cls, guards)

    def walk_statement(self, node: ast.stmt, function, cls, guards) -> None:
        index = self.index
        kind = type(node)
        # The most common statements first, taken apart by hand (as in walk_expr).
        if kind is ast.Expr or kind is ast.Return:
            if kind is ast.Return:
                index.returns.append((node, function))
            if node.value is not None:
                self.walk_expr(node.value, node, function, cls, guards, node)
            return
        if kind is ast.Assign:
            index.assigns.append((node, function))
            add_import(node, index.aliases)
            for target in node.targets:
                self.walk_expr(target, node, function, cls, guards, node)
            self.walk_expr(node.value, node, function, cls, guards, node)
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            index.functions.setdefault(node.name, []).append(node)
            for expr in [*node.decorator_list, *node.args.defaults, *node.args.kw_defaults]:
                if expr is not None:
                    self.walk_expr(expr, node, function, cls, guards, node)
            self.walk_body(node.body, node, cls, ())
            return
        if isinstance(node, ast.ClassDef):
            for expr in [*node.decorator_list, *node.bases]:
                self.walk_expr(expr, node, function, cls, guards, node)
            self.walk_body(node.body, function, node, guards)
            return
        if isinstance(node, ast.If):
            self.walk_expr(node.test, node, function, cls, guards, node)
            self.walk_body(node.body, function, cls, guards + ((node.test, True),))
            self.walk_body(node.orelse, function, cls, guards + ((node.test, False),))
            return
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            index.assigns.append((node, function))
        if isinstance(node, (ast.Import, ast.ImportFrom, ast.Assign)):
            add_import(node, index.aliases)
        if isinstance(node, (ast.For, ast.AsyncFor)):
            for name in ast.walk(node.target):
                if isinstance(name, ast.Name):
                    index.loop_targets.add(name.id)
        for field_name, value in ast.iter_fields(node):
            if isinstance(value, list):
                if value and isinstance(value[0], ast.stmt):
                    self.walk_body(value, function, cls, guards)
                else:
                    for item in value:
                        self._walk_any(item, node, function, cls, guards)
            else:
                self._walk_any(value, node, function, cls, guards)

    def _walk_any(self, value, parent, function, cls, guards) -> None:
        if isinstance(value, ast.expr):
            self.walk_expr(value, parent, function, cls, guards, parent)
        elif isinstance(value, ast.AST):
            # handlers, withitems, match cases, keywords, comprehensions, arguments
            if isinstance(value, ast.ExceptHandler):
                if value.type is not None:
                    self.walk_expr(value.type, value, function, cls, guards, parent)
                self.walk_body(value.body, function, cls, guards)
                return
            if hasattr(value, "body") and isinstance(value.body, list):
                self.walk_body(value.body, function, cls, guards)
            for child in ast.iter_child_nodes(value):
                if isinstance(child, ast.expr):
                    self.walk_expr(child, value, function, cls, guards, parent)

    def walk_expr(self, node: ast.expr, parent: ast.AST, function, cls, guards, statement) -> None:
        index = self.index
        loads, strings, attributes = index.loads, index.strings, index.attributes_read
        raw_calls = self.raw_calls
        load_key = id(function)
        stack = [(node, parent, guards)]
        pop, push = stack.pop, stack.append
        while stack:
            current, up, current_guards = pop()
            kind = type(current)
            # The common node types are taken apart by hand: ast.iter_child_nodes costs more than
            # the rest of the walk.
            if kind is ast.Name:
                if type(current.ctx) is ast.Load:
                    loads.setdefault((load_key, current.id), []).append(current.lineno)
            elif kind is ast.Constant:
                if type(current.value) is str and len(current.value) < 80:
                    strings.add(current.value)
            elif kind is ast.Attribute:
                if type(current.ctx) is ast.Load:
                    attributes.add(current.attr)
                push((current.value, current, current_guards))
            elif kind is ast.Call:
                raw_calls.append((current, function, cls, current_guards, up, statement))
                push((current.func, current, current_guards))
                for arg in current.args:
                    push((arg, current, current_guards))
                for keyword in current.keywords:
                    push((keyword.value, current, current_guards))
            elif kind is ast.BinOp:
                push((current.left, current, current_guards))
                push((current.right, current, current_guards))
            elif kind is ast.Subscript:
                push((current.value, current, current_guards))
                push((current.slice, current, current_guards))
            elif kind is ast.Tuple or kind is ast.List or kind is ast.Set:
                for element in current.elts:
                    push((element, current, current_guards))
            elif kind is ast.Compare:
                push((current.left, current, current_guards))
                for comparator in current.comparators:
                    push((comparator, current, current_guards))
            elif kind is ast.Lambda:
                push((current.body, current, ()))
            elif kind is ast.IfExp:
                push((current.test, current, current_guards))
                push((current.body, current, current_guards + ((current.test, True),)))
                push((current.orelse, current, current_guards + ((current.test, False),)))
            else:
                for child in ast.iter_child_nodes(current):
                    if isinstance(child, ast.expr):
                        push((child, current, current_guards))
                    elif isinstance(child, ast.AST):
                        for grandchild in ast.iter_child_nodes(child):
                            if isinstance(grandchild, ast.expr):
                                push((grandchild, current, current_guards))
