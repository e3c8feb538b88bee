"""The GitHub workflow stays in step with the project: the Pythons it promises, the markers
the fast lane filters on, and `.ci/run` as the full lane. (It cannot run here; this keeps it
from drifting until it does.)"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / ".github" / "workflows" / "ci.yml"


def _load():
    return yaml.safe_load(WORKFLOW.read_text()), tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_fast_lane_covers_every_system_and_supported_python():
    ci, project = _load()
    matrix = ci["jobs"]["fast"]["strategy"]["matrix"]
    assert set(matrix["os"]) == {"ubuntu-latest", "macos-latest", "windows-latest"}
    oldest = re.fullmatch(r">=(\d+\.\d+)", project["project"]["requires-python"]).group(1)
    assert matrix["python"][0] == oldest and matrix["python"] == ["3.11", "3.12", "3.13"]


def test_fast_lane_filters_on_registered_markers():
    ci, project = _load()
    runs = " ".join(step.get("run", "") for step in ci["jobs"]["fast"]["steps"])
    expression = re.search(r'pytest .*-m "([^"]+)"', runs).group(1)
    registered = {m.split(":")[0] for m in project["tool"]["pytest"]["ini_options"]["markers"]}
    used = set(re.findall(r"\b(?!not\b|and\b|or\b)(\w+)", expression))
    assert used == {"server", "slow"} and used <= registered
    assert "[demo,test]" in runs  # the test extra brings the PowerShell grammar


def test_full_lane_runs_the_vulkan_lane_on_its_own_build():
    """.ci/run installs Debian's Vulkan packages (spirv-headers included: ggml-vulkan's CMake
    requires it and nothing pulls it in), fails when it cannot, builds the Vulkan backend, and
    runs the lane by name after the suite (the README's command deselects it)."""
    run = (ROOT / ".ci" / "run").read_text()
    lines = [ln.strip() for ln in run.splitlines()]
    packages = re.search(r'^vulkan_packages="([^"]+)"', run, re.M)
    assert packages and set(packages.group(1).split()) == {
        "libvulkan-dev",
        "glslc",
        "spirv-headers",
        "mesa-vulkan-drivers",
        "vulkan-tools",
    }
    install = next(i for i, ln in enumerate(lines) if "apt-get install" in ln and "$vulkan_packages" in ln)
    assert lines[install + 1].startswith("echo") and lines[install + 2] == "exit 1"  # fails, never skips
    # lavapipe new enough (Mesa 22.3's segfaults under a speculative verify), checked after apt
    assert re.search(r"^lavapipe_min=(\d+)$", run, re.M).group(1) == "25"
    check = next(i for i, ln in enumerate(lines) if i > install and "--compare-versions" in ln)
    assert lines[check + 1].startswith("echo") and lines[check + 2] == "exit 1"
    build = lines.index("vulkan_server=$(bonsai build --backend vulkan)")
    lane = lines.index("python -m pytest -q -m vulkan")
    assert lines.index("python -m pytest -q") < install < build < lane


def test_full_lane_is_the_landing_check():
    ci, _ = _load()
    runs = [step.get("run", "") for step in ci["jobs"]["full"]["steps"]]
    assert "bash .ci/run" in runs
    assert ci["jobs"]["full"]["runs-on"] == "ubuntu-latest"
    assert (ROOT / ".ci" / "run").is_file()


def named_lanes() -> tuple[str, ...]:
    """NAMED_LANES as tests/conftest.py declares it (read, not imported: conftest is pytest's)."""
    tree = ast.parse((ROOT / "tests" / "conftest.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "NAMED_LANES" for t in node.targets):
            return tuple(ast.literal_eval(node.value))
    raise AssertionError("tests/conftest.py declares no NAMED_LANES")


def test_ci_runs_every_named_lane_in_use_after_the_readme_command():
    """A named lane is deselected by the README's command, so .ci/run must name it, or its
    tests never run in CI. Lanes no test module uses yet are not required."""
    steps = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    steps = [line for line in steps if line and not line.startswith("#")]
    readme = steps.index("python -m pytest -q")
    sources = "\n".join(p.read_text() for p in (ROOT / "tests").glob("test_*.py"))
    used = [lane for lane in named_lanes() if re.search(rf"pytest\.mark\.{lane}\b", sources)]
    assert "hosts" in used
    for lane in used:
        runs = [
            i for i, line in enumerate(steps) if "pytest" in line and re.search(rf"-m [\"']?[^\n]*\b{lane}\b", line)
        ]
        assert runs and min(runs) > readme, f".ci/run does not run the named lane {lane!r} after the README's command"
