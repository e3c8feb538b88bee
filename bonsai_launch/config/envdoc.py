"""Render environment_variables.md from the settings registry.

    python -m bonsai_launch.config.envdoc > environment_variables.md

tests/test_envdoc.py fails when the document and the registry disagree.
"""

from __future__ import annotations

from bonsai_launch.config.settings import SETTINGS

HEADER = """# Environment variables

Every `BONSAI_*` variable that bonsai reads. Precedence, highest first: command-line flag >
environment variable > profile > detected default. A value that cannot be parsed is never
ignored: bonsai stops with exit code 2 and one line naming the variable, the value and what is
allowed. Booleans accept `1/0`, `true/false`, `yes/no`, `on/off` in any case.

This file is generated from `bonsai_launch/config/settings.py` by
`python -m bonsai_launch.config.envdoc > environment_variables.md`; a test keeps them equal.

| variable | type | default | allowed | read by | meaning |
|---|---|---|---|---|---|
"""


def render() -> str:
    rows = []
    for s in SETTINGS:
        default = s.default_text or ("" if s.default is None else str(s.default))
        if s.kind == "bool" and not s.default_text:
            default = "1" if s.default else "0"
        allowed = s.allowed().replace("|", "\\|")
        rows.append(
            f"| `{s.env}` | {s.kind} | {default or '-'} | {allowed} | {', '.join(s.commands)} | {s.description} |"
        )
    return HEADER + "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(render(), end="")
