"""Finding kinds of distdoctor itself: a check that broke, overran or could not be loaded.

Declared as plain values (the registry imports this module and registers them), so that the
registry, which reports load failures with PLUGIN_LOAD_FAILED, has no import circle with it.
"""

from __future__ import annotations

from distdoctor.core.findings import FindingKind

CHECK_CRASHED = FindingKind(
    id="core.W001",
    cause="unknown",
    title="A check raised an exception; what it verifies is unknown",
    hint="Report the traceback in the detail to the check's author; silence with --silence core.W001",
)
PLUGIN_LOAD_FAILED = FindingKind(
    id="core.E002",
    cause="unknown",
    title="Checks could not be loaded",
    hint="Fix the import error shown in the detail, or remove the plugin from --checks-dir",
)
CHECK_TIMED_OUT = FindingKind(
    id="core.W003",
    cause="unknown",
    title="A check did not finish within its deadline",
    hint="Look at what the check probes (DNS, a socket, a GPU) for a stall, or raise --check-timeout",
)
RUN_DEADLINE = FindingKind(
    id="core.E004",
    cause="collective_timeout_hang",
    title="The diagnosis was cut off by its deadline",
    hint="The stage and ranks named did not finish; raise --timeout only if they are merely slow",
)

DEADLINE_TOO_SHORT = FindingKind(
    id="core.E005",
    cause="unknown",
    title="The run's deadline left too little time for a stage",
    hint="Raise --timeout (the default is 60 s); nothing is known about the stages that did not run",
)

RUN_INTERRUPTED = FindingKind(
    id="core.E006",
    cause="unknown",
    title="The diagnosis was interrupted (SIGINT or SIGTERM)",
    hint="The report is partial: run distdoctor check again to the end for the rest",
)

# An interface of torch that this release lacks, met where distdoctor uses it (a fallback failed
# or none exists): said as what could not be examined, never as a fault of the user's set-up.
TORCH_LACKS = FindingKind(
    id="core.E007",
    cause="unknown",
    title="This torch lacks an interface distdoctor uses; what depends on it was not examined",
    hint="Nothing about your job is implied; docs/compatibility.md lists the torch releases distdoctor is tested with",
)

CORE_KINDS = (CHECK_CRASHED, PLUGIN_LOAD_FAILED, CHECK_TIMED_OUT, RUN_DEADLINE, DEADLINE_TOO_SHORT, RUN_INTERRUPTED,
              TORCH_LACKS)
