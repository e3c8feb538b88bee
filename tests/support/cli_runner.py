"""Running the `bonsai` CLI in-process from tests."""

from __future__ import annotations


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    """Run `bonsai ARGV` in-process through the console-script entry point (its error handler
    included): (exit code, stdout, stderr) exactly as a user sees them."""
    import sys

    from bonsai_launch.cli.main import run

    old, sys.argv = sys.argv, ["bonsai", *argv]
    try:
        run()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        sys.argv = old
    out = capsys.readouterr()
    return code, out.out, out.err
