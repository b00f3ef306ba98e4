"""The check↔remedy link is declared once — `@check(remedy=ID)` — and the registries agree with each other and with
what the remedies plan on real captured snapshots."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from gpudoctor import remedies
from gpudoctor.checkreg import all_checks
from gpudoctor.remedy import Engine, RemedyContext

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOTS = sorted((ROOT / "tests" / "fixtures" / "snapshots").glob("*.json"))


def test_every_declared_remedy_exists_and_every_remedy_is_declared():
    declared = {c.remedy for c in all_checks() if c.remedy}
    assert declared - set(remedies.REMEDIES) == set()
    assert set(remedies.REMEDIES) - declared == set(), "a remedy no check names can never be offered"
    for rid in remedies.REMEDIES:
        r = remedies.get(rid)
        assert r.id == rid and r.fixes and all(c.remedy == rid for c in all_checks() if c.id in r.fixes)


def test_findings_never_name_a_remedy_themselves():
    """Only the registration names the remedy; a finding may only decline it (remediable=False)."""
    offenders = []
    for base in (ROOT / "checks", ROOT / "gpudoctor" / "proxmox", ROOT / "gpudoctor" / "gather"):
        for p in sorted(base.rglob("*.py")):
            for node in ast.walk(ast.parse(p.read_text())):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Finding":
                    offenders += [f"{p.relative_to(ROOT)}:{node.lineno}" for k in node.keywords if k.arg == "remedy"]
                if isinstance(node, ast.Assign) and any(isinstance(t, ast.Attribute) and t.attr == "remedy"
                                                        for t in node.targets):
                    offenders.append(f"{p.relative_to(ROOT)}:{node.lineno} (assigns .remedy)")
    assert offenders == []


@pytest.mark.parametrize("snap", SNAPSHOTS, ids=lambda p: p.stem)
def test_on_real_snapshots_findings_and_plans_agree_with_the_registry(snap):
    from gpudoctor.diagnose import diagnose
    from gpudoctor.snapshot import load
    from gpudoctor.target import snapshot_facts

    facts = snapshot_facts(load(str(snap)))
    d = diagnose(facts)
    spec = {c.id: c for c in all_checks()}
    for f in d.findings:
        assert f.remedy in (None, spec[f.id].remedy), f.key
        if f.remedy is None and f.bad and f.remediable:
            assert spec[f.id].remedy is None, f.key
    plan = Engine(remedies.all_remedies(), RemedyContext()).plan(facts)
    for c in plan.changes:
        for key in c.fixes:
            assert spec[key.split("[", 1)[0]].remedy == c.remedy, (c.remedy, key)
