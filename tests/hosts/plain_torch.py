"""What users run today: init the gloo process group with torch's defaults, one all_reduce.

Started as one rank per host with RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT set, exactly as
a training script's first lines would. No timeout is passed on purpose: the scenarios record what
torch's own defaults do (the caller bounds the wait from outside and kills it).
"""

import sys
import time

START = time.monotonic()


def main() -> int:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    tensor = torch.ones(4) * (dist.get_rank() + 1)
    dist.all_reduce(tensor)
    expected = sum(range(1, dist.get_world_size() + 1))
    ok = tensor.tolist() == [float(expected)] * 4
    print(f"all_reduce {'ok' if ok else 'WRONG'} {tensor.tolist()} after {time.monotonic() - START:.2f}s", flush=True)
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
