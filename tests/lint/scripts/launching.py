"""argparse --local_rank without LOCAL_RANK; the deprecated launcher; no timeout."""
import argparse
import subprocess
import sys

import torch
import torch.distributed as dist


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=0)  # expect: lint.W015
    args = parser.parse_args()
    torch.cuda.set_device(args.local_rank)
    dist.init_process_group("nccl")  # expect: lint.I014


def relaunch(script):
    subprocess.run([sys.executable, "-m", "torch.distributed.launch", "--nproc_per_node=2", script])  # expect: lint.W018
