"""Progress display for pulls: one bar per file with size, speed and time left.

`Reporter` is what the pull code talks to; `RichReporter` draws rich bars on stderr (stdout
stays clean for --json), `RecordingReporter` keeps the lines for tests and library callers
that want silence. `tqdm_factory` adapts a bar to the tqdm-like class huggingface_hub's
http_get expects, so the library's own download loop drives our bars.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol


class Bar(Protocol):
    def update(self, n: int) -> None: ...
    def close(self) -> None: ...


class Reporter(Protocol):
    def note(self, message: str) -> None: ...
    def bar(self, label: str, total: int | None, initial: int = 0) -> Bar: ...


class _TqdmShim:
    """Just enough of tqdm for huggingface_hub.file_download.http_get."""

    def __init__(self, bar: Bar) -> None:
        self._bar = bar
        self.n = 0

    def update(self, n: int | float = 1) -> None:
        self.n += int(n)
        self._bar.update(int(n))

    def close(self) -> None:
        pass  # the pull closes the bar once the file is verified

    def __enter__(self) -> _TqdmShim:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def tqdm_factory(reporter: Reporter, label: str, holder: list[Bar]) -> Callable[..., _TqdmShim]:
    """A callable huggingface_hub calls like `tqdm(total=..., initial=..., desc=...)`.

    The bar is created on first call (when the response says the size) and appended to
    `holder` so the caller can close it after verification.
    """

    def make(**kwargs: Any) -> _TqdmShim:
        if not holder:
            holder.append(reporter.bar(label, kwargs.get("total"), int(kwargs.get("initial") or 0)))
        return _TqdmShim(holder[0])

    return make


class RecordingReporter:
    """Silent reporter that remembers its notes and how many bytes each bar saw."""

    def __init__(self) -> None:
        self.notes: list[str] = []
        self.bars: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def note(self, message: str) -> None:
        with self._lock:
            self.notes.append(message)

    def bar(self, label: str, total: int | None, initial: int = 0) -> Bar:
        entry: dict[str, Any] = {"label": label, "total": total, "initial": initial, "done": initial, "closed": False}
        with self._lock:
            self.bars.append(entry)

        class _Bar:
            def update(self, n: int) -> None:
                entry["done"] += n

            def close(self) -> None:
                entry["closed"] = True

        return _Bar()


class RichReporter:
    """rich progress bars on stderr. Use as a context manager around a whole pull."""

    def __init__(self, console: Any = None) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        self.console = console or Console(stderr=True, highlight=False)
        self._progress = Progress(
            TextColumn("{task.description}", markup=False),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=self.console,
            transient=False,
        )

        self._started = False

    def __enter__(self) -> RichReporter:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._started:
            self._progress.stop()

    def note(self, message: str) -> None:
        self.console.print(message, markup=False, highlight=False)

    def bar(self, label: str, total: int | None, initial: int = 0) -> Bar:
        progress = self._progress
        if not self._started:  # started on the first bar: a pull with nothing to fetch draws nothing
            progress.start()
            self._started = True
        task = progress.add_task(label, total=total, completed=initial)

        class _Bar:
            def update(self, n: int) -> None:
                progress.advance(task, n)

            def close(self) -> None:
                progress.stop_task(task)

        return _Bar()
