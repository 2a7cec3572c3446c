"""Which GPU each rank uses: the global rank used as a device index, hard-coded device ids."""

from __future__ import annotations

import ast

from distdoctor.lint.index import CallSite, ModuleIndex
from distdoctor.lint.ranks import global_rank_names, holds_global_rank
from distdoctor.lint.rules.base import INIT_CALLS, Hit, is_multi_rank_script, rule
from distdoctor.core.registry import finding_kind

GLOBAL_RANK_DEVICE = finding_kind(
    "lint.W011", cause="invalid_device_ordinal",
    title="A device is chosen from the global rank",
    hint="Use the local rank (int(os.environ['LOCAL_RANK'])) as the device index; the global rank exceeds the GPU count from the second node on.",
)
HARD_CODED_DEVICE = finding_kind(
    "lint.W012", cause="duplicate_gpu",
    title="A hard-coded GPU index in a multi-rank script",
    hint="Derive the device from the local rank (int(os.environ['LOCAL_RANK'])), so each rank of a node uses its own GPU.",
)

_SET_DEVICE = ("set_device", "set_device_index")
# A global rank comes from get_rank()/get_global_rank(), a RANK-like variable, or a global_rank name.
_GLOBAL_RANK_WORDS = ("get_rank", "get_global_rank", "global_rank", "RANK", "SLURM_PROCID")
_MOVES = ("to", "cuda")


_DEVICE_KEYWORDS = ("device_ids", "output_device", "map_location", "device")
_DEVICE_CALLEES = frozenset({*_SET_DEVICE, *_MOVES, "device"})


def _device_arguments(call: CallSite):
    """(argument, how) for every place a call takes a device index."""
    if not call.node.keywords and call.callee not in _DEVICE_CALLEES:
        return  # most calls: nothing to look at
    if call.callee in _SET_DEVICE and call.node.args:
        yield call.node.args[0], f"{call.callee}()"
    if call.name in _MOVES and isinstance(call.node.func, ast.Attribute) and call.node.args:
        yield call.node.args[0], f".{call.name}()"
    if call.qualname == "torch.device" and call.node.args:
        yield call.node.args[-1], "torch.device()"
    for keyword in _DEVICE_KEYWORDS:
        value = call.keyword(keyword)
        if value is None:
            continue
        if isinstance(value, (ast.List, ast.Tuple)) and len(value.elts) == 1:
            value = value.elts[0]
        yield value, f"{keyword}="


def _formatted_device(node: ast.AST):
    """The expression inside f"cuda:{x}" / "cuda:%d" % x / "cuda:{}".format(x)."""
    if isinstance(node, ast.JoinedStr) and len(node.values) == 2:
        head, value = node.values
        if isinstance(head, ast.Constant) and str(head.value).endswith(("cuda:", "xpu:", "npu:")) \
                and isinstance(value, ast.FormattedValue):
            return value.value
    return None


@rule(
    GLOBAL_RANK_DEVICE,
    wrong="import torch\nimport torch.distributed as dist\n\nrank = dist.get_rank()\ntorch.cuda.set_device(rank)  # lint.W011\n",
    right="import os\nimport torch\n\nlocal_rank = int(os.environ['LOCAL_RANK'])\ntorch.cuda.set_device(local_rank)\n",
)
def device_from_global_rank(index: ModuleIndex):
    if not any(word in index.text for word in _GLOBAL_RANK_WORDS):
        return  # nothing in the module can hold the global rank
    held = global_rank_names(index)
    for call in index.calls:
        for arg, how in _device_arguments(call):
            inner = _formatted_device(arg)
            target = inner if inner is not None else arg
            if holds_global_rank(target, call.function, held):
                yield Hit(call.node, detail=f"{how} gets `{ast.unparse(target)}`, the global rank: on a second node it "
                                            "names a GPU that does not exist there.")
                break


@rule(
    HARD_CODED_DEVICE,
    wrong="import torch\nimport torch.distributed as dist\n\ndist.init_process_group('nccl')\ntorch.cuda.set_device(0)  # lint.W012\n",
    right=("import os\nimport torch\nimport torch.distributed as dist\n\ndist.init_process_group('nccl')\n"
           "torch.cuda.set_device(int(os.environ['LOCAL_RANK']))\n"),
)
def hard_coded_device(index: ModuleIndex):
    if not is_multi_rank_script(index) or _one_process_world(index):
        return
    for call in index.calls:
        if call.guards:
            continue  # device choices under a condition are usually the single-process path
        for arg, how in _device_arguments(call):
            literal = _literal_gpu(arg)
            if literal is not None:
                yield Hit(call.node, detail=f"{how} gets GPU {literal} on every rank: all ranks of a node "
                                            "would share that GPU.")
                break


def _literal_gpu(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool):
            return None
        if isinstance(node.value, int):
            return str(node.value)
        if isinstance(node.value, str) and node.value.startswith("cuda:") and node.value[5:].isdigit():
            return node.value
    return None


def _one_process_world(index: ModuleIndex) -> bool:
    """init_process_group("fake", ...) or with a literal rank: one process, so GPU 0 is its own."""
    for call in index.calls_to(*INIT_CALLS):
        backend = call.arg(0, "backend")
        rank = call.keyword("rank")
        if (isinstance(backend, ast.Constant) and backend.value == "fake") or isinstance(rank, ast.Constant):
            return True
    return False
