"""llama-server's own option table, read from its `--help`.

Each option has several spellings (`-c`/`--ctx-size`, `-np`/`--parallel`, `--spec-draft-ngl`/
`-ngld`/`--gpu-layers-draft`...), takes zero, one or two values, and may be read from an
environment variable. Bonsai needs this to parse arguments meant for llama-server exactly as
llama-server will: which words are values, and which spellings name the same option.

The probe (bonsai_launch.llamacpp.binaries) parses the table of the binary it runs; before a binary is
built, the table of the pinned build (shipped as `llama_options_pinned.txt`, generated from its
`--help` by `python -m bonsai_launch.llamacpp.options HELP.txt`) stands in, since `bonsai start`
builds exactly that version.
"""

from __future__ import annotations

import difflib
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

_ENV = re.compile(r"\(env: ([A-Z0-9_]+)\)")
PINNED_TABLE = Path(__file__).with_name("llama_options_pinned.txt")


@dataclass(frozen=True)
class Option:
    names: tuple[str, ...]  # every spelling, as --help lists them (positive and negative forms)
    values: int  # 0 (a switch), 1, or 2 (--control-vector-layer-range START END)
    env: str | None = None  # the environment variable llama-server also reads it from
    removed: bool = False  # listed, but llama-server exits with an error when it is given
    # The value hint as --help shows it (`N`, `none,draft-simple,...`); only a freshly parsed
    # table has it (the capabilities read --spec-type's list from it), the stored one does not.
    hint: str = field(default="", compare=False)

    @property
    def canonical(self) -> str:
        """One name for all spellings: the first long one (`--ctx-size` for `-c`)."""
        return next((n for n in self.names if n.startswith("--")), self.names[0])

    def to_line(self) -> str:
        return "\t".join([",".join(self.names), str(self.values), self.env or "-", "removed" if self.removed else "-"])

    @classmethod
    def from_line(cls, line: str) -> Option:
        names, values, env, removed = line.rstrip("\n").split("\t")
        return cls(tuple(names.split(",")), int(values), None if env == "-" else env, removed == "removed")


@dataclass(frozen=True)
class OptionTable:
    options: tuple[Option, ...]

    def _index(self) -> dict[str, Option]:
        index = self.__dict__.get("_by_name")
        if index is None:
            index = {name: opt for opt in self.options for name in opt.names}
            object.__setattr__(self, "_by_name", index)
        return index

    def lookup(self, spelled: str) -> Option | None:
        """The option a command-line word names, as llama-server reads it (it turns `_` into
        `-` in long names, so `--ctx_size` is `--ctx-size`)."""
        if spelled.startswith("--"):
            spelled = spelled.replace("_", "-")
        return self._index().get(spelled)

    def canonical(self, spelled: str) -> str:
        opt = self.lookup(spelled)
        return opt.canonical if opt else spelled

    def names(self) -> list[str]:
        return list(self._index())

    def to_text(self) -> str:
        return "".join(opt.to_line() + "\n" for opt in self.options)

    @classmethod
    def from_text(cls, text: str) -> OptionTable:
        return cls(tuple(Option.from_line(line) for line in text.splitlines() if line.strip()))


def _value_count(hint: str) -> int:
    """`N` -> 1, `START END` -> 2, `<tensor name pattern>=<buffer type>,...` -> 1."""
    if not hint:
        return 0
    return max(1, len(re.sub(r"<[^>]*>|\[[^\]]*\]|\{[^}]*\}", "X", hint).split()))


def parse_option_table(help_text: str) -> OptionTable:
    """The option table from `llama-server --help`: the one parser of it (the capabilities
    are read from this table too).

    An option line starts in column 0 with `-`: its names are separated by `, `, and the value
    hint (if any) follows the last name after one space (llama.cpp's common_arg::to_string);
    the description follows after two or more spaces, or on the next, indented lines, where the
    `(env: NAME)` note and a "has been removed" remark also live.
    """
    options: list[Option] = []
    current: dict | None = None

    def finish() -> None:
        if current is not None:
            text = current["description"]
            env = _ENV.search(text)
            options.append(
                Option(
                    current["names"],
                    _value_count(current["hint"]),
                    env.group(1) if env else None,
                    "has been removed" in text,
                    current["hint"],
                )
            )

    for line in help_text.splitlines():
        if line.startswith("-") and not line.startswith("---"):
            finish()
            parts = re.split(r"\s{2,}", line.strip())
            column_parts = []
            for part in parts:
                if not part.startswith("-"):
                    break
                column_parts.append(part)
            column = " ".join(column_parts)
            description = " ".join(parts[len(column_parts) :])
            pieces = column.split(", ")
            last_name, _, hint = pieces[-1].partition(" ")
            names = tuple(p.strip().rstrip(",") for p in [*pieces[:-1], last_name] if p.strip())
            current = {"names": names, "hint": hint.strip(), "description": description}
        elif current is not None and line.startswith(" "):
            current["description"] += " " + line.strip()
        elif not line.strip() or line.startswith("-----"):
            finish()
            current = None
    finish()
    return OptionTable(tuple(options))


@lru_cache(maxsize=1)
def pinned_table() -> OptionTable:
    """The option table of the pinned llama-server build (used until one is built)."""
    return OptionTable.from_text(PINNED_TABLE.read_text(encoding="utf-8"))


def closest(word: str, candidates: Iterable[str]) -> str | None:
    """The most similar option name, for "did you mean" hints."""
    name = word.split("=", 1)[0]
    found = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return found[0] if found else None


if __name__ == "__main__":  # regenerate the pinned table: python -m bonsai_launch.llamacpp.options HELP.txt
    source = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("tests/data/llama-server-b11434-help.txt")
    PINNED_TABLE.write_text(parse_option_table(source.read_text(encoding="utf-8")).to_text(), encoding="utf-8")
    print(PINNED_TABLE)
