"""Shared by the fleet tests: hosts replayed from the real H200 snapshots."""

from __future__ import annotations

from pathlib import Path

from gpudoctor.diagnose import diagnose
from gpudoctor.snapshot import load
from gpudoctor.target import snapshot_facts

SNAPS = Path(__file__).resolve().parents[1] / "fixtures" / "snapshots"
DOCS = {p.stem: load(str(p)) for p in sorted(SNAPS.glob("*.json"))}


def replay_check(name: str):
    """A host named after its snapshot: gather through the replay backend and diagnose."""
    return diagnose(snapshot_facts(DOCS[name.split("#")[0]]))
