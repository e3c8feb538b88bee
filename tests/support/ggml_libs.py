"""ggml's static libraries built apart from `bonsai build`, for the kernel check to link:

- `prepatch_key_dir()`: the pinned llama.cpp *without* our patches, natively: the build a kernel
  check must fail on (no x86 Q2_0 kernel, no 2x2 path, no Q1_0/Q2_0 repack, no PTQ1_0, no tiles
  for users' types: patches 0005-0006, 0011, 0013, 0020-0026);
- `portable_key_dir()`: the pin *with* our series, as `bonsai build --portable` configures it
  (GGML_NATIVE off: AVX2, FMA, F16C, no AVX-512, no VNNI). Its kernels are the ones an AVX2-only
  CPU runs (maddubs where the native build here has dpbusd), which no other build on an AVX-512
  machine compiles.

Only what the kernel check links is built (ggml, ggml-cpu, ggml-base; cmake at the llama.cpp top
level with every llama target off), from the pin's sdist that `bonsai build` keeps in
BONSAI_HOME/sources/downloads. About 3.5 minutes on 2 busy cores cold each, cached after in
~/.cache/bonsai-tests/<name>-<key>/ (a key folder as kernel_check.link_parts reads it: work/ and
the headers).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import real_parts
from bonsai_launch.core.paths import bonsai_home
from bonsai_launch.llamacpp.builds import patches, toolchain
from bonsai_launch.llamacpp.builds.pin import load_pin

TARGETS = ("ggml-cpu", "ggml-base", "ggml")


def _sdist() -> tuple[Path, str]:
    pin = load_pin().default
    homes = [bonsai_home(), Path.home() / ".cache" / "bonsai"]
    for home in homes:
        for f in sorted((home / "sources" / "downloads").glob("*.tar.gz")) if (home / "sources").is_dir() else []:
            if str(pin.version) in f.name:
                return f, pin.sha256
    real_parts.missing(
        f"the pinned sdist ({pin.package}=={pin.version}) is not in BONSAI_HOME/sources/downloads",
        "run `bonsai build` once (it downloads and keeps it)",
    )
    raise AssertionError("unreachable")


def prepatch_key_dir() -> tuple[Path, Path]:
    """(key folder with work/ holding the libraries, ggml's include folder), built when missing."""
    return _key_dir("prepatch-ggml", series=(), native=True)


def portable_key_dir() -> tuple[Path, Path]:
    """The same for the patched pin configured as `bonsai build --portable` does."""
    return _key_dir("portable-ggml", series=patches.load_series(), native=False)


def _key_dir(name: str, series: tuple[patches.Patch, ...], native: bool) -> tuple[Path, Path]:
    sdist, sha = _sdist()
    key = hashlib.sha256(f"{sha}\0{patches.series_hash(series)}\0{native}".encode()).hexdigest()[:12]
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "bonsai-tests" / f"{name}-{key}"
    work = root / "work"
    done = root / ".done"
    src = root / "src"
    if not done.is_file():
        shutil.rmtree(root, ignore_errors=True)
        src.mkdir(parents=True)
        with tarfile.open(sdist) as tar:
            tar.extractall(src, filter="data")
        tree = next(src.glob("*/llama.cpp"))
        patches.apply_series(tree, series)
        cmake, ninja = toolchain.cmake_exe(), toolchain.ninja_exe()
        if cmake is None or ninja is None:
            real_parts.missing("cmake/ninja (PyPI packages) are not installed", "pip install -e '.[test]'")
        env = {**os.environ, "CCACHE_BASEDIR": str(root)}
        env["PATH"] = os.pathsep.join([str(Path(ninja).parent), env.get("PATH", "")])
        flags = ["-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", f"-DGGML_NATIVE={'ON' if native else 'OFF'}"]
        flags += ["-DGGML_CCACHE=ON"]
        flags += [
            f"-DLLAMA_{x}=OFF" for x in ("BUILD_TESTS", "BUILD_EXAMPLES", "BUILD_TOOLS", "BUILD_SERVER", "OPENSSL")
        ]
        flags += ["-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF"]
        for argv in (
            [str(cmake), "-S", str(tree), "-B", str(work), "-G", "Ninja", *flags],
            [str(ninja), "-C", str(work), "-j2", *TARGETS],
        ):
            proc = subprocess.run(argv, capture_output=True, text=True, env=env)
            assert proc.returncode == 0, (
                f"building {name} failed ({argv[0]}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
            )
        done.write_text(key)
    tree = next(src.glob("*/llama.cpp"))
    return root, tree / "ggml" / "include"


if __name__ == "__main__":
    print(prepatch_key_dir(), portable_key_dir())
