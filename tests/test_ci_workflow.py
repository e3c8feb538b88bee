"""The GitHub workflow stays in step with the project: the Pythons it promises, the markers
the fast lane filters on, and `.ci/run` as the full lane. (It cannot run here; this keeps it
from drifting until it does.)"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
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


def test_backports_come_from_the_machines_own_debian_archive():
    """.ci/run writes no Debian host of its own: the backports line takes the archive of the
    machine's sources (a mirror or an offline proxy), and CI stops when there is none."""
    run = (ROOT / ".ci" / "run").read_text()
    written = [ln.strip() for ln in run.splitlines() if "bookworm-backports main" in ln]
    assert written == [
        'echo "deb $archive bookworm-backports main" > /etc/apt/sources.list.d/bonsai-ci-bookworm-backports.list'
    ]
    assert "archive=$(bash .ci/debian-archive bookworm)" in run
    assert not re.search(r"https?://", "\n".join(ln for ln in run.splitlines() if not ln.lstrip().startswith("#")))


def _archive(apt: Path, release: str = "bookworm") -> subprocess.CompletedProcess:
    script = ROOT / ".ci" / "debian-archive"
    return subprocess.run(["bash", str(script), release, str(apt)], capture_output=True, text=True, timeout=30)


@pytest.mark.skipif(sys.platform == "win32", reason="a bash script for CI's Debian container")
def test_debian_archive_reads_one_line_and_deb822_sources(tmp_path):
    (tmp_path / "sources.list.d").mkdir()
    # deb822, as Debian 12's images write it: -updates and -security are not the release itself
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\n# a comment inside the paragraph\nURIs: http://snapshot.example/debian\n"
        "Suites: bookworm-updates\nComponents: main\n\n"
        "types: deb-src deb\nEnabled: no\nURIs: http://disabled.example/debian\nSuites: bookworm\n\n"
        "Types: deb\nURIs:\thttp://mirror.example/debian  http://second.example/debian\n"
        "Suites: bookworm bookworm-updates\nComponents: main\n"
    )
    assert _archive(tmp_path).stdout == "http://mirror.example/debian\n"
    # a one-line source (options in brackets, a trailing comment) comes first, as apt reads it
    (tmp_path / "sources.list").write_text(
        "# deb http://commented.example/debian bookworm main\n"
        "deb-src http://src.example/debian bookworm main\n"
        "deb [arch=amd64 signed-by=/usr/share/keyrings/k.gpg] http://proxy.local:3142/debian bookworm main # apt-cacher\n"
    )
    assert _archive(tmp_path).stdout == "http://proxy.local:3142/debian\n"


@pytest.mark.skipif(sys.platform == "win32", reason="a bash script for CI's Debian container")
def test_debian_archive_fails_without_a_source_for_the_release(tmp_path):
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "security.sources").write_text(
        "Types: deb\nURIs: http://security.example/debian-security\nSuites: bookworm-security\n"
    )
    (tmp_path / "sources.list").write_text("deb http://mirror.example/debian trixie main\n")
    result = _archive(tmp_path)
    assert result.returncode != 0 and result.stdout == ""
