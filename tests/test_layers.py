"""The package keeps its shape: wings in one order, no import circle (inside a wing either),
commands that never borrow from each other, a library that never imports the CLI, and no
module that has grown past one job.

Read with `ast`, imports inside functions included: those are where upward arrows hid before
(README#layout has the wings; CONTRIBUTING says where a new capability goes).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "bonsai_launch"

# Lowest first. A module may import its own wing and the wings below it, never one above.
WINGS = ("core", "config", "llamacpp", "models", "decisions", "server", "bench", "tune", "fleet", "cli")
# Modules at the top of the package, and the wing they stand in.
TOP_LEVEL = {"__init__": "core", "doctor": "server", "__main__": "cli"}
MAX_LINES = 450
LONG_ON_PURPOSE = {"config/settings.py"}  # the settings table: one entry per variable, read as one


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def wing_of(module: str) -> str | None:
    """`bonsai_launch.server.plan.compose` -> `server`; None for a module outside every wing."""
    parts = module.split(".")[1:]
    if not parts:
        return "core"  # the package's face
    if parts[0] in WINGS:
        return parts[0]
    return TOP_LEVEL.get(parts[0])


def imported_modules(path: Path, known: set[str], root: Path = PACKAGE) -> list[tuple[int, str]]:
    """Every bonsai_launch module `path` imports (line, name), once each, at any depth of the file."""
    me = module_name(path, root)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            # `from pkg import module` names a module; `from module import name` names the module.
            found += [(node.lineno, f"{base}.{a.name}" if f"{base}.{a.name}" in known else base) for a in node.names]
    ours = [(line, name) for line, name in found if name == "bonsai_launch" or name.startswith("bonsai_launch.")]
    return sorted(set(ours))


def is_command(module: str) -> bool:
    """A `bonsai NAME` module: cli/<name>.py, not a `_helper` and not the app that registers them."""
    parts = module.split(".")
    return len(parts) == 3 and parts[1] == "cli" and not parts[2].startswith("_") and parts[2] != "main"


def import_circles(imports: dict[str, dict[str, int]]) -> list[list[tuple[str, int]]]:
    """Circles as the modules on them, each with the line that imports the next one.

    `imports` maps a module to the modules it imports and the line of each. A depth-first walk
    reports each edge back to a module still on its path (the circle is that stretch of the
    path): at least one circle for every set of modules that import each other in a ring.
    """
    circles: list[list[tuple[str, int]]] = []
    seen_circles: set[frozenset[str]] = set()
    done: set[str] = set()

    def walk(module: str, path: list[tuple[str, int]], on_path: dict[str, int]) -> None:
        for other, line in sorted(imports.get(module, {}).items()):
            if other == module or other not in imports:
                continue
            if other in on_path:
                circle = path[on_path[other] :] + [(module, line)]
                if frozenset(m for m, _ in circle) not in seen_circles:
                    seen_circles.add(frozenset(m for m, _ in circle))
                    circles.append(circle)
            elif other not in done:
                on_path[other] = len(path) + 1
                walk(other, [*path, (module, line)], on_path)
                del on_path[other]
        done.add(module)

    for start in sorted(imports):
        if start not in done:
            walk(start, [], {start: 0})
    return circles


def layering_problems(package: Path = PACKAGE) -> list[str]:
    files = sorted(package.rglob("*.py"))
    known = {module_name(p, package) for p in files}
    order = {w: i for i, w in enumerate(WINGS)}
    problems = []
    graph: dict[str, dict[str, int]] = {module_name(p, package): {} for p in files}
    for path in files:
        me, rel = module_name(path, package), path.relative_to(package).as_posix()
        mine = wing_of(me)
        if mine is None:
            problems.append(f"{rel}: in no wing (move it into one of {', '.join(WINGS)})")
            continue
        for line, other in imported_modules(path, known, package):
            graph[me].setdefault(other, line)
            theirs = wing_of(other)
            where = f"{rel}:{line} imports {other}"
            if theirs is None:
                continue  # reported once, as the module in no wing
            if order[theirs] > order[mine]:
                problems.append(f"{where}: {theirs} is above {mine}")
            if theirs == "cli" and mine != "cli" and me != "bonsai_launch.__main__":
                problems.append(f"{where}: only cli/ imports cli/")
            if is_command(me) and is_command(other) and other != me:
                problems.append(f"{where}: a command never imports another command (share through cli/_*.py)")
            if me.startswith("bonsai_launch.cli._") and is_command(other):
                problems.append(f"{where}: a cli helper never imports a command")
        lines = len(path.read_text().splitlines())
        if lines > MAX_LINES and rel not in LONG_ON_PURPOSE:
            problems.append(f"{rel}: {lines} lines (over {MAX_LINES}: split it along its jobs)")
    for circle in import_circles(graph):
        steps = " -> ".join(f"{m.removeprefix('bonsai_launch.')} (line {line})" for m, line in circle)
        problems.append(
            f"import circle: {steps} -> {circle[0][0].removeprefix('bonsai_launch.')}"
            " (move what both need down into the module it belongs to)"
        )
    return problems


def test_the_package_keeps_its_layers():
    problems = layering_problems()
    assert not problems, "\n".join(problems)


def test_every_wing_opens_with_a_map():
    for wing in WINGS:
        face = PACKAGE / wing / "__init__.py"
        assert face.is_file(), f"{wing}/ is not a package"
        doc = ast.get_docstring(ast.parse(face.read_text())) or ""
        modules = sorted(p.stem for p in face.parent.glob("*.py") if p.stem != "__init__")
        missing = [m for m in modules if m not in doc]
        assert not missing, f"{wing}/__init__.py's docstring does not name {missing}"


def test_the_check_sees_what_it_must(tmp_path):
    """The checker itself can fail: a tree with each kind of mistake is reported for each."""
    pkg = tmp_path / "bonsai_launch"
    for folder in ("core", "server", "cli"):
        (pkg / folder).mkdir(parents=True)
        (pkg / folder / "__init__.py").write_text('"""map"""\n')
    (pkg / "__init__.py").write_text("")
    (pkg / "flat.py").write_text("")
    (pkg / "core" / "low.py").write_text("def f():\n    from bonsai_launch.server import high\n")
    (pkg / "server" / "high.py").write_text("from bonsai_launch.cli._output import console\n")
    (pkg / "cli" / "_output.py").write_text("")
    (pkg / "cli" / "one.py").write_text("def command():\n    from bonsai_launch.cli.two import x\n")
    (pkg / "cli" / "two.py").write_text("x = 1\n" * (MAX_LINES + 1))
    # a circle inside one wing, closed by an import inside a function (the keeper/supervisor shape)
    (pkg / "server" / "keeper.py").write_text("def main():\n    from bonsai_launch.server.supervisor import F\n")
    (pkg / "server" / "supervisor.py").write_text("from bonsai_launch.server import keeper\nF = 1\n")
    text = "\n".join(layering_problems(pkg))
    assert "flat.py: in no wing" in text
    assert "core/low.py:2 imports bonsai_launch.server.high: server is above core" in text
    assert "server/high.py:1 imports bonsai_launch.cli._output: cli is above server" in text
    assert "only cli/ imports cli/" in text
    assert "cli/one.py:2 imports bonsai_launch.cli.two: a command never imports another command" in text
    assert f"cli/two.py: {MAX_LINES + 1} lines" in text
    assert "import circle: server.keeper (line 2) -> server.supervisor (line 1) -> server.keeper" in text


def test_circles_are_found_whatever_the_order():
    """Every ring of modules is reported, however long, and modules outside it are not named."""
    ring = {"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3}, "d": {"a": 4}, "e": {}}
    assert import_circles(ring) == [[("a", 1), ("b", 2), ("c", 3)]]
    assert import_circles({"x": {"y": 1}, "y": {"x": 2, "z": 3}, "z": {}, "w": {"z": 1}}) == [[("x", 1), ("y", 2)]]
    assert import_circles({"a": {"a": 1, "b": 2}, "b": {}}) == []  # a module naming itself is no circle


def test_reading_a_builds_manifest_does_not_import_the_build_machinery():
    """`bonsai start` with a built binary reads its manifest (builds/install.py); the builds face
    names builder.py's functions but imports builder (source, preflight, CMake) only on first
    use, so that start-up does not pay for it. Run in a fresh interpreter: this one has them all."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from bonsai_launch.llamacpp.builds.install import read_manifest\n"
        "assert 'bonsai_launch.llamacpp.builds.builder' not in sys.modules, 'builder imported'\n"
        "from bonsai_launch.llamacpp.builds import ensure_server, find_installed\n"
        "from bonsai_launch.llamacpp.builds import builder, lookup\n"
        "assert ensure_server is builder.ensure_server and find_installed is lookup.find_installed\n"
        "import bonsai_launch.llamacpp.builds as builds\n"
        "try:\n"
        "    builds.no_such_name\n"
        "except AttributeError:\n"
        "    pass\n"
        "else:\n"
        "    raise AssertionError('no AttributeError')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
