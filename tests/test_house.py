"""Module boundaries: no import cycle between modules, no module taking another module's ``_private`` name.

A newcomer reads a module knowing that what it imports sits below it: what two modules share is public in the lower
one, with a docstring that states its contract. Every import counts, also one inside a function or under
``TYPE_CHECKING``: a lazy import hides a cycle from the interpreter, not from a reader. A package ``__init__.py``
only re-exports, so a path through one is not a cycle.

The rule (the same as the before-stop hook's): ``from X import Y`` is an edge to module ``X.Y`` when that is a
module, else to ``X``; ``import a.b.c`` is an edge to the longest of ``a.b.c``, ``a.b``, ``a`` that is a module. A
module ``m`` (not an ``__init__``) is on a cycle when it is reachable from itself along edges that do not pass
through an ``__init__`` module. ``from X import _name`` (one leading underscore, not a dunder; ``_name`` not a
submodule) is a private import when ``X`` is another module of the tree.
"""

from __future__ import annotations

import ast
import functools
from collections import deque
from pathlib import Path

import commsched

SRC = Path(commsched.__file__).resolve().parents[1]


def modules_of(root: Path) -> dict[str, Path]:
    """Every module under ``root`` (the folder holding the top-level packages), by dotted name; a package by its
    ``__init__.py``."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        out[".".join(parts[:-1] if path.name == "__init__.py" else parts)] = path
    return out


def import_graph(root: Path) -> tuple[dict[str, set[str]], list[str], set[str]]:
    """(edges: module -> modules it imports, private imports as ``"m takes _name from X"`` lines, the ``__init__``
    modules) of the tree under ``root``, by the rule in the module docstring."""
    mods = modules_of(root)
    edges: dict[str, set[str]] = {m: set() for m in mods}
    private: list[str] = []
    for m, path in mods.items():
        pkg = m if path.name == "__init__.py" else m.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    parts = alias.name.split(".")
                    target = next((t for k in range(len(parts), 0, -1) if (t := ".".join(parts[:k])) in mods), None)
                    if target is not None and target != m:
                        edges[m].add(target)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([node.module] if node.module else []))
                for alias in node.names:
                    target = f"{base}.{alias.name}" if f"{base}.{alias.name}" in mods else base
                    if target not in mods or target == m:
                        continue
                    edges[m].add(target)
                    name = alias.name
                    if name.startswith("_") and not name.startswith("__") and target == base:
                        private.append(f"{m} takes {name} from {base}")
    inits = {m for m, path in mods.items() if path.name == "__init__.py"}
    return edges, private, inits


def cycles(edges: dict[str, set[str]], inits: set[str]) -> list[list[str]]:
    """One shortest cycle (``[m, ..., m]``) through each module that is on one, not passing through ``inits``;
    each cycle once, sorted."""
    found: dict[frozenset[str], list[str]] = {}
    for start in sorted(edges):
        if start in inits:
            continue
        back: dict[str, str] = {}
        todo = deque([start])
        while todo:
            m = todo.popleft()
            nxt = [t for t in sorted(edges.get(m, ())) if t not in inits]
            if start in nxt:
                path = [start]
                while m != start:
                    path.append(m)
                    m = back[m]
                path = [start, *reversed(path[1:]), start]
                found.setdefault(frozenset(path), path)
                break
            for t in nxt:
                if t not in back:
                    back[t] = m
                    todo.append(t)
    return sorted(found.values())


def house_problems(root: Path) -> tuple[list[str], list[str]]:
    """(the import cycles as ``"a -> b -> a"`` lines, the private imports) of the tree under ``root``."""
    edges, private, inits = import_graph(root)
    return [" -> ".join(c) for c in cycles(edges, inits)], sorted(set(private))


@functools.cache
def src_problems() -> tuple[list[str], list[str]]:
    return house_problems(SRC)


def test_no_import_cycle_between_modules():
    cyc = src_problems()[0]
    assert not cyc, "import cycles (move what both modules need into the lower one):\n" + "\n".join(cyc)


def test_no_module_takes_another_modules_private_name():
    private = src_problems()[1]
    assert not private, "private names taken across modules (make them public where they live):\n" + "\n".join(private)


def test_the_check_finds_cycles_and_private_imports(tmp_path):
    """On a tiny package: a lazy relative import closing a cycle, an ``import a.b`` cycle and a private import are
    found; a cycle through a package ``__init__`` (a re-export) and a dunder import are not."""
    files = {
        "pkg/__init__.py": "from pkg.a import thing\n__version__ = '1'\n",
        "pkg/a.py": "from pkg.b import helper\n\ndef thing():\n    return helper()\n\n_hidden = 1\n",
        "pkg/b.py": "def helper():\n    from . import a\n    return a\n",
        "pkg/c.py": "from pkg.a import _hidden\nfrom pkg import __version__\n",
        "pkg/d.py": "import pkg.e\n",
        "pkg/e.py": "import pkg.d\nimport os.path\n",
        "pkg/sub/__init__.py": "from pkg.sub.x import X\n",
        "pkg/sub/x.py": "from pkg.sub import X as _X\n\nX = 1\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    cyc, private = house_problems(tmp_path)
    assert cyc == ["pkg.a -> pkg.b -> pkg.a", "pkg.d -> pkg.e -> pkg.d"]
    assert private == ["pkg.c takes _hidden from pkg.a"]
