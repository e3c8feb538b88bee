"""One place that decides between human output (rich) and machine output (--json)."""

from __future__ import annotations

import json
import sys
from typing import Any

from bonsai_launch.core.console import console

__all__ = ["console", "emit_json", "error_line", "warn"]


def emit_json(data: Any) -> None:
    """Machine output: one JSON document on stdout, nothing else."""
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    sys.stdout.flush()


def error_line(message: str) -> None:
    sys.stderr.write(f"error: {message}\n")
    sys.stderr.flush()


def warn(message: str) -> None:
    sys.stderr.write(f"warning: {message}\n")
    sys.stderr.flush()
