"""python -m distdoctor: the CLI, with SIGINT/SIGTERM watched from the first moment."""

import sys

from distdoctor.core.interrupt import install_watcher, signal_name


def _starting(signum: int) -> None:
    sys.stderr.write(f"distdoctor: interrupted by {signal_name(signum)} while starting; no report was written\n")


if __name__ == "__main__":
    install_watcher(default=_starting)

from distdoctor.cli import run  # noqa: E402

if __name__ == "__main__":
    run()
