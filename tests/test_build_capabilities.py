"""Capability parsing on real llama-server b11434 output, and the probe cache."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from bonsai_launch.core.errors import BonsaiError
from bonsai_launch.llamacpp.binaries import probe
from bonsai_launch.llamacpp.capabilities import (
    backend_from_devices,
    parse_devices,
    parse_help,
    parse_help_full,
    parse_version,
)

DATA = Path(__file__).parent / "data"
HELP = (DATA / "llama-server-b11434-help.txt").read_text()


def test_real_help_spec_types():
    _flags, spec_types = parse_help(HELP)
    assert spec_types == {
        "none",
        "draft-simple",
        "draft-eagle3",
        "draft-mtp",
        "draft-dflash",
        "draft-dspark",
        "ngram-simple",
        "ngram-map-k",
        "ngram-map-k4v",
        "ngram-mod",
        "ngram-cache",
    }


def test_real_help_flags_include_long_names_after_short_aliases():
    flags, _spec, _removed = parse_help_full(HELP)
    # `-c,    --ctx-size N`: both names, though two spaces separate them.
    for flag in (
        "-c",
        "--ctx-size",
        "-m",
        "--model",
        "-ub",
        "--ubatch-size",
        "-ngl",
        "--n-gpu-layers",
        "-md",
        "--spec-draft-model",
        "--spec-draft-n-max",
        "-ngld",
        "--spec-draft-ngl",
        "--spec-type",
        "-np",
        "--parallel",
        "--metrics",
        "--host",
        "--port",
        "--list-devices",
        "--version",
    ):
        assert flag in flags, flag
    # Indented continuation lines never define flags.
    assert "--spec-ngram-" not in flags and "-min-hits" not in flags
    assert "--spec-draft-conf-min" not in flags


def test_real_help_removed_flags_are_not_accepted():
    flags, _spec, removed = parse_help_full(HELP)
    assert {"--draft", "--draft-max", "--draft-min", "--spec-ngram-size-n"} <= removed
    assert not (removed & flags)


def test_real_version_and_devices():
    line, build = parse_version((DATA / "llama-server-b11434-version.txt").read_text())
    assert build == 11434 and line.startswith("version: 0.6.0-dev")
    assert parse_devices((DATA / "llama-server-b11434-list-devices.txt").read_text()) == ()
    assert parse_version("version: 4500 (a1b2c3d)\nbuilt with cc")[1] == 4500


def test_gpu_devices_name_the_backend():
    text = "Available devices:\n  CUDA0: NVIDIA H200 (143771 MiB, 143177 MiB free)\n"
    devices = parse_devices(text)
    assert devices == ("CUDA0: NVIDIA H200 (143771 MiB, 143177 MiB free)",)
    assert backend_from_devices(devices) == "cuda"
    assert backend_from_devices(("Vulkan0: AMD Radeon",)) == "vulkan"


def _fake_server(path: Path, counter: Path) -> Path:
    path.write_text(
        "#!/bin/sh\n"
        f"echo run >> '{counter}'\n"
        'case "$1" in\n'
        f"  --help) cat '{DATA / 'llama-server-b11434-help.txt'}' ;;\n"
        "  --version) echo 'version: 0.6.0-dev (build 11434, commit unknown)' >&2 ;;\n"
        "  --list-devices) printf 'Available devices:\\n  (none)\\n' ;;\n"
        "esac\n"
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.mark.skipif(os.name == "nt", reason="the stand-in server is a #! script")
def test_probe_is_cached_by_path_size_and_mtime(tmp_path):
    counter = tmp_path / "runs"
    server = _fake_server(tmp_path / "llama-server", counter)
    first = probe(server)
    assert "draft-dspark" in first.spec_types and first.build_number == 11434 and first.backend == "cpu"
    runs = len(counter.read_text().splitlines())
    assert runs == 3  # --help, --version, --list-devices
    assert probe(server) == first
    assert len(counter.read_text().splitlines()) == runs  # answered from the cache
    os.utime(server, ns=(server.stat().st_atime_ns, server.stat().st_mtime_ns + 10**9))
    probe(server)
    assert len(counter.read_text().splitlines()) == runs + 3  # a changed binary is probed again


@pytest.mark.skipif(os.name == "nt", reason="the stand-in server is a #! script")
def test_probe_refuses_a_binary_that_is_not_llama_server(tmp_path):
    script = tmp_path / "not-llama"
    script.write_text("#!/bin/sh\necho hello\n")
    script.chmod(0o755)
    with pytest.raises(BonsaiError, match="does not look like llama-server"):
        probe(script)


def test_probe_real_binary(llama_server):
    caps = probe(llama_server)
    assert "draft-dspark" in caps.spec_types
    assert caps.build_number is not None and caps.build_number >= 11434
    assert caps.accepts("--spec-draft-n-max") and not caps.accepts("--draft-max")
