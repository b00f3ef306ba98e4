"""The house has floors: no import runs back up them and no import circle remains (docs/architecture.md).

A room is a package directory (gpudoctor/host/, gpudoctor/bench/, checks/, remedies/, … — subpackages included) or
a top-level module of gpudoctor/. Every import counts, function-local ones too: a lazy import is for start-up time,
never a way to dodge a circle. The graph of rooms must have no cycle, and neither may the files inside one room.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = {"gpudoctor": "gpudoctor", "checks": "gpudoctor.checks", "remedies": "gpudoctor.remedies"}

# Registries: the engine imports the package (its __init__) so that every member registers itself; the members
# import the engine's decorator. One arrow each way by design, through the package's face only.
REGISTRY_FACES = {("gpudoctor.checkreg", "gpudoctor.checks"): "all_checks() imports the checks so they register",
                  ("gpudoctor.remedy", "gpudoctor.remedies"): "the fix flow loads the remedy registry"}


def modules(root: Path = ROOT) -> dict[str, Path]:
    out = {}
    for top, name in SOURCES.items():
        for p in sorted((root / top).rglob("*.py")):
            if "__pycache__" in p.parts:
                continue
            parts = name.split(".") + list(p.relative_to(root / top).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = p
    return out


def imports(tree: ast.AST, known: set[str], here: str) -> list[tuple[str, int]]:
    """(module of this tree's package, line) for every import of one, wherever it stands."""
    pkg = here.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(pkg.split(".")[: len(pkg.split(".")) - node.level + 1] + ([base] if base else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        for n in names:
            while n and n not in known:
                n = n.rpartition(".")[0]
            if n and n != here:
                found.append((n, node.lineno))
    return found


def room(mod: str, mods: dict[str, Path]) -> str:
    parts = mod.split(".")
    if parts[:2] in (["gpudoctor", "checks"], ["gpudoctor", "remedies"]):
        return ".".join(parts[:2])
    if len(parts) == 2 and mods[mod].name != "__init__.py":
        return mod  # a top-level module is its own room
    return ".".join(parts[:2])


def edges(mods: dict[str, Path]) -> dict[str, list[tuple[str, int]]]:
    known = set(mods)
    return {m: imports(ast.parse(p.read_text(), str(p)), known, m) for m, p in mods.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan)."""
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(set(graph) | {w for ws in graph.values() for w in ws}):
        if v not in index:
            visit(v)
    return out


def problems(root: Path = ROOT) -> list[str]:
    mods = modules(root)
    imp = edges(mods)
    rooms: dict[str, set[str]] = {}
    files: dict[str, set[str]] = {}
    why: dict[tuple[str, str], list[str]] = {}
    for a, targets in imp.items():
        for b, line in targets:
            if (a, b) in REGISTRY_FACES:
                continue
            ra, rb = room(a, mods), room(b, mods)
            key = (ra, rb) if ra != rb else (a, b)
            (rooms if ra != rb else files).setdefault(key[0], set()).add(key[1])
            why.setdefault(key, []).append(f"{mods[a].relative_to(root)}:{line} imports {b}")
    out = []
    for kind, graph in (("rooms", rooms), ("files", files)):
        for comp in cycles(graph):
            ties = [w for x in comp for y in comp if y in graph.get(x, ()) for w in why[(x, y)]]
            out.append(f"a circle of {kind} {comp}: " + "; ".join(ties))
    return out


def test_no_import_runs_back_up_and_no_circle_remains():
    assert problems() == []


def test_the_scan_sees_a_lazy_import_that_closes_a_circle(tmp_path):
    """Positive control: a function-local import from a lower room back up to a higher one is a circle."""
    for top in SOURCES:
        (tmp_path / top).mkdir()
    pkg = tmp_path / "gpudoctor"
    (pkg / "__init__.py").write_text("")
    (pkg / "low").mkdir()
    (pkg / "low" / "__init__.py").write_text("")
    (pkg / "low" / "a.py").write_text("def f():\n    from gpudoctor.high import g\n    return g\n")
    (pkg / "high.py").write_text("from gpudoctor.low.a import f\n\ndef g():\n    return f\n")
    found = problems(tmp_path)
    assert len(found) == 1 and "gpudoctor/low/a.py:2 imports gpudoctor.high" in found[0], found
    (pkg / "low" / "a.py").write_text("def f():\n    return 1\n")
    assert problems(tmp_path) == []


def test_the_scan_sees_a_circle_of_files_in_one_room(tmp_path):
    for top in SOURCES:
        (tmp_path / top).mkdir()
    pkg = tmp_path / "gpudoctor" / "room"
    pkg.mkdir(parents=True)
    (tmp_path / "gpudoctor" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "x.py").write_text("from gpudoctor.room.y import b\n")
    (pkg / "y.py").write_text("from . import x\nb = 1\n")
    found = problems(tmp_path)
    assert len(found) == 1 and found[0].startswith("a circle of files"), found
