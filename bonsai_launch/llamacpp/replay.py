"""Replaying a token stream through llama-server's own draft-free drafters (ngram_replay.cpp).

At temperature 0 a verify step accepts the longest prefix of a draft that equals what the target
generates next, so what an n-gram type drafts and gets accepted on a stream is a pure function
of the stream: no model is needed to know it. ngram_replay.cpp (shipped beside this module)
runs the server's drafting loop on the pin's own common/speculative.cpp; it is compiled against
a bonsai build's static libraries as the build's kernel check is (builds/kernel_check.py), and
cached in `<build key>/tools/` by the source's and the libraries' fingerprint.

`replay_args` (pure) picks the speculative flags out of a launch's argv; `tool_for` compiles
(or finds) the program for a llama-server binary; `replay` runs it over streams.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

SOURCE = Path(__file__).with_name("ngram_replay.cpp")
LIBS = (  # link order: common before llama before ggml
    "common/libllama-common.a",
    "common/libllama-common-base.a",
    "src/libllama.a",
    "ggml/src/libggml.a",
    "ggml/src/libggml-cpu.a",
    "ggml/src/libggml-base.a",
)
INCLUDES = ("common", "include", "ggml/include", "vendor")
REPLAYABLE_PREFIX = "ngram-"  # every draft-free type; draft-* types need their model


class ReplayUnavailable(Exception):
    """No replay for this binary (not a bonsai build, no compiler, a type that needs a model)."""


@dataclass(frozen=True)
class Stream:
    """One request as the server saw it: the prompt's tokens and the tokens it generated."""

    prompt: tuple[int, ...]
    generated: tuple[int, ...]
    n_predict: int = -1  # the request's length limit (-1: none): the server drafts at most n_remaining - 1
    n_ctx: int = 0  # the slot's context (0: no limit)


@dataclass(frozen=True)
class Replayed:
    """What one candidate did on one stream: plain steps decode one token each; each speculative
    step verifies a draft of d tokens and keeps a of them (`steps`: (d, a) in order)."""

    plain_steps: int
    spec_steps: int
    drafted: int
    accepted: int
    steps: tuple[tuple[int, int], ...] = ()

    @property
    def tokens(self) -> int:
        """Tokens produced after the first (which the prompt's evaluation gives)."""
        return self.plain_steps + self.spec_steps + self.accepted


def replay_args(argv: Sequence[str]) -> list[str] | None:
    """The speculative flags of a launch's argv that the replay takes (--spec-type and the
    n-gram length flags), or None when the launch drafts with a model or not at all."""
    out: list[str] = []
    spec_type = None
    items = list(argv)
    for i, arg in enumerate(items[:-1]):
        if arg == "--spec-type":
            spec_type = items[i + 1]
            out += [arg, spec_type]
        elif arg.startswith("--spec-ngram-"):
            out += [arg, items[i + 1]]
    if spec_type is None or not all(t.startswith(REPLAYABLE_PREFIX) for t in spec_type.split(",")):
        return None
    return out


def build_dir(binary: Path) -> Path:
    """The bonsai build a llama-server belongs to (`<key>/bin/llama-server`)."""
    key = Path(binary).resolve().parent.parent
    if not (key / "manifest.json").is_file() or not (key / "work").is_dir():
        raise ReplayUnavailable(f"{binary} is not a bonsai build (no manifest and work folder beside bin/)")
    return key


def _fingerprint(libs: Iterable[Path]) -> str:
    h = hashlib.sha256(SOURCE.read_bytes())
    for lib in libs:
        st = lib.stat()
        h.update(f"{lib}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def tool_for(binary: Path) -> Path:
    """The replay program for this llama-server's build, compiled once (about a second)."""
    key = build_dir(binary)
    libs = [key / "work" / lib for lib in LIBS]
    missing = [str(lib) for lib in libs if not lib.is_file()]
    if missing:
        raise ReplayUnavailable(f"the build has no {', '.join(missing)}")
    src = key / "src"
    includes = [src / d for d in INCLUDES]
    out_dir = key / "tools"
    exe = out_dir / f"ngram-replay-{_fingerprint(libs)}"
    if exe.is_file():
        return exe
    cxx = next((c for c in ("c++", "g++", "clang++") if shutil.which(c)), None)
    if cxx is None:
        raise ReplayUnavailable("no C++ compiler on PATH (c++, g++, clang++)")
    out_dir.mkdir(parents=True, exist_ok=True)
    # names of our own: two processes compiling at once must not share an object file
    tmp = out_dir / f".{exe.name}.{os.getpid()}.tmp"
    cmake_cache = key / "work" / "CMakeCache.txt"
    openmp = cmake_cache.is_file() and re.search(r"^GGML_OPENMP:BOOL=ON", cmake_cache.read_text(), re.M)
    cmd = [cxx, "-O2", "-std=c++17", str(SOURCE), *(f"-I{d}" for d in includes), *map(str, libs), "-o", str(tmp)]
    cmd += (
        ["-lpthread", "-lm"] + (["-fopenmp"] if openmp else []) + (["-ldl"] if sys.platform.startswith("linux") else [])
    )
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise ReplayUnavailable(f"compiling the replay tool failed:\n{proc.stderr[-3000:]}")
        tmp.replace(exe)
    finally:
        tmp.unlink(missing_ok=True)
    return exe


def _input(streams: Iterable[Stream]) -> str:
    lines = []
    for s in streams:
        head = f"{len(s.prompt)} {len(s.generated)} {s.n_predict} {s.n_ctx}"
        lines.append(" ".join([head, *map(str, s.prompt), *map(str, s.generated)]))
    return "\n".join(lines) + "\n"


def parse_line(line: str) -> Replayed:
    counts, _, steps = line.partition(":")
    plain, spec, drafted, accepted = (int(x) for x in counts.split())
    pairs = tuple((int(d), int(a)) for d, a in (step.split(",") for step in steps.split()))
    return Replayed(plain, spec, drafted, accepted, pairs)


def replay(tool: Path, args: Sequence[str], streams: Sequence[Stream], timeout: float = 120.0) -> list[Replayed]:
    """Every stream, in order, through one drafter state (a server with one slot serving them
    one after the other), with `args` (replay_args of the launch)."""
    if not streams:
        return []
    proc = subprocess.run([str(tool), *args], input=_input(streams), capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise ReplayUnavailable(f"the replay of {' '.join(args)} failed: {proc.stderr.strip()[-500:]}")
    lines = proc.stdout.splitlines()
    if len(lines) != len(streams):
        raise ReplayUnavailable(f"the replay answered {len(lines)} of {len(streams)} streams")
    return [parse_line(line) for line in lines]
