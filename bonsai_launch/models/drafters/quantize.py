"""Shrinking a converted drafter with llama-quantize from our own build (Q4_0 by default), with progress."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

from bonsai_launch.core.errors import ActionFailed, BonsaiError


def find_quantize() -> Path:
    """llama-quantize: next to the llama-server bonsai runs, else from any installed build
    (newest first; quantizing does not depend on our patches or the backend)."""
    from bonsai_launch.config.settings import resolve
    from bonsai_launch.core.paths import builds_dir, exe_name
    from bonsai_launch.llamacpp.builds.install import installed_builds
    from bonsai_launch.llamacpp.choice import choose_server
    from bonsai_launch.llamacpp.flavours import MAINLINE

    server = choose_server(resolve({}), MAINLINE).path  # the user's binary (BONSAI_LLAMA_SERVER/BIN), else ours
    candidates = [server.parent / exe_name("llama-quantize")] if server is not None else []
    candidates += [
        Path(m["binaries"]["llama-quantize"])
        for _d, m in installed_builds(builds_dir())
        if m.get("binaries", {}).get("llama-quantize")
    ]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise BonsaiError(
        "llama-quantize is not built" + (f" (not next to {server})" if server else ""),
        "run `bonsai build` (it builds llama-quantize with llama-server), or pass --quantize none",
    )


_QUANT_STEP = re.compile(r"^\[\s*(\d+)/\s*(\d+)\]\s+(\S+)")


def quantize(
    source: Path, dest: Path, qtype: str, *, on_tensor: Callable[[str], None] | None = None, binary: Path | None = None
) -> None:
    """llama-quantize source dest qtype; `on_tensor` hears each tensor's name as it is done
    (`[ i/ n] name - ...` lines; not in file order). The log is shown on failure, then removed."""
    from bonsai_launch.llamacpp.builds.cmake import run_logged, tail

    binary = binary or find_quantize()
    log_path = dest.with_name(dest.name + ".log")

    def on_line(line: str) -> None:
        m = _QUANT_STEP.match(line)
        if m and on_tensor is not None:
            on_tensor(m.group(3))

    try:
        with log_path.open("w") as log:
            rc = run_logged(
                [str(binary), str(source), str(dest), qtype], cwd=None, env=dict(os.environ), log=log, on_line=on_line
            )
        if rc != 0:
            last = " | ".join(line for line in tail(log_path, 6) if line.strip() and not line.startswith("$ "))
            raise ActionFailed(
                f"llama-quantize failed (exit {rc}): {last}",
                "convert with --quantize none to keep BF16, then run "
                f"`{binary} THAT.gguf OUT.gguf {qtype}` to see its whole log",
            )
    finally:
        log_path.unlink(missing_ok=True)
