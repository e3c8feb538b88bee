"""environment_variables.md, the settings registry and the code agree."""

import re
from pathlib import Path

from bonsai_launch.config.envdoc import render
from bonsai_launch.config.settings import BY_ENV

ROOT = Path(__file__).resolve().parents[1]


def test_document_is_generated_from_the_registry():
    assert (ROOT / "environment_variables.md").read_text() == render(), (
        "run: python -m bonsai_launch.config.envdoc > environment_variables.md"
    )


def test_every_variable_the_code_reads_is_in_the_registry():
    used = set()
    for path in (ROOT / "bonsai_launch").rglob("*.py"):
        used |= set(re.findall(r"BONSAI_[A-Z0-9_]+", path.read_text()))
    for script in (ROOT / "scripts").glob("*"):
        used |= set(re.findall(r"BONSAI_[A-Z0-9_]+", script.read_text()))
    missing = sorted(v for v in used if v not in BY_ENV)
    assert not missing, f"read in code but not in bonsai_launch/config/settings.py: {missing}"


def test_no_stale_documented_variable():
    documented = set(re.findall(r"`(BONSAI_[A-Z0-9_]+)`", (ROOT / "environment_variables.md").read_text()))
    assert documented == set(BY_ENV)
