"""Running cmake and ninja: hermetic flags, a progress bar, a full log, clean interrupts.

The compiler runs in its own process group so that Ctrl+C (which reaches only bonsai) stops
every compiler it started, not just ninja; the build folder is left as ninja left it, so the
next run continues incrementally. How a group is started and stopped on each system lives in
process_control.py (Windows: a console Ctrl+Break to the group, then a Job Object ends what
is left). Nothing here installs anything.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from bonsai_launch.core import process_control
from bonsai_launch.core.errors import ActionFailed

# llama-quantize makes the converted DSpark drafters small (bonsai convert-drafter, drafter_convert.py).
TARGETS = ("llama-server", "llama-speculative-simple", "llama-bench", "llama-quantize")
TAIL_LINES = 40
_STEP = re.compile(r"^\[(\d+)/(\d+)\]\s*(.*)")

# Flags that change how we build, not what we build: left out of the build key.
NOT_IN_KEY = ("-DGGML_CCACHE=",)


def base_flags(build_number: int | None, commit: str = "", *, native: bool = True, ccache: bool = True) -> list[str]:
    """The hermetic CPU configure: Release, static, no download at configure or build time.

    Keep this list and its order as is: the first real build reused a warm ccache made with
    exactly these flags.
    """
    flags = ["-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF"]
    if build_number is not None:
        flags.append(f"-DLLAMA_BUILD_NUMBER={build_number}")
    if commit:
        flags.append(f"-DLLAMA_BUILD_COMMIT={commit}")
    flags += [
        "-DLLAMA_OPENSSL=OFF",
        "-DLLAMA_BUILD_UI=OFF",
        "-DLLAMA_USE_PREBUILT_UI=OFF",  # ON downloads the web UI at build time
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=ON",  # llama-speculative-simple lives under examples/
        "-DLLAMA_BUILD_TOOLS=ON",
        "-DLLAMA_BUILD_SERVER=ON",
        "-DLLAMA_BUILD_APP=OFF",
        f"-DGGML_NATIVE={'ON' if native else 'OFF'}",
        f"-DGGML_CCACHE={'ON' if ccache else 'OFF'}",
        "-DFETCHCONTENT_FULLY_DISCONNECTED=ON",
    ]
    return flags


def key_flags(flags: list[str] | tuple[str, ...]) -> list[str]:
    return [f for f in flags if not f.startswith(NOT_IN_KEY)]


@dataclass
class StepProgress:
    """What ninja's `[n/N] description` lines say."""

    done: int = 0
    total: int = 0
    current: str = ""


def parse_step(line: str) -> tuple[int, int, str] | None:
    m = _STEP.match(line)
    return (int(m.group(1)), int(m.group(2)), m.group(3)) if m else None


def _stop_group(proc: subprocess.Popen, control: process_control.ProcessControl) -> None:
    """Interrupt (what Ctrl+C sends), ask to stop, then end the whole group (ninja and compilers)."""
    for send, wait in ((control.interrupt, 3.0), (control.request_stop, 3.0)):
        if not send(proc.pid):
            continue
        try:
            proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    else:
        control.force_stop(proc.pid, proc)
        try:
            proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            pass
    # Compilers in the group may outlive ninja by a moment; make sure none is left.
    control.end_leftovers(proc.pid)


def _pty_lines(master: int):
    """Lines written to a pseudo-terminal until every writer is gone (EIO on Linux)."""
    buf = b""
    try:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                yield line.decode(errors="replace").rstrip("\r") + "\n"
        if buf:
            yield buf.decode(errors="replace").rstrip("\r") + "\n"
    finally:
        os.close(master)


def _spawn(
    argv: list[str], cwd: Path | None, env: dict[str, str], line_buffered: bool, control: process_control.ProcessControl
):
    """Start argv in its own process group; returns (process, iterator of output lines).

    ninja writes its `[n/N]` lines through stdio, which a pipe fully buffers: the progress
    bar would move in jumps of dozens of steps. A pseudo-terminal (with TERM=dumb, so ninja
    still prints plain lines) makes it line-buffered. Compilers are unaffected: ninja always
    captures their output through its own pipes.
    """
    group = control.popen_options(die_with_parent=True)
    if line_buffered and os.name == "posix":
        import pty

        master, slave = pty.openpty()
        try:
            proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env={**env, "TERM": "dumb"},
                stdout=slave,
                stderr=slave,
                stdin=subprocess.DEVNULL,
                **group,
            )
        except BaseException:
            os.close(master)
            raise
        finally:
            os.close(slave)
        return proc, _pty_lines(master)
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        errors="replace",
        bufsize=1,
        **group,
    )
    assert proc.stdout is not None
    return proc, proc.stdout


def run_logged(
    argv: list[str],
    *,
    cwd: Path | None,
    env: dict[str, str],
    log: TextIO,
    on_line: Callable[[str], None] | None = None,
    line_buffered: bool = False,
) -> int:
    """Run argv in its own process group, copy every output line to `log`, return the exit code."""
    log.write("$ " + " ".join(argv) + "\n")
    log.flush()
    control = process_control.current()
    proc, lines = _spawn(argv, cwd, env, line_buffered, control)
    guard = control.guard(proc, die_with_parent=True)
    try:
        for line in lines:
            log.write(line)
            if on_line is not None:
                on_line(line.rstrip("\n"))
        return proc.wait()
    except BaseException:  # Ctrl+C or anything else: leave no compiler running
        _stop_group(proc, control)
        log.write("\n[interrupted: bonsai stopped the build's process group]\n")
        log.flush()
        raise
    finally:
        guard.release()
        if proc.stdout is not None:
            proc.stdout.close()
        close = getattr(lines, "close", None)
        if close is not None:
            close()


def tail(path: Path, n: int = TAIL_LINES) -> list[str]:
    try:
        with open(path, errors="replace") as fh:
            return list(deque((line.rstrip("\n") for line in fh), maxlen=n))
    except OSError:
        return []


def _fail(what: str, rc: int, log_path: Path, console) -> ActionFailed:
    lines = tail(log_path)
    if console is not None and lines:
        console.print(f"[bold]last {len(lines)} lines of {log_path}:[/]")
        for line in lines:
            console.print(line, markup=False, highlight=False)
    return ActionFailed(
        f"{what} failed (exit {rc}); full log: {log_path}", "read the log; `bonsai doctor` checks the toolchain"
    )


def configure(
    cmake: Path,
    src: Path,
    build_dir: Path,
    flags: list[str],
    env: dict[str, str],
    log: TextIO,
    log_path: Path,
    console=None,
) -> float:
    """cmake -S src -B build -G Ninja FLAGS; returns seconds taken."""
    start = time.monotonic()
    argv = [str(cmake), "-S", str(src), "-B", str(build_dir), "-G", "Ninja", *flags]
    rc = run_logged(argv, cwd=None, env=env, log=log)
    if rc != 0:
        log.flush()
        raise _fail("cmake configure", rc, log_path, console)
    return time.monotonic() - start


def build(
    ninja: Path,
    build_dir: Path,
    targets: tuple[str, ...],
    jobs: int,
    env: dict[str, str],
    log: TextIO,
    log_path: Path,
    console=None,
    label: str = "build",
) -> float:
    """ninja -C build -jN TARGETS with a progress bar from its [n/N] lines; returns seconds."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    start = time.monotonic()
    argv = [str(ninja), "-C", str(build_dir), f"-j{jobs}", *targets]
    state = StepProgress()
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("[dim]{task.fields[step]}", justify="left"),
    )
    progress = Progress(*columns, console=console, transient=True, disable=console is None)
    with progress:
        task = progress.add_task(label, total=None, step="")

        def on_line(line: str) -> None:
            step = parse_step(line)
            if step is None:
                return
            state.done, state.total, state.current = step
            short = state.current.rsplit(" ", 1)[-1]
            progress.update(task, completed=state.done, total=state.total, step=short[-60:])

        rc = run_logged(argv, cwd=None, env=env, log=log, on_line=on_line, line_buffered=True)
    if rc != 0:
        log.flush()
        raise _fail("ninja build", rc, log_path, console)
    return time.monotonic() - start
