"""The layer table of docs/ARCHITECTURE.md, held against every module's imports.

Reads the table under "## Layering" (layer number, backticked package names) and every
module under src/recallspec/ (imports at the top, inside functions and under
``TYPE_CHECKING``: each is a dependency a reader must follow) and fails on
- an import of a package on the same or a higher row (upward or sideways),
- an import circle between modules (a strongly connected component of two or more),
- a top-level package or module that the table does not name,
- an import of a library that one package wraps (``OWNED``) from any other.
Strings handed to ``importlib`` (the drafter registry, the CLI's command list) are not
imports: they are the lazy, by-name references the layering allows.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "src" / "recallspec"
ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"
EXTENSIONS = {"recallspec._core", "recallspec._kernels"}  # C++: no imports of ours


def layer_table() -> dict[str, int]:
    """Top-level name -> layer, from the Markdown table of the Layering section."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    section = text.split("## Layering", 1)[1].split("\n## ", 1)[0]
    layers: dict[str, int] = {}
    for line in section.splitlines():
        m = re.match(r"\|\s*(\d+)\s*\|([^|]*)\|", line)
        if m:
            for name in re.findall(r"`([^`]+)`", m.group(2)):
                layers[name.strip("/").removesuffix(".py")] = int(m.group(1))
    return layers


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _resolve(name: str, mods: dict[str, Path]) -> str | None:
    """The module an imported name lives in (a name imported from a module, the module)."""
    if name in EXTENSIONS:
        return name
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(mod: str, path: Path, mods: dict[str, Path]) -> Iterator[tuple[str, int]]:
    """(imported module of ours, line) for every import statement in the file."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                src = ".".join(base + ([node.module] if node.module else []))
            else:
                src = node.module or ""
            subs = [f"{src}.{a.name}" for a in node.names]
            names = subs if all(s in mods or s in EXTENSIONS for s in subs) else [src]
        for n in names:
            if n == "recallspec" or n.startswith("recallspec."):
                r = _resolve(n, mods)
                if r is not None and r != mod:
                    yield r, node.lineno


def top(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else "recallspec"


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {m: {d for d, _ in imports_of(m, p, mods)} for m, p in mods.items()}


def test_every_package_has_a_row() -> None:
    layers = layer_table()
    assert layers, "no layer table found under '## Layering' in docs/ARCHITECTURE.md"
    missing = sorted({top(m) for m in modules()} - set(layers))
    assert not missing, f"packages missing from the layer table: {missing}"


def test_no_upward_or_sideways_import() -> None:
    layers = layer_table()
    mods = modules()
    bad = []
    for m, path in mods.items():
        for dep, line in imports_of(m, path, mods):
            a, b = top(m), top(dep)
            if a != b and layers.get(b, -1) >= layers.get(a, -1):
                bad.append(f"{path.relative_to(ROOT)}:{line}: {m} (layer {layers.get(a)}) "
                           f"imports {dep} (layer {layers.get(b)})")
    assert not bad, "imports against the layer table:\n" + "\n".join(bad)


# Third-party packages that one package of ours wraps: no other module imports them.
OWNED = {"llguidance": "grammar"}


def test_wrapped_libraries_are_imported_by_their_package_only() -> None:
    bad = []
    for m, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                     else [])
            for n in names:
                owner = OWNED.get(n.split(".")[0])
                if owner is not None and top(m) != owner:
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {m} imports {n} "
                               f"(only {owner} may)")
    assert not bad, "\n".join(bad)


def strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components of two or more nodes (iterative: no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on_stack.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_no_import_circle() -> None:
    circles = strongly_connected(graph())
    assert not circles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in circles)


@pytest.mark.parametrize(("edges", "circles"), [
    ({"a": {"b"}, "b": {"a"}, "c": set()}, [["a", "b"]]),
    ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
])
def test_circle_finder_finds_circles(edges: dict[str, set[str]],
                                     circles: list[list[str]]) -> None:
    """The finder itself (so that an empty answer above means no circle, not a bug)."""
    assert strongly_connected(edges) == circles
