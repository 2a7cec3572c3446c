"""distdoctor.init_process_group and preflight in a 2-rank gloo job, for the compatibility matrix.

python preflight_job.py MODE OUT_DIR: MODE healthy (the same model on every rank) or mismatch
(rank 1's last layer has 5 outputs instead of 4). Each rank writes OUT_DIR/rank<R>.json: whether
preflight raised PreflightError and the causes of the findings it reported.
"""

import json
import os
import sys

import torch
from torch import nn

import distdoctor

mode, out_dir = sys.argv[1], sys.argv[2]
distdoctor.init_process_group("gloo", rendezvous_timeout=60.0)
rank = int(os.environ["RANK"])
torch.manual_seed(0)
outputs = 5 if mode == "mismatch" and rank == 1 else 4
model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, outputs))
try:
    report = distdoctor.preflight(model=model, wrap="never", timeout=60)
    raised = False
except distdoctor.PreflightError as exc:
    report, raised = exc.report, True
result = {"raised": raised, "causes": sorted({f.cause for f in report.findings}),
          "ids": sorted({f.id for f in report.findings})}
with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as fh:
    json.dump(result, fh)
torch.distributed.destroy_process_group()
