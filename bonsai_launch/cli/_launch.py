"""The launch options `bonsai start`, `run` and `chat` share, declared once.

A command takes them as one value, `launch: LaunchOptions`, and is decorated with
`@launch_options`: typer then lists every field below as an option of that command, at the place
of `launch` in its signature. A new launch option is one field here and, when it is a setting,
one entry in `LaunchOptions.flags`.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable
from typing import Any

from bonsai_launch.cli._options import (
    CtxOpt,
    DrafterOpt,
    FamilyOpt,
    ModelOpt,
    NglOpt,
    ParallelOpt,
    ProfileOpt,
    SizeOpt,
    SpecAutoOpt,
    SpecFallbackOpt,
    SpecNmaxOpt,
    SpecOpt,
    SpecTypeOpt,
)


@dataclasses.dataclass(frozen=True)
class LaunchOptions:
    """What the user said about the server to launch (None: not given)."""

    profile: ProfileOpt = None
    family: FamilyOpt = None
    size: SizeOpt = None
    model: ModelOpt = None
    drafter: DrafterOpt = None
    speculative: SpecOpt = None
    spec_type: SpecTypeOpt = None
    spec_nmax: SpecNmaxOpt = None
    ctx_size: CtxOpt = None
    ngl: NglOpt = None
    parallel: ParallelOpt = None
    spec_fallback: SpecFallbackOpt = False
    speculative_auto: SpecAutoOpt = False  # `--speculative auto`, rewritten by cli/main.py

    def flags(self, **more: Any) -> dict[str, Any]:
        """The flag layer of the settings (see settings.resolve), keyed by setting name; `more`
        adds a command's own settings (start's --host, --port, --kv4)."""
        return {
            "profile": self.profile,
            "family": self.family,
            "size": self.size,
            "speculative": "auto" if self.speculative_auto else self.speculative,
            "spec_type": self.spec_type,
            "spec_nmax": self.spec_nmax,
            "ctx": self.ctx_size,
            "ngl": self.ngl,
            "parallel": self.parallel,
            **more,
        }


def launch_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Give `command` the fields of LaunchOptions as options, passed to it as `launch`."""
    fields = dataclasses.fields(LaunchOptions)
    hints = typing.get_type_hints(LaunchOptions, include_extras=True)  # Annotated[..., typer.Option]
    as_options = [
        inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=hints[f.name])
        for f in fields
    ]
    signature = inspect.signature(command, eval_str=True)
    parameters: list[inspect.Parameter] = []
    for p in signature.parameters.values():
        # typer passes every value by name, so all of them can be keyword-only
        parameters += as_options if p.name == "launch" else [p.replace(kind=inspect.Parameter.KEYWORD_ONLY)]

    @functools.wraps(command)
    def with_launch(**values: Any) -> Any:
        launch = LaunchOptions(**{f.name: values.pop(f.name) for f in fields})
        return command(launch=launch, **values)

    # What typer reads: the command's own parameters with the launch options in place of `launch`.
    with_launch.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]  # read by inspect.signature
    with_launch.__annotations__ = {p.name: p.annotation for p in parameters}
    return with_launch
