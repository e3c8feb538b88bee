"""The rich console every part of bonsai prints through (progress bars, tables, status lines).

Library code that shows progress (builds, downloads, conversions) takes it from here; the CLI's
output helpers (cli/_output.py) re-export it. rich is imported on the first call, never at start-up.
"""

from __future__ import annotations


def console(stderr: bool = False):
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=True)
