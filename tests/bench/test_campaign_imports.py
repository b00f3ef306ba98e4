"""The campaign modules import one way (#47.7): heal ← file ← runner ← slurm, every import among them at the top of the
module — no circle, and no function-local import dodging one (docs/architecture.md)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.bench.conftest import REPO

PKG = "gpudoctor.campaign"
DIR = REPO / "gpudoctor" / "campaign"


def imports(path: Path) -> list[tuple[str, bool]]:
    """(module of PKG imported, at the top level?) for every import of a sibling campaign module."""
    tree = ast.parse(path.read_text())
    top = {id(n) for n in tree.body}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PKG + "."):
            out.append((node.module[len(PKG) + 1:].split(".")[0], id(node) in top))
        elif isinstance(node, ast.ImportFrom) and node.module == PKG:
            out += [(a.name, id(node) in top) for a in node.names]
        elif isinstance(node, ast.Import):
            out += [(a.name[len(PKG) + 1:].split(".")[0], id(node) in top) for a in node.names
                    if a.name.startswith(PKG + ".")]
    return out


def test_campaign_modules_import_one_way_at_the_top():
    graph = {}
    for path in sorted(DIR.glob("*.py")):
        if path.name == "__init__.py":
            continue
        found = imports(path)
        local = [m for m, at_top in found if not at_top]
        assert not local, f"{path.name} imports {local} inside a function"
        graph[path.stem] = {m for m, _ in found}
    assert {"file", "runner", "slurm", "heal"} <= set(graph)

    def reach(start, seen):
        for nxt in graph.get(start, ()):
            if nxt not in seen:
                seen.add(nxt)
                reach(nxt, seen)
        return seen

    circles = [m for m in graph if m in reach(m, set())]
    assert not circles, f"import circle through {circles}: {graph}"
