"""Run the bonsai CLI with another system's process control, for tests on Linux.

    python tests/support/platform_runner.py darwin start --model T.gguf ...

Only the process control is substituted (not sys.platform), so the macOS watchdog path
runs for real on Linux: the server gets no PR_SET_PDEATHSIG, and only the watchdog can
stop it when this process is killed.
"""

from __future__ import annotations

import sys

from bonsai_launch.core import process_control


def main() -> None:
    platform = sys.argv.pop(1)
    control = process_control.for_platform(platform)
    process_control.current = lambda: control  # type: ignore[assignment]
    from bonsai_launch.cli.main import run

    sys.argv[0] = "bonsai"
    run()


if __name__ == "__main__":
    main()
