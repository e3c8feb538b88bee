"""PowerShell source read with a real grammar: tree-sitter-powershell (PyPI) under `tree-sitter`.

No PowerShell runs here (none can be installed on our machines), so this parser is what
checks scripts/*.ps1 and `bonsai start --dry-run --format powershell`: no syntax errors,
and the commands they contain, argument by argument.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import tree_sitter
import tree_sitter_powershell

from bonsai_launch.core.shell import SINGLE_QUOTES


@lru_cache(maxsize=1)
def parser() -> tree_sitter.Parser:
    # The grammar package exposes its compiled language as a capsule; tree-sitter wraps it.
    return tree_sitter.Parser(tree_sitter.Language(tree_sitter_powershell.language()))


def parse(source: str) -> tree_sitter.Tree:
    return parser().parse(source.encode("utf-8"))


def syntax_errors(source: str) -> list[str]:
    """Every ERROR or MISSING node, as `line:column: text` (1-based), in document order."""
    found: list[str] = []

    def walk(node: tree_sitter.Node) -> None:
        if node.is_error or node.is_missing:
            row, col = node.start_point
            kind = "missing" if node.is_missing else "unexpected"
            found.append(f"{row + 1}:{col + 1}: {kind} {node.type if node.is_missing else node.text.decode()!r}")
            return
        for child in node.children:
            walk(child)

    walk(parse(source).root_node)
    return found


@dataclass(frozen=True)
class Command:
    invoked: bool  # called with & (the call operator)
    name: str  # source text of the command name
    elements: tuple[str, ...]  # source text of each argument, separators left out


def commands(source: str) -> list[Command]:
    """Every command in `source`, outermost first."""
    found: list[Command] = []

    def walk(node: tree_sitter.Node) -> None:
        if node.type == "command":
            name = node.child_by_field_name("command_name")
            elements = node.child_by_field_name("command_elements")
            args = tuple(
                c.text.decode() for c in (elements.children if elements else ()) if c.type != "command_argument_sep"
            )
            invoked = any(c.type == "command_invokation_operator" for c in node.children)
            found.append(Command(invoked, name.text.decode() if name else "", args))
        for child in node.children:
            walk(child)

    walk(parse(source).root_node)
    return found


def calls_inside_array_expression(source: str, name: str) -> list[bool]:
    """For each call of command `name`: is it inside @(...)? (A function's returned array is
    unrolled into the pipeline; only @(...) at the call site gives it back as an array.)"""
    found: list[bool] = []

    def walk(node: tree_sitter.Node) -> None:
        if node.type == "command":
            called = node.child_by_field_name("command_name")
            if called is not None and called.text.decode().lower() == name.lower():
                parent, wrapped = node.parent, False
                while parent is not None and not wrapped:
                    wrapped = parent.type == "array_expression"
                    parent = parent.parent
                found.append(wrapped)
        for child in node.children:
            walk(child)

    walk(parse(source).root_node)
    return found


def env_variables(source: str) -> set[str]:
    """Names X of every $env:X the code (not the comments) reads or sets."""
    names: set[str] = set()

    def walk(node: tree_sitter.Node) -> None:
        if node.type == "variable":
            text = node.text.decode()
            if text.lower().startswith("$env:"):
                names.add(text[5:])
        for child in node.children:
            walk(child)

    walk(parse(source).root_node)
    return names


def comments(source: str) -> str:
    parts: list[str] = []

    def walk(node: tree_sitter.Node) -> None:
        if node.type == "comment":
            parts.append(node.text.decode())
        for child in node.children:
            walk(child)

    walk(parse(source).root_node)
    return "\n".join(parts)


def argument_value(text: str) -> str:
    """What PowerShell passes for one argument's source text: a verbatim '...' string is
    unquoted (a doubled quote is one quote), a bare word is itself."""
    if len(text) >= 2 and text[0] in SINGLE_QUOTES and text[-1] in SINGLE_QUOTES:
        body, out, i = text[1:-1], [], 0
        while i < len(body):
            out.append(body[i])
            i += 2 if body[i] in SINGLE_QUOTES and i + 1 < len(body) and body[i + 1] in SINGLE_QUOTES else 1
        return "".join(out)
    return text
