"""docs/DESIGN.md's "Where things live" is true to the code: each module or package
imports only what its row allows."""

from __future__ import annotations

import re
from pathlib import Path

from test_import_cycles import ROOT, import_graph, modules

ALWAYS = {"errors", "io", "specials"}      # listed only where they are all a module needs


def unit(module: str) -> str:
    """nmt.search.beam -> search; nmt.checkpoint -> checkpoint; nmt -> nmt."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "nmt"


def design_table() -> dict[str, set[str] | None]:
    text = (ROOT / "docs" / "DESIGN.md").read_text(encoding="utf-8")
    section = text.split("## Where things live", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for m in re.finditer(r"^\| `nmt/([\w_]+)(?:\.py|/)` \| [^|]+ \|\s*([^|]*?)\s*\|$", section, re.M):
        allowed = m.group(2).strip()
        rows[m.group(1)] = None if allowed == "everything above" else {
            a.strip() for a in allowed.split(",") if a.strip()}
    return rows


def test_every_import_is_allowed_by_the_table():
    table = design_table()
    mods = modules()
    graph = import_graph(mods)
    assert "search" in table and "cli" in table and table["cli"] is None   # it was parsed
    wrong = []
    for mod, targets in graph.items():
        src = unit(mod)
        if src == "nmt" or table.get(src, set()) is None:
            continue
        assert src in table, f"{mod}: no row for nmt/{src} in docs/DESIGN.md"
        for t in targets:
            dst = unit(t)
            if dst != src and dst not in ALWAYS | table[src] | {"version"}:
                wrong.append(f"{mod} imports {t}")
    assert wrong == [], "imports the design map does not allow: " + "; ".join(sorted(wrong))


def test_the_map_names_every_module():
    table = design_table()
    names = {unit(m) for m in modules()} - {"nmt"}
    assert names <= set(table), f"missing rows: {sorted(names - set(table))}"
