"""What `bonsai` imports before it does anything: the launcher's own start-up is part of every
command's time (issue 40; docs/benchmarks.md, launcher overhead). These check the mechanisms,
not a time: a busy machine cannot flip them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from bonsai_launch.cli import main

# Loaded after the command ran, printed by the child; the command's own output goes to a pipe.
_PROBE = """
import json, sys
from bonsai_launch.cli.main import run
sys.argv = ["bonsai", *json.loads(sys.argv[1])]
try:
    run()
except SystemExit:
    pass
sys.__stderr__.write("\\nMODULES " + json.dumps(sorted(sys.modules)) + "\\n")
"""


def _modules_after(*argv: str) -> set[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BONSAI_")}
    env["BONSAI_HOME"] = os.environ["BONSAI_HOME"]
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(list(argv))], capture_output=True, text=True, env=env, timeout=60
    )
    line = next(x for x in done.stderr.splitlines() if x.startswith("MODULES "))
    return set(json.loads(line.removeprefix("MODULES ")))


def test_help_lists_every_command_without_importing_one():
    loaded = _modules_after("--help")
    commands = {f"bonsai_launch.cli.{entry.module}" for entry in main.COMMANDS}
    assert not loaded & commands, sorted(loaded & commands)
    assert "typer.rich_utils" not in loaded  # plain Click help (cli/main.py _MARKUP)


@pytest.mark.parametrize("entry", main.COMMANDS, ids=lambda e: e.name)
def test_every_listed_command_loads_with_its_help(entry, capsys):
    from cli_runner import run_cli

    code, out, _ = run_cli(capsys, entry.name, "--help")
    assert code == 0 and f"Usage: bonsai {entry.name}" in out


def test_the_listing_names_every_command_on_one_line_each(capsys):
    from cli_runner import run_cli

    code, out, _ = run_cli(capsys, "--help")
    assert code == 0
    listed = out.split("Commands:")[1].splitlines()
    for entry in main.COMMANDS:
        row = next(line for line in listed if line.split()[:1] == [entry.name])
        assert entry.summary in row  # fits 80 columns beside the longest name


def test_a_dry_run_start_reads_the_header_without_numpy_or_a_gpu_library(tmp_path):
    import tiny_gguf

    model = tiny_gguf.write_target(tmp_path / "m.gguf")
    loaded = _modules_after("start", "--model", str(model), "--dry-run")
    assert "bonsai_launch.models.gguf" in loaded  # the header was read
    assert "numpy" not in loaded  # models/codec_types.py: the type table without the codecs
    if not (os.path.exists("/dev/nvidiactl") or os.path.exists("/proc/driver/nvidia")):
        assert "pynvml" not in loaded  # no NVIDIA driver: nothing to ask it


def test_a_second_start_reads_the_profiles_without_yaml_and_the_machine_without_psutil(tmp_path):
    """The profiles' YAML is kept as JSON under BONSAI_HOME/cache, stamped per file; cores and
    RAM come from sysfs and sysconf on Linux (each import is ~20-30 ms of every start)."""
    import tiny_gguf

    model = tiny_gguf.write_target(tmp_path / "m.gguf")
    _modules_after("start", "--model", str(model), "--dry-run")  # writes the cache if it is missing
    loaded = _modules_after("start", "--model", str(model), "--dry-run")
    assert "bonsai_launch.config.profiles" in loaded  # the profiles were read
    assert "yaml" not in loaded
    if sys.platform == "linux":
        assert "psutil" not in loaded
