"""scripts/*.ps1 and `--format powershell` output, checked with the PowerShell grammar.

PowerShell cannot be installed here, so the tree-sitter-powershell grammar stands in for
its parser: the wrappers must parse without a syntax error, hand `bonsai` the same
subcommand, separator and trailing arguments as their .sh twins, and document only
BONSAI_* variables that `bonsai start` (or `run`) really reads, the same ones as the .sh
wrappers. `pwsh` itself runs them in tests/test_scripts.py where it is installed (CI).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from bonsai_launch.config import settings
from bonsai_launch.core.shell import render_command
from cli_runner import run_cli
from powershell_syntax import (
    argument_value,
    calls_inside_array_expression,
    commands,
    comments,
    env_variables,
    syntax_errors,
)

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"
PS1 = sorted(SCRIPTS.glob("*.ps1"))
WRAPPERS = {"start_llama_server": "start", "run_llama": "run"}


def test_there_are_wrappers_to_check():
    assert {p.stem for p in PS1} >= set(WRAPPERS)


@pytest.mark.parametrize("script", PS1, ids=lambda p: p.name)
def test_ps1_parses_without_syntax_errors(script):
    assert syntax_errors(script.read_text(encoding="utf-8")) == []


def test_the_parser_does_find_errors():
    """The check above can fail: broken PowerShell is reported with its place."""
    assert syntax_errors("if ($x -eq 1 {\n  & $exe @args\n")
    assert syntax_errors("function Find-Bonsai {\n  return @(1, 2\n}\n")


def _bonsai_call(script: Path) -> tuple[str, ...]:
    """The arguments the .ps1 hands to bonsai: those of `& $exe @prefix ...`, after @prefix."""
    calls = [c for c in commands(script.read_text(encoding="utf-8")) if c.invoked and c.name == "$exe"]
    assert len(calls) == 1, calls
    elements = calls[0].elements
    assert elements[0] == "@prefix"  # `bonsai` or `python -m bonsai_launch`
    return tuple("@args" if e == "@args" else argument_value(e) for e in elements[1:])


def _sh_calls(script: Path) -> set[tuple[str, ...]]:
    """What each `exec ... bonsai ...` line of the .sh twin hands to bonsai."""
    found = set()
    for line in script.read_text().splitlines():
        line = line.strip()
        if not line.startswith("exec "):
            continue
        words = shlex.split(line)[1:]
        start = words.index("bonsai_launch") + 1 if "bonsai_launch" in words else 1
        found.add(tuple("@args" if w == "$@" else w for w in words[start:]))
    return found


@pytest.mark.parametrize("stem, subcommand", WRAPPERS.items())
def test_ps1_hands_bonsai_what_the_sh_does(stem, subcommand):
    ps_call = _bonsai_call(SCRIPTS / f"{stem}.ps1")
    assert _sh_calls(SCRIPTS / f"{stem}.sh") == {ps_call}
    assert ps_call[0] == subcommand and ps_call[-1] == "@args"  # every trailing argument, unchanged
    if subcommand == "start":
        # A bare -- would be taken by PowerShell itself; it must reach bonsai, quoted.
        source = (SCRIPTS / f"{stem}.ps1").read_text()
        assert "'--'" in source and ps_call == ("start", "--", "@args")


def _documented(text: str) -> set[str]:
    return set(re.findall(r"\bBONSAI_[A-Z0-9_]+\b", text))


@pytest.mark.parametrize("stem, subcommand", WRAPPERS.items())
def test_ps1_documents_the_variables_bonsai_reads_as_the_sh_does(stem, subcommand):
    source = (SCRIPTS / f"{stem}.ps1").read_text(encoding="utf-8")
    documented = _documented(comments(source))
    assert documented, "the header names the variables users set"
    for name in documented:
        setting = settings.BY_ENV.get(name)
        assert setting is not None, f"{name} is not a bonsai setting"
        assert subcommand in setting.commands, f"`bonsai {subcommand}` does not read {name}"
    assert documented == _documented((SCRIPTS / f"{stem}.sh").read_text())
    # The wrapper leaves them to bonsai (which checks every value): it sets or reads none itself.
    assert not {v for v in env_variables(source) if v.upper().startswith(("BONSAI_", "LLAMA_"))}


@pytest.mark.parametrize("stem", WRAPPERS)
def test_ps1_keeps_the_found_command_an_array(stem):
    """`return @($path)` reaches the caller as a plain string (PowerShell unrolls returned
    arrays), and `$bonsai[0]` of a string is its first letter: the wrappers were broken
    whenever bonsai was on PATH. Only @(...) around the call keeps an array."""
    source = (SCRIPTS / f"{stem}.ps1").read_text(encoding="utf-8")
    assert calls_inside_array_expression(source, "Find-Bonsai") == [True]
    assert calls_inside_array_expression("$bonsai = Find-Bonsai\n", "Find-Bonsai") == [False]  # the check can fail


@pytest.mark.parametrize("stem", WRAPPERS)
def test_ps1_passes_the_exit_code(stem):
    source = (SCRIPTS / f"{stem}.ps1").read_text(encoding="utf-8")
    assert source.rstrip().endswith("exit $LASTEXITCODE")
    assert "exit 127" in source  # not installed, as the .sh says


# -- bonsai start --dry-run --format powershell --------------------------------------------------------

HARD_ARGUMENTS = [
    "--model",
    r"C:\Users\Ana Lopez\models\Bonsai 8B.gguf",  # spaces, backslashes
    "--alias",
    "it's",
    "--chat-template-kwargs",
    '{"enable_thinking": false}',
    "--api-key-file",
    "$HOME\\key;rm -rf /",  # $ and ; are literal
    "--override-kv",
    "a,b",
    "-Dfoo.bar",
    "--",
    "1kb",
    "0x10",
    "007",
    "`n",
    "@args",
    "%PATH%",
    "--reasoning",
    "\u2019quoted\u2018",
    "ünïcode ✓",
    "8080",
    "-c",
    "4096",
    "0.5",
    "127.0.0.1",
]


def _rendered_argv(text: str) -> tuple[str, list[str]]:
    assert syntax_errors(text) == [], text
    (call,) = [c for c in commands(text) if c.invoked]
    return argument_value(call.name), [argument_value(e) for e in call.elements]


def test_powershell_rendering_round_trips_every_argument():
    program = r"C:\Program Files\bonsai\llama-server.exe"
    text = render_command([program, *HARD_ARGUMENTS], "powershell", {"LLAMA_API_KEY": "se'cret", "BONSAI_X": "1"})
    assert text.startswith("$env:LLAMA_API_KEY = 'se''cret'; $env:BONSAI_X = '1'; & ")
    name, args = _rendered_argv(text)
    assert name == program and args == HARD_ARGUMENTS


@pytest.mark.parametrize("risky", ["a,b", "-Dfoo.bar", "--", "1kb", "$x", "@x", "x;y", "(1)", "{x}", "#x", "a b", ""])
def test_risky_words_are_quoted(risky):
    assert render_command(["llama-server", risky], "powershell") == f"& 'llama-server' '{risky}'"


def test_dry_run_format_powershell_is_valid_powershell(tmp_path, capsys):
    import tiny_gguf

    model = tiny_gguf.write_target(tmp_path / "my model's dir" / "target.gguf")
    code, out, err = run_cli(
        capsys,
        "start",
        "--model",
        str(model),
        "--dry-run",
        "--format",
        "powershell",
        "--port",
        "8099",
        "--",
        "--alias",
        "a,b",
    )
    assert code == 0, err
    name, args = _rendered_argv(out.strip())
    assert Path(name).name.startswith("llama-server")
    assert args[args.index("-m") + 1] == str(model)
    assert args[args.index("--port") + 1] == "8099"
    # --alias is planned (the served model name), so it sits after -m, once, with its comma intact.
    assert args.count("--alias") == 1 and args[args.index("--alias") + 1] == "a,b"


def test_readme_powershell_commands_parse():
    blocks = re.findall(r"```powershell\n(.*?)```", (ROOT / "README.md").read_text(encoding="utf-8"), re.S)
    assert blocks
    for block in blocks:
        assert syntax_errors(block) == []
