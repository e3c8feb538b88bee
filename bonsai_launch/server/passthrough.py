"""Arguments for llama-server that the user passes through bonsai (after `--`).

llama-server takes the last value of a repeated option, so an argument simply appended after
the planned flags could override any of them unseen: `-- --host 0.0.0.0` would bind beyond
loopback without the opt-in or a key. Instead, each argument is parsed against llama-server's
own option table (bonsai_launch.llamacpp.options: aliases fold to one name, values are counted as
llama-server counts them) and sorted into four kinds:

- options a bonsai setting owns (`--host`, `--port`, `-c`, `-ngl`, `-np`, `--spec-type`,
  `--spec-draft-n-max`, `--api-key`, `-v`): folded into the settings with the source
  "passthrough", as if the setting had been given, so the plan's rules apply to them once;
- options the plan sets itself without a setting (`-ub`, `-b`, `--alias`): handed to the plan,
  which places them and applies its rules (slots x (draft + 1) <= ub and b, in slots.py);
- options bonsai must set itself (`-m`, `-md`, `-ngld`, `--api-key-file`, `--help`...):
  refused with the bonsai setting to use;
- everything else: passed on unchanged, except secrets, which go to the environment.
Nothing here touches processes or disk: `parse` and the folding are pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bonsai_launch.config.settings import BY_KEY, Resolved, Settings, parse_value
from bonsai_launch.core.errors import BonsaiError
from bonsai_launch.llamacpp.options import Option, OptionTable, closest
from bonsai_launch.models.draft_head import FLAG as DRAFT_HEAD_FLAG

# llama-server option (canonical name) -> the bonsai setting that owns it.
SETTING_OPTIONS: dict[str, str] = {
    "--host": "host",
    "--port": "port",
    "--ctx-size": "ctx",
    "--gpu-layers": "ngl",
    "--spec-type": "spec_type",
    "--spec-draft-n-max": "spec_nmax",
    DRAFT_HEAD_FLAG: "draft_head_rows",
    "--api-key": "api_key",
    "--verbose": "verbose",
    "--parallel": "parallel",
}
# The bonsai flag for a setting, where there is one (`bonsai start --port`).
SETTING_FLAGS: dict[str, str] = {
    "host": "--host",
    "port": "--port",
    "ctx": "--ctx",
    "ngl": "--ngl",
    "spec_type": "--spec-type",
    "spec_nmax": "--spec-nmax",
    "parallel": "--parallel",
}
# Options the plan places itself: canonical name -> the plan's name for the value.
PLAN_OPTIONS: dict[str, str] = {"--ubatch-size": "ubatch", "--batch-size": "batch", "--alias": "alias"}
_EXITS_AT_ONCE = "it makes llama-server print and exit: run the llama-server binary with it directly"
# Options bonsai sets itself, with what to use instead.
REFUSED: dict[str, str] = {
    "--model": "bonsai's --model PATH (or --profile NAME)",
    "--spec-draft-model": "bonsai's --drafter PATH",
    "--spec-draft-ngl": "--ngl / BONSAI_NGL (the drafter's GPU layers follow the target's)",
    "--api-key-file": "BONSAI_API_KEY (or `-- --api-key KEY`): bonsai's own clients must know the key",
    # Another model source than the plan's file:
    "--hf-repo": "bonsai's --model PATH or --profile NAME (`bonsai pull` fetches a profile's files)",
    "--hf-file": "bonsai's --model PATH or --profile NAME (`bonsai pull` fetches a profile's files)",
    "--model-url": "bonsai's --model PATH or --profile NAME (`bonsai pull` fetches a profile's files)",
    "--docker-repo": "bonsai's --model PATH or --profile NAME (`bonsai pull` fetches a profile's files)",
    "--spec-draft-hf": "bonsai's --drafter PATH",
    "--help": _EXITS_AT_ONCE,
    "--version": _EXITS_AT_ONCE,
    "--list-devices": _EXITS_AT_ONCE,
    "--cache-list": _EXITS_AT_ONCE,
    "--completion-bash": _EXITS_AT_ONCE,
}
# Secrets given as options: moved to the environment variable llama-server reads them from,
# so they never show in `ps`, `bonsai ps` or --dry-run.
SECRET_OPTIONS = frozenset({"--hf-token"})


def setting_name(key: str) -> str:
    """`--port / BONSAI_PORT`, or just the variable when the setting has no flag."""
    env = BY_KEY[key].env
    return f"{SETTING_FLAGS[key]} / {env}" if key in SETTING_FLAGS else env


@dataclass(frozen=True)
class PassArg:
    option: Option
    spelled: str  # as the user wrote it (`-c`, `--ctx_size`)
    values: tuple[str, ...]

    @property
    def canonical(self) -> str:
        return self.option.canonical

    @property
    def argv(self) -> tuple[str, ...]:
        return (self.spelled, *self.values)

    @property
    def shown(self) -> str:
        """For messages; a secret's value is never shown."""
        if self.canonical in SECRET_OPTIONS or self.canonical == "--api-key":
            return f"{self.spelled} ***"
        return " ".join(self.argv)


@dataclass(frozen=True)
class Passthrough:
    args: tuple[PassArg, ...] = ()
    table: OptionTable | None = None

    def __bool__(self) -> bool:
        return bool(self.args)

    def setting_args(self) -> list[tuple[str, PassArg]]:
        return [(SETTING_OPTIONS[a.canonical], a) for a in self.args if a.canonical in SETTING_OPTIONS]

    def plan_value(self, name: str) -> str | None:
        """The last value given for one of PLAN_OPTIONS (llama-server takes the last)."""
        found = [a for a in self.args if PLAN_OPTIONS.get(a.canonical) == name]
        return found[-1].values[0] if found else None

    def plan_int(self, name: str) -> int | None:
        raw = self.plan_value(name)
        if raw is None:
            return None
        arg = next(a for a in reversed(self.args) if PLAN_OPTIONS.get(a.canonical) == name)
        try:
            number = int(raw, 10)
        except ValueError:
            raise BonsaiError(
                f"-- {arg.spelled} {raw!r} is not a whole number", f"for example -- {arg.spelled} 1"
            ) from None
        if number < 1:
            raise BonsaiError(f"-- {arg.spelled} {number} must be at least 1", f"for example -- {arg.spelled} 1")
        return number

    def last_int(self, canonical: str) -> int | None:
        """The last value of an option that passes through (an n-gram draft length), as a number."""
        for a in reversed(self.args):
            if a.canonical == canonical and a.values:
                try:
                    return int(a.values[0], 10)
                except ValueError:
                    return None
        return None

    def secret_env(self) -> dict[str, str]:
        return {a.option.env or a.canonical: a.values[0] for a in self.args if a.canonical in SECRET_OPTIONS}

    def rest(self) -> tuple[PassArg, ...]:
        """What goes to llama-server as given: neither owned, nor refused, nor secret."""
        owned = set(SETTING_OPTIONS) | set(PLAN_OPTIONS) | set(REFUSED) | SECRET_OPTIONS
        return tuple(a for a in self.args if a.canonical not in owned)

    def check_refused(self) -> None:
        for a in self.args:
            if a.canonical in REFUSED:
                raise BonsaiError(f"-- {a.shown}: bonsai sets {a.canonical} itself", f"use {REFUSED[a.canonical]}")
            if _is_preset(a.option):
                raise BonsaiError(
                    f"-- {a.spelled}: a llama-server preset that picks its own model or speculation",
                    "use bonsai's --profile/--model and BONSAI_SPECULATIVE=1 (with BONSAI_SPEC_TYPE)",
                )
            if a.option.removed:
                raise BonsaiError(
                    f"-- {a.spelled}: llama-server has removed this option and exits when it is given",
                    "see `llama-server --help` for its replacement (--spec-draft-n-max, --spec-ngram-*)",
                )


def _is_preset(option: Option) -> bool:
    """`--spec-default` (turns on ngram-mod) and the model presets (`--fim-qwen-7b-spec`,
    `--gpt-oss-20b-default`...): switches that set the model or speculation behind the plan."""
    return option.values == 0 and option.canonical.endswith(("-default", "-spec"))


def _is_number(word: str) -> bool:
    try:
        float(word)
        return True
    except ValueError:
        return False


def parse(words: Sequence[str], table: OptionTable, *, extra_names: Sequence[str] = ()) -> Passthrough:
    """Parse llama-server arguments as llama-server does. Refuses unknown options (with the
    closest known name, among llama-server's and `extra_names`), missing values and stray
    words, before anything runs. `--name=value` is split (llama-server itself rejects it)."""
    args: list[PassArg] = []
    words = list(words)
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        spelled, inline = word, None
        if word.startswith("--") and "=" in word:
            spelled, inline = word.split("=", 1)
        option = table.lookup(spelled) if word.startswith("-") and not _is_number(word) else None
        if option is None:
            if word.startswith("-") and not _is_number(word):
                guess = closest(spelled, [*table.names(), *extra_names])
                raise BonsaiError(
                    f"unknown option {spelled}" + (f" (did you mean {guess}?)" if guess else ""),
                    "see `bonsai start --help` for bonsai's options and `llama-server --help` for the server's",
                )
            raise BonsaiError(
                f"unexpected argument {word!r} for llama-server",
                "llama-server takes options only; put the value right after its option",
            )
        if inline is not None:
            if option.values != 1:
                raise BonsaiError(
                    f"{word}: {spelled} takes {option.values or 'no'} value(s)",
                    f"write {spelled}" + (" VALUE" * option.values),
                )
            values: tuple[str, ...] = (inline,)
        else:
            if i + option.values > len(words):
                raise BonsaiError(f"{spelled} needs a value", f"write {spelled} VALUE")
            values = tuple(words[i : i + option.values])
            i += option.values
        args.append(PassArg(option, spelled, values))
    return Passthrough(tuple(args), table)


def fold_settings(settings: Settings, passthrough: Passthrough) -> Settings:
    """The settings with passthrough values for owned options, as if the setting had been
    given (source "passthrough"). A bonsai flag and a passthrough value that disagree are
    refused: the user asked for two things."""
    values = dict(settings.values)
    for key, arg in passthrough.setting_args():
        raw: Any = arg.values[0] if arg.values else True
        if key == "parallel" and str(raw).strip() == "-1":
            continue  # llama-server's "auto"; bonsai's plan decides, as with BONSAI_PARALLEL unset
        if key == "ngl" and str(raw).lower() in ("all", "auto"):
            if str(raw).lower() == "auto":
                continue  # llama-server's default; bonsai's plan decides
            raw = 999
        value = parse_value(BY_KEY[key], raw, f"-- {arg.spelled}")
        current = settings.values.get(key)
        if current is not None and current.source == "flag" and current.value != value:
            shown = "***" if key == "api_key" else value
            raise BonsaiError(
                f"{SETTING_FLAGS.get(key, key)} {current.value if key != 'api_key' else '***'} and "
                f"-- {arg.spelled} {shown} disagree",
                f"give it once, as {setting_name(key)}",
            )
        values[key] = Resolved(value, "passthrough")
    return Settings(values)


def split_known(words: Sequence[str], table: OptionTable | None) -> list[tuple[str | None, tuple[str, ...]]]:
    """Lenient split of argument words (a profile's server_args) into (canonical name or None,
    words): unknown words are kept with None, never refused (they are the profile's own)."""
    out: list[tuple[str | None, tuple[str, ...]]] = []
    words = list(words)
    i = 0
    while i < len(words):
        option = table.lookup(words[i]) if table is not None else None
        if option is None:
            out.append((None, (words[i],)))
            i += 1
            continue
        out.append((option.canonical, tuple(words[i : i + 1 + option.values])))
        i += 1 + option.values
    return out


def inherited_env_warnings(environ: Mapping[str, str], table: OptionTable) -> list[str]:
    """llama-server also reads its options from LLAMA_ARG_* variables (and LLAMA_API_KEY), which
    bonsai's processes inherit: one set for an option bonsai plans would bypass the plan where
    the argv does not override it (-ub with speculation, an API key bonsai's clients never send)."""
    owned = {**SETTING_OPTIONS, **PLAN_OPTIONS}
    warnings = []
    for opt in table.options:
        if opt.env and opt.canonical in owned and environ.get(opt.env):
            key = owned[opt.canonical]
            instead = f"use {setting_name(key)}" if key in BY_KEY else f"pass `-- {opt.canonical} VALUE`"
            warnings.append(
                f"{opt.env} is set in the environment: llama-server reads it behind bonsai's plan; "
                f"unset it and {instead}"
            )
    return warnings
