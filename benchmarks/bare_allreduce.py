"""The baseline job: what a bare torchrun script does before any training — init gloo, one
all_reduce, verify, tear down. benchmarks compare distdoctor's self-test and preflight to it."""

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    tensor = torch.ones(4) * (dist.get_rank() + 1)
    dist.all_reduce(tensor)
    expected = float(sum(range(1, dist.get_world_size() + 1)))
    if tensor.tolist() != [expected] * 4:
        raise SystemExit(f"all_reduce gave {tensor.tolist()}, expected {expected}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
