"""How the script expects to be launched: timeouts, torch.distributed.launch, --local_rank."""

from __future__ import annotations

import ast

from distdoctor.lint.index import ModuleIndex
from distdoctor.lint.rules.base import Hit, rule
from distdoctor.core.registry import finding_kind

NO_TIMEOUT = finding_kind(
    "lint.I014", cause="timeout_config",
    title="init_process_group without timeout=",
    hint="Pass timeout=datetime.timedelta(minutes=...) sized to your slowest collective; while debugging a hang, a short one fails fast.",
)
LOCAL_RANK_ARGUMENT = finding_kind(
    "lint.W015", cause="launcher_misuse",
    title="--local_rank comes from argparse, but LOCAL_RANK is never read",
    hint="Read int(os.environ['LOCAL_RANK']); torchrun sets it and does not pass --local_rank unless run with --use-env=0 (deprecated launch).",
)
DEPRECATED_LAUNCH = finding_kind(
    "lint.W018", cause="launcher_misuse",
    title="The script uses the deprecated torch.distributed.launch",
    hint="Start workers with torchrun (python -m torch.distributed.run) and read LOCAL_RANK from the environment.",
)


@rule(
    NO_TIMEOUT,
    wrong="import torch.distributed as dist\n\ndist.init_process_group('nccl')  # lint.I014\n",
    right="import datetime\nimport torch.distributed as dist\n\ndist.init_process_group('nccl', timeout=datetime.timedelta(minutes=10))\n",
)
def init_without_timeout(index: ModuleIndex):
    for call in index.calls_to("torch.distributed.init_process_group"):
        if call.keyword("timeout") is None and not call.has_star_kwargs() and len(call.node.args) < 3:
            yield Hit(call.node, detail="Without a timeout a collective that never completes blocks for torch's default "
                                        "(10 minutes for NCCL, 30 for Gloo) before anything is reported.")


@rule(
    LOCAL_RANK_ARGUMENT,
    wrong=("import argparse\nimport torch\n\nparser = argparse.ArgumentParser()\n"
           "parser.add_argument('--local_rank', type=int, default=0)  # lint.W015\nargs = parser.parse_args()\n"
           "torch.cuda.set_device(args.local_rank)\n"),
    right="import os\n\nlocal_rank = int(os.environ['LOCAL_RANK'])\n",
)
def local_rank_argument(index: ModuleIndex):
    if "local_rank" not in index.text and "local-rank" not in index.text:
        return
    if "LOCAL_RANK" in index.strings or any(n.split(".", 1)[0] == "deepspeed" for n in index.aliases.values()):
        return  # reads the variable too, or the deepspeed launcher, which does pass --local_rank
    if "local_rank" not in index.attributes_read:
        return  # declared only so that the old launcher's extra argument is accepted, never used
    for call in index.calls_named("add_argument"):
        flags = [a.value for a in call.node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        if any(flag in ("--local_rank", "--local-rank") for flag in flags):
            yield Hit(call.node, detail="torchrun passes the local rank in LOCAL_RANK, not as --local_rank: the "
                                        "argument keeps its default on every rank.")


_RUNNERS = ("system", "run", "Popen", "call", "check_call", "check_output", "getoutput", "getstatusoutput")
_MESSAGE = ("This command line starts the deprecated launcher, which passes --local-rank on the command line "
            "and whose defaults differ from torchrun's.")


@rule(
    DEPRECATED_LAUNCH,
    wrong="import subprocess, sys\n\nsubprocess.run([sys.executable, '-m', 'torch.distributed.launch', 'train.py'])  # lint.W018\n",
    right="import subprocess, sys\n\nsubprocess.run([sys.executable, '-m', 'torch.distributed.run', 'train.py'])\n",
)
def deprecated_launch(index: ModuleIndex):
    if "torch.distributed.launch" not in index.text:
        return
    for node in ast.walk(index.tree):
        if isinstance(node, (ast.List, ast.Tuple)):
            # A command line as a list: [..., "-m", "torch.distributed.launch", ...]
            for before, element in zip(node.elts, node.elts[1:]):
                if _is_text(before, "-m") and _is_text(element, "torch.distributed.launch"):
                    yield Hit(element, detail=_MESSAGE)
        elif isinstance(node, ast.ImportFrom) and node.module == "torch.distributed.launch":
            yield Hit(node, detail="The script imports the deprecated launcher.")
        elif isinstance(node, ast.Import) and any(a.name == "torch.distributed.launch" for a in node.names):
            yield Hit(node, detail="The script imports the deprecated launcher.")
    for call in index.calls_named(*_RUNNERS):
        # A command line as one string: os.system("python -m torch.distributed.launch ...")
        command = call.node.args[0] if call.node.args else None
        if isinstance(command, ast.Constant) and isinstance(command.value, str) \
                and "-m torch.distributed.launch" in command.value:
            yield Hit(command, detail=_MESSAGE)


def _is_text(node: ast.AST, text: str) -> bool:
    return isinstance(node, ast.Constant) and node.value == text
