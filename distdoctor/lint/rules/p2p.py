"""Point-to-point requests (isend/irecv, async collectives) that nobody waits for."""

from __future__ import annotations

import ast

from distdoctor.lint.index import ModuleIndex
from distdoctor.lint.rules.base import COLLECTIVES, Hit, dist_calls, is_expression_statement, rule
from distdoctor.core.registry import finding_kind

_P2P = ("isend", "irecv", "batch_isend_irecv")

REQUEST_DISCARDED = finding_kind(
    "lint.E002", cause="collective_timeout_hang",
    title="The request of an asynchronous send/receive is thrown away",
    hint="Keep the request and call .wait() on it before the tensor is read or reused.",
)
REQUEST_NEVER_WAITED = finding_kind(
    "lint.W003", cause="collective_timeout_hang",
    title="The request of an asynchronous send/receive is never used",
    hint="Call .wait() on the request (or on each request of the list) before the tensor is read or reused.",
)


def _async_calls(index: ModuleIndex):
    """isend/irecv/batch_isend_irecv, and any collective called with async_op=True."""
    for call in dist_calls(index, _P2P):
        yield call
    for call in dist_calls(index, COLLECTIVES):
        flag = call.keyword("async_op")
        if isinstance(flag, ast.Constant) and flag.value is True:
            yield call


@rule(
    REQUEST_DISCARDED,
    wrong="import torch.distributed as dist\n\ndist.isend(tensor, dst=1)  # lint.E002\n",
    right="import torch.distributed as dist\n\nreq = dist.isend(tensor, dst=1)\nreq.wait()\n",
)
def request_discarded(index: ModuleIndex):
    for call in _async_calls(index):
        if is_expression_statement(call):
            yield Hit(call.node, detail=f"`{call.callee}(...)` returns a request that is dropped: nothing waits for "
                                        "the transfer, so the tensor may be read or freed before it completes.")


@rule(
    REQUEST_NEVER_WAITED,
    wrong="import torch.distributed as dist\n\nreq = dist.irecv(tensor, src=0)  # lint.W003\nprint(tensor)\n",
    right="import torch.distributed as dist\n\nreq = dist.irecv(tensor, src=0)\nreq.wait()\nprint(tensor)\n",
)
def request_never_waited(index: ModuleIndex):
    for call in _async_calls(index):
        parent = call.parent
        if not isinstance(parent, (ast.Assign, ast.AnnAssign)) or parent.value is not call.node:
            continue
        targets = parent.targets if isinstance(parent, ast.Assign) else [parent.target]
        names = [t.id for t in targets if isinstance(t, ast.Name)]
        if len(names) != len(targets):
            continue  # stored in an attribute or a container: used elsewhere
        if not any(index.loaded_after(call.function, name, call.node.lineno) for name in names):
            yield Hit(call.node, detail=f"`{names[0]}` holds the request of `{call.callee}(...)` but is never read "
                                        "afterwards, so nothing waits for the transfer.")
