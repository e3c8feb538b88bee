"""Writing a command line that PowerShell runs exactly as the argv it came from.

Rules (PowerShell 7.3+, where native arguments are passed as written):
- Every argument is a verbatim single-quoted string ('...', with each quote doubled) unless
  it is a plain flag (`--port`, `-c`) or a plain integer. Bare words are riskier than they
  look: `a,b` is an array, `$x` and `@x` expand, `-Dfoo.bar` is split in two by Windows
  PowerShell 5.1, `1kb` is a number, a bare `--` is eaten.
- PowerShell also takes the typographic quotes U+2018..U+201B for `'`: they are doubled too.
- The program is always quoted and called with `&`, which a quoted path needs.
- Environment variables are set with `$env:NAME = '...'; ` before the call.

Known limit: Windows PowerShell 5.1 (not 7) drops empty arguments and strips embedded
double quotes when it calls a native program, whatever the quoting (its legacy argument
passing); `bonsai start` itself never depends on the shell, since it passes argv as a list.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping

_PLAIN_FLAG = re.compile(r"--?[A-Za-z][A-Za-z0-9-]*")
_PLAIN_INT = re.compile(r"0|[1-9][0-9]*")
SINGLE_QUOTES = "'\u2018\u2019\u201a\u201b"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def quote(arg: str) -> str:
    """One argument as PowerShell source text."""
    if _PLAIN_FLAG.fullmatch(arg) or _PLAIN_INT.fullmatch(arg):
        return arg
    return "'" + "".join(c + c if c in SINGLE_QUOTES else c for c in arg) + "'"


def env_assignment(name: str, value: str) -> str:
    target = f"$env:{name}" if _ENV_NAME.fullmatch(name) else "${env:" + name.replace("}", "`}") + "}"
    return f"{target} = {quote_always(value)}; "


def quote_always(value: str) -> str:
    """A value for an assignment: always a string (a bare 8080 would be a number)."""
    return "'" + "".join(c + c if c in SINGLE_QUOTES else c for c in value) + "'"


def render(argv: Iterable[str], env: Mapping[str, str] | None = None) -> str:
    """`$env:K = 'v'; & 'program' args...`: one line to paste into PowerShell."""
    argv = list(argv)
    prefix = "".join(env_assignment(k, v) for k, v in (env or {}).items())
    return prefix + "& " + " ".join([quote_always(argv[0]), *(quote(a) for a in argv[1:])])


def render_command(argv: tuple[str, ...] | list[str], shell: str = "posix", env: dict[str, str] | None = None) -> str:
    """The command line to paste into a shell: POSIX sh or PowerShell."""
    if shell == "powershell":
        return render(argv, env)
    prefix = "".join(f"{k}={shlex.quote(v)} " for k, v in (env or {}).items())
    return prefix + shlex.join(argv)
