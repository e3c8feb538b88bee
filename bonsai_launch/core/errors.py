"""The one exception type for mistakes a user can fix.

Every user-facing failure raises BonsaiError with a message that names the setting and
the value, and a fix that says what to do next. The CLI turns it into one clean line and an
exit code; no command prints a traceback for a bad argument.
"""

from __future__ import annotations


class BonsaiError(Exception):
    """A problem the user can fix. `exit_code` 2 means bad input, 1 means a failed action."""

    def __init__(self, message: str, fix: str | None = None, exit_code: int = 2) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix
        self.exit_code = exit_code

    def __str__(self) -> str:
        return f"{self.message} ({self.fix})" if self.fix else self.message


class ActionFailed(BonsaiError):
    """Something we ran (a build, a download, a server) failed; exit code 1."""

    def __init__(self, message: str, fix: str | None = None, exit_code: int = 1) -> None:
        super().__init__(message, fix, exit_code)
