"""A user's script: distdoctor.init_process_group, then one all_reduce. Prints one JSON line."""

import json
import sys
import time

import distdoctor

start = time.monotonic()
try:
    local_checks = "no-local-checks" not in sys.argv[2:]
    if "tcp" in sys.argv[2:]:
        # torch's other spelling: tcp:// with rank and world size as arguments
        import os

        distdoctor.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}",
                                      rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]),
                                      rendezvous_timeout=float(sys.argv[1]), local_checks=local_checks)
    else:
        distdoctor.init_process_group("gloo", rendezvous_timeout=float(sys.argv[1]), local_checks=local_checks)
except distdoctor.PreflightError as exc:
    print(json.dumps({"raised": True, "elapsed": time.monotonic() - start, "message": str(exc),
                      "findings": [f.to_dict() for f in exc.report.findings]}))
    sys.exit(0)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

t = torch.ones(1)
dist.all_reduce(t)
print(json.dumps({"raised": False, "elapsed": time.monotonic() - start, "sum": t.item(),
                  "backend": dist.get_backend(), "world_size": dist.get_world_size(), "rank": dist.get_rank()}))
dist.destroy_process_group()
