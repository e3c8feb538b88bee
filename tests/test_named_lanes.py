"""Named lanes (tests/conftest.py NAMED_LANES): tests of such a lane are deselected by any
command whose -m expression does not name the lane, and selected by one that does; checked on
the real `hosts` module by collecting it in a child pytest (collection only: nothing runs)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from start_helpers import ROOT

MODULE = "tests/test_fleet_hosts.py"


def collect(*args: str) -> tuple[list[str], int]:
    """(node ids selected, count deselected) of `pytest --collect-only MODULE ARGS`."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", MODULE, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode in (0, 5), done.stdout[-2000:] + done.stderr[-2000:]  # 5: nothing selected
    ids = [line for line in done.stdout.splitlines() if line.startswith(MODULE + "::")]
    deselected = re.search(r"(\d+) deselected", done.stdout)
    return ids, int(deselected.group(1)) if deselected else 0


@pytest.mark.slow
def test_a_named_lane_runs_only_when_named():
    default, dropped = collect()
    assert default == [] and dropped >= 7  # the README's command: none of the lane's tests
    fast, _ = collect("-m", "not server and not slow")
    assert fast == []  # another -m expression does not bring the lane back
    named, dropped = collect("-m", "vulkan or hosts")  # as .ci/run names it, or in an expression
    assert len(named) >= 7 and dropped == 0
    slow, _ = collect("-m", "slow")  # the module's tests are slow too, but not of the slow lane alone
    assert slow == []
    assert any("test_no_request_lost_under_a_fault[sigkill]" in i for i in named)


@pytest.mark.slow
def test_the_readme_command_still_runs_the_demo_model_in_the_real_server():
    """The README's command leaves the `slow` lane out, but not the demo model: the one test
    marked `readme` loads it into the real llama-server (and so fails without either)."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/test_start_server.py",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    ids = [line for line in done.stdout.splitlines() if "::" in line]
    assert "tests/test_start_server.py::test_demo_profile_ngram_speculation_is_live" in ids
    assert not any("test_detach_ps_logs_stop" in i for i in ids)  # a slow one: in its lane
