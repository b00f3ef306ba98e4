"""Product output cites measurements (GPU, date, method), never our issue tracker, which users cannot see (#33): the
data files and every string the code can print, and the floor lines a real deep replay prints."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

from gpudoctor.catalog.deep_limits import table

REPO = Path(__file__).resolve().parents[2]
TRACKER = re.compile(r"(?i)\bissue\s*#\s*\d+|\(#\d+(,\s*#\d+)*\)")
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")


def product_strings():
    """(where, text) for every data file line and every string constant in gpudoctor/, checks/, remedies/ but module
    docstrings (a module's docstring is for its readers; a function's is click's --help)."""
    for p in sorted((REPO / "gpudoctor" / "data").rglob("*")):
        if p.is_file():
            for no, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
                yield f"{p.relative_to(REPO)}:{no}", line
    for root in ("gpudoctor", "checks", "remedies"):
        for p in sorted((REPO / root).rglob("*.py")):
            tree = ast.parse(p.read_text())
            skip = {id(tree.body[0].value)} if tree.body and isinstance(tree.body[0], ast.Expr) else set()
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
                    yield f"{p.relative_to(REPO)}:{node.lineno}", node.value


def test_no_product_string_cites_the_tracker():
    found = [f"{where}: {TRACKER.search(text).group(0)}" for where, text in product_strings() if TRACKER.search(text)]
    assert found == []


def test_every_measured_floor_names_its_gpu_date_and_method():
    t = table()
    floors = [("default", k, f) for k, f in t["floors_default"].items()]
    floors += [(s["sku"], k, f) for s in t["skus"] for k, f in (s.get("floors") or {}).items()]
    measured = [(sku, k, f["source"]) for sku, k, f in floors if f["source"].startswith("measured")]
    assert len(measured) >= 4
    for sku, kind, src in measured:
        assert DATE.search(src) and "NVIDIA" in src and "median of" in src and " of " in src, (sku, kind, src)
    for sku, kind, f in floors:
        assert f["source"].startswith(("measured", "assumed")), (sku, kind, f["source"])


def test_a_deep_replay_prints_floor_sources_without_the_tracker(tmp_path):
    from gpudoctor import snapshot
    from gpudoctor.diagnose import diagnose
    from gpudoctor.target import snapshot_facts

    from . import deep_captures as dc

    path = dc.write(dc.build(dc.healthy_child()), tmp_path / "deep.json")  # replayed as check --snapshot does
    d = diagnose(snapshot_facts(snapshot.load(str(path))))
    lines = [e for f in d.findings if f.id == "fabric.deep.figure" for e in f.evidence if e.startswith("floor ")]
    assert lines, [f.id for f in d.findings]
    for line in lines:
        assert not TRACKER.search(line), line
        assert DATE.search(line) or "assumed" in line, line
    assert not TRACKER.search(json.dumps([f.__dict__ for f in d.findings], default=str))
