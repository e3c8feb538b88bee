"""The CPU kernel check of a build: cpu_kernels_check.c (shipped beside this module), compiled
against the build's own static ggml libraries and headers, run, and its verdict read.

The build keeps what the check links against: `<key>/src/ggml/include` (the source tree's
headers, through the `src` link) and `<key>/work/**/libggml{,-cpu,-base}.a` (static, since
bonsai builds with BUILD_SHARED_LIBS=OFF). The compiled program is cached in `<key>/selftest/`
by the harness's and the libraries' fingerprint, so a rerun (`bonsai doctor --self-test`) costs
only the run.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HARNESS = Path(__file__).with_name("cpu_kernels_check.c")
# PTQ1_0: patch 0012 (type 143); Q4_K: 0022; Q5_0: 0023; Q6_K: 0024; Q5_K: 0025
TYPES = ("Q1_0", "Q2_0", "Q4_0", "Q8_0", "F16", "PTQ1_0", "Q4_K", "Q5_0", "Q6_K", "Q5_K")
LIBS = ("libggml.a", "libggml-cpu.a", "libggml-base.a")  # link order
_TYPE_LINE = re.compile(r"^type (\S+) (ok|failed \d+)$")


class KernelCheckUnavailable(Exception):
    """The check cannot be built for this build (no static libraries, no headers, no compiler)."""


@dataclass(frozen=True)
class LinkParts:
    include: Path
    libs: tuple[Path, ...]
    openmp: bool


@dataclass(frozen=True)
class KernelResult:
    passed: bool
    types: dict[str, bool]  # TYPE -> passed
    first_line: str  # which kernels ran (the CPU flags ggml saw, what is wired in)
    failures: tuple[str, ...] = ()
    seconds: float = 0.0
    output: str = field(default="", repr=False)

    def flags(self) -> dict[str, bool]:
        """`avx2=1 avx512=0 ...` from the first line, as booleans."""
        return {k: v == "1" for k, v in re.findall(r"(avx\w*)=(\d)", self.first_line)}


def link_parts(key_dir: Path, include: Path | None = None) -> LinkParts:
    work = key_dir / "work"
    include = include or key_dir / "src" / "ggml" / "include"
    libs: list[Path] = []
    for name in LIBS:
        found = sorted(work.rglob(name)) if work.is_dir() else []
        if not found:
            raise KernelCheckUnavailable(f"{name} is not in {work}")
        libs.append(found[0])
    if not (include / "ggml-cpu.h").is_file():
        raise KernelCheckUnavailable(f"ggml's headers are not in {include}")
    cache = work / "CMakeCache.txt"
    openmp = cache.is_file() and re.search(r"^GGML_OPENMP:BOOL=ON", cache.read_text(), re.M) is not None
    return LinkParts(include, tuple(libs), openmp)


def _compilers() -> tuple[str, str]:
    cxx = next((c for c in ("c++", "g++", "clang++") if shutil.which(c)), None)
    if cxx is None:
        raise KernelCheckUnavailable("no C++ compiler on PATH (c++, g++, clang++)")
    return shutil.which("cc") or cxx, cxx


def _fingerprint(parts: LinkParts) -> str:
    h = hashlib.sha256(HARNESS.read_bytes())
    for lib in parts.libs:
        st = lib.stat()
        h.update(f"{lib}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def compile_check(parts: LinkParts, out_dir: Path) -> Path:
    """The harness as an executable in out_dir (reused when harness and libraries are unchanged)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    exe = out_dir / f"cpu_kernels_check-{_fingerprint(parts)}"
    if exe.is_file():
        return exe
    cc, cxx = _compilers()
    obj = out_dir / f".{exe.name}.o"
    # the harness is C; compile it as C, link with the C++ driver (ggml-cpu has C++ parts)
    proc = subprocess.run(
        [cc, "-O2", "-std=c11", "-c", str(HARNESS), "-I", str(parts.include), "-o", str(obj)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise KernelCheckUnavailable(f"compiling the kernel check failed:\n{proc.stderr[-3000:]}")
    tmp = out_dir / f".{exe.name}.tmp"
    link = [cxx, str(obj), *map(str, parts.libs), "-o", str(tmp), "-lpthread", "-lm"]
    if parts.openmp:
        link.insert(1, "-fopenmp")
    if sys.platform.startswith("linux"):
        link.append("-ldl")
    proc = subprocess.run(link, capture_output=True, text=True)
    obj.unlink(missing_ok=True)
    if proc.returncode != 0:
        raise KernelCheckUnavailable(f"linking the kernel check failed:\n{proc.stderr[-3000:]}")
    tmp.replace(exe)
    return exe


def parse(stdout: str, returncode: int, seconds: float = 0.0) -> KernelResult:
    """The harness's verdict: per-type lines, the FAIL lines, and its last line `ok`."""
    lines = stdout.strip().splitlines()
    types: dict[str, bool] = {}
    for line in lines:
        m = _TYPE_LINE.match(line.strip())
        if m:
            types[m.group(1).upper()] = m.group(2) == "ok"
    passed = returncode == 0 and bool(lines) and lines[-1].strip() == "ok"
    if not passed and types and all(types.values()):  # a crash or a failure no type owns: all suspect
        types = dict.fromkeys(types, False)
    if not types:  # no per-type lines (a crash before them): every type is unproven
        types = dict.fromkeys(TYPES, passed)
    failures = tuple(line for line in lines if line.startswith("FAIL"))
    return KernelResult(passed, types, lines[0] if lines else "", failures, round(seconds, 2), stdout)


def run(
    exe: Path, timeout: float = 300.0, *, quick: bool = True, expect_x86: bool = False, our_patches: bool = True
) -> KernelResult:
    """Run the check; `quick` (the self-test's) keeps every path with fewer sizes (see the harness);
    without `our_patches` (a build of another source) only the answers are checked, not which
    kernels are wired in."""
    start = time.monotonic()
    argv = [str(exe), *(["quick"] if quick else []), *(["x86"] if expect_x86 else [])]
    argv += [] if our_patches else ["results-only"]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return parse(f"FAIL: the kernel check ran past {timeout:.0f} s", 1, time.monotonic() - start)
    # the verdict is on stdout; ggml's own log lines ("repack: repack tensor ...") go to stderr
    out = proc.stdout
    if proc.returncode < 0:
        out += f"\nFAIL: the kernel check died with signal {-proc.returncode}\n"
    return parse(out, proc.returncode, time.monotonic() - start)


def check_build(key_dir: Path, *, our_patches: bool = True) -> KernelResult:
    """Compile (or reuse) and run the check against the build in key_dir."""
    parts = link_parts(key_dir)
    return run(compile_check(parts, key_dir / "selftest"), our_patches=our_patches)
