"""No import cycles inside nmt/: every `import` and `from ... import` of an nmt
module, at module level or deferred inside a function, is an edge; the graph must be acyclic.

A deferred import hides a cycle from Python but not from a reader: two modules that need each
other are one concern split in two, or a concern in the wrong place.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def modules() -> dict[str, Path]:
    out = {}
    for f in (ROOT / "nmt").rglob("*.py"):
        parts = list(f.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


def import_graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    def resolve(name: str) -> str | None:
        while name and name not in mods:        # nmt.a.b.Name -> nmt.a.b
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        package = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package[:len(package) - node.level + 1] + [base]).strip(".")
                targets = [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for t in targets:
                target = resolve(t) if t.split(".")[0] == "nmt" else None
                if target and target != mod:
                    graph[mod].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_the_finder_sees_a_deferred_cycle():
    graph = {"nmt.a": {"nmt.b"}, "nmt.b": {"nmt.c"}, "nmt.c": {"nmt.a"}, "nmt.d": {"nmt.a"}}
    assert cycles(graph) == [["nmt.a", "nmt.b", "nmt.c"]]
    mods = modules()
    graph = import_graph(mods)
    # real edges are found, deferred ones included (nmt.checkpoint builds the model late)
    assert "nmt.models.transformer" in graph["nmt.checkpoint"]
    assert "nmt.search.config" in graph["nmt.search.sampling"]


def test_no_import_cycles_inside_nmt():
    found = cycles(import_graph(modules()))
    assert found == [], "import cycles: " + "; ".join(" <-> ".join(c) for c in found)
