"""Named lanes (tests/conftest.py NAMED_LANES): tests of such a lane are deselected by any
command whose -m expression does not name the lane, and selected by one that does; checked on
the real `hosts` module by collecting it in a child pytest (collection only: nothing runs)."""

from __future__ import annotations

import re
import subprocess
import sys

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


def test_a_named_lane_runs_only_when_named():
    default, dropped = collect()
    assert default == [] and dropped >= 7  # the README's command: none of the lane's tests
    fast, _ = collect("-m", "not server and not slow")
    assert fast == []  # another -m expression does not bring the lane back
    named, dropped = collect("-m", "vulkan or hosts")  # as .ci/run names it, or in an expression
    assert len(named) >= 7 and dropped == 0
    assert any("test_no_request_lost_under_a_fault[sigkill]" in i for i in named)
