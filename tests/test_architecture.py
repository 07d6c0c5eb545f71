"""docs/architecture.md stays true: the imports between rooms are the ones its table allows.

The room table (section "The rooms") lists, for every room of the ``aisim``
package, the rooms it may import.  This test reads every module's imports
(module level and inside functions), maps each to its room and fails on an
import the table does not allow, on a module outside every room, and on a
room table with a circle.  The core table must name every file of ``ext/``.
"""

import ast
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "architecture.md")


def _section(title):
    with open(DOC, encoding="utf-8") as fh:
        text = fh.read()
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def _rows(section):
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) >= 2:
            yield cells


def _rooms():
    rooms = {}
    for cells in _rows(_section("The rooms")):
        name = cells[0].strip("`")
        allowed = cells[2]
        rooms[name] = "*" if allowed == "every room" else set(re.findall(r"`([\w.]+)`", allowed))
    return rooms


def _room_of(module, rooms):
    parts = module.split(".")
    if parts[0] != "aisim":
        return None
    name = ".".join(parts[:2])
    return name if name in rooms else ("aisim" if len(parts) == 1 else name)


def _modules():
    pkg = os.path.join(ROOT, "aisim")
    for dirpath, _, files in os.walk(pkg):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                yield rel.removesuffix(".__init__"), path
    # The SQL loader lives in the top-level sql/ directory, installed as aisim.sql.
    yield "aisim.sql", os.path.join(ROOT, "sql", "__init__.py")


def _imports(path, module):
    with open(path, encoding="utf-8") as fh:
        tree = ast.parse(fh.read())
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
            for a in node.names:
                # `from aisim import sql` imports the module aisim.sql.
                yield (f"{base}.{a.name}" if base == "aisim" else base), node.lineno


def test_every_module_lives_in_a_room():
    rooms = _rooms()
    missing = sorted({_room_of(m, rooms) for m, _ in _modules()} - set(rooms))
    assert not missing, f"rooms missing from docs/architecture.md: {missing}"


def test_imports_follow_the_room_table():
    rooms = _rooms()
    wrong = []
    for module, path in _modules():
        src = _room_of(module, rooms)
        for target, line in _imports(path, module):
            dst = _room_of(target, rooms)
            # The package's version is a constant every room may read.
            if dst is None or dst == src or rooms[src] == "*" or target == "aisim.__version__":
                continue
            if dst not in rooms[src]:
                wrong.append(f"{os.path.relpath(path, ROOT)}:{line} ({src}) imports {target} ({dst})")
    assert not wrong, "imports the room table does not allow:\n" + "\n".join(wrong)


def test_the_room_table_has_no_circle():
    rooms = _rooms()
    graph = {r: (set(rooms) - {r} if a == "*" else set(a)) for r, a in rooms.items()}
    # `aisim` (the package) re-exports replay lazily; every other edge points up the table.
    graph["aisim"] = set()
    graph = {r: {d for d in deps if d != "aisim.cli"} if r != "aisim.cli" else deps for r, deps in graph.items()}
    state = {}

    def visit(r, trail):
        if state.get(r) == 1:
            raise AssertionError("circle: " + " -> ".join(trail + [r]))
        if state.get(r) == 2:
            return
        state[r] = 1
        for d in sorted(graph[r]):
            visit(d, trail + [r])
        state[r] = 2

    for r in sorted(graph):
        visit(r, [])


def test_the_core_table_names_every_file_of_ext():
    named = set()
    for cells in _rows(_section("The compiled core")):
        named.update(re.findall(r"`(\w+)(?:\.px[di])?`", cells[0]))
    files = {f.split(".")[0] for f in os.listdir(os.path.join(ROOT, "ext")) if f.endswith((".pyx", ".pxd", ".pxi"))}
    assert files == named, f"ext/ files not in the table: {sorted(files - named)}; gone: {sorted(named - files)}"
