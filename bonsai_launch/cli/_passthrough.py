"""Commands that launch llama-server accept its options: after `--`, or mixed with bonsai's own.

Click alone cannot tell a llama-server option from a typo, and it misreads multi-letter short
options (`-np 2` became `-n` plus `-p 2`, the profile). So before Click parses, every word that
is not one of the command's own options is checked against llama-server's option table: a
known option is taken out, with exactly as many values as llama-server reads, and joins the
arguments after `--`; anything else stops with "unknown option X (did you mean Y?)".
The command reads the result with `passthrough_args(ctx)`; bonsai_launch.server.passthrough then
folds it into the plan.
"""

from __future__ import annotations

from typing import Any

from typer.core import TyperCommand  # typer ships its own copy of Click: no `import click` here

_META_KEY = "bonsai.passthrough"


def _is_number(word: str) -> bool:
    try:
        float(word)
        return True
    except ValueError:
        return False


def own_options(command: Any, ctx: Any) -> dict[str, bool]:
    """The command's own option names -> whether each takes a value."""
    names: dict[str, bool] = {name: False for name in ctx.help_option_names}
    for param in command.get_params(ctx):
        if getattr(param, "param_type_name", None) == "option":
            takes_value = not (param.is_flag or param.count)
            for name in (*param.opts, *param.secondary_opts):
                names[name] = takes_value
    return names


def split_foreign(words: list[str], own: dict[str, bool]) -> tuple[list[str], list[str]]:
    """(words for Click, llama-server arguments) from the words before `--`."""
    from bonsai_launch.core.errors import BonsaiError
    from bonsai_launch.llamacpp.options import closest, pinned_table

    keep: list[str] = []
    foreign: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        if not word.startswith("-") or word == "-" or _is_number(word):
            keep.append(word)
            i += 1
            continue
        name = word.split("=", 1)[0] if word.startswith("--") else word
        if name in own:
            takes = own[name] and "=" not in word
            keep.extend(words[i : i + 1 + takes])
            i += 1 + takes
            continue
        table = pinned_table()
        option = table.lookup(name)
        if option is None:
            guess = closest(name, [*own, *table.names()])
            raise BonsaiError(
                f"unknown option {name}" + (f" (did you mean {guess}?)" if guess else ""),
                "see --help for bonsai's options; llama-server's own go after --",
            )
        count = 0 if "=" in word else option.values
        foreign.extend(words[i : i + 1 + count])
        i += 1 + count
    return keep, foreign


class PassthroughCommand(TyperCommand):
    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        args = list(args)
        after: list[str] = []
        if "--" in args:
            cut = args.index("--")
            args, after = args[:cut], args[cut + 1 :]
        keep, foreign = split_foreign(args, own_options(self, ctx))
        ctx.meta[_META_KEY] = (*foreign, *after)
        return super().parse_args(ctx, keep)


def passthrough_args(ctx: Any) -> tuple[str, ...]:
    """The llama-server arguments given to this command (foreign options, then those after --)."""
    return tuple(ctx.meta.get(_META_KEY, ()))
