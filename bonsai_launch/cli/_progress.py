"""A rich progress bar on stderr for the commands that measure (bench, tune, start's tuning)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID


class ProgressListener:
    """A rich progress bar on stderr: requests done out of planned, and what runs now."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._progress: Progress | None = None
        self._task: TaskID | None = None

    def __enter__(self) -> ProgressListener:
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            from bonsai_launch.core.console import console

            progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=console(stderr=True),
                transient=True,
            )
            progress.start()
            self._task = progress.add_task("bench", total=None)
            self._progress = progress
        return self

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.stop()

    def total(self, n: int) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, total=n)

    def step(self, text: str) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, description=text[:70])

    def advance(self, n: int = 1) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.advance(self._task, n)

    def note(self, text: str) -> None:
        if self._progress is not None:
            self._progress.console.print(text)
