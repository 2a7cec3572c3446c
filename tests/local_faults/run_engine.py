"""Run the local stage through distdoctor's engine with the real probes, except the GPUs.

The machine has no GPU, so a test that needs "N GPUs" replaces only Probes.gpus (with
DISTDOCTOR_TEST_FAKE_GPUS=N); every other probe is the real one. The script's own argv is handed
to the engine, so a launcher that appends arguments (torch.distributed.launch's --local-rank=N)
is seen exactly as it would be by a training script. Prints the JSON report.
"""

from __future__ import annotations

import os
import sys


def main() -> int:
    from distdoctor.core.config import load_config
    from distdoctor.machine.host import diagnose_here as diagnose
    from distdoctor.fakes import fake_gpus
    from distdoctor.machine.probes import Probes
    from distdoctor.core.render import render_json

    count = os.environ.get("DISTDOCTOR_TEST_FAKE_GPUS")

    class MachineWithFakeGpus(Probes):
        def gpus(self):  # type: ignore[override]
            return fake_gpus(int(count)) if count is not None else super().gpus()

    config = load_config({"stages": ["local"], "format": "json"})
    report = diagnose(config, argv=list(sys.argv), probes=MachineWithFakeGpus())
    sys.stdout.write(render_json(report) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
