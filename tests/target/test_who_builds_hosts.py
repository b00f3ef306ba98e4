"""Acceptance: every consumer's target comes from gpudoctor/target.py — no other product module builds a Host — and
nothing in gpudoctor/host/ imports anything above it (only gpudoctor.host.*, gpudoctor.errors, gpudoctor.log)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = [ROOT / "gpudoctor", ROOT / "checks", ROOT / "remedies"]
HOST_CLASSES = {"LocalHost", "SSHHost", "ReplayHost"}
BUILDERS = {"host_for"}  # target.py's own builder, for entries that are not targets (inventory ping)


def product_files():
    for base in PRODUCT:
        yield from sorted(p for p in base.rglob("*.py") if "__pycache__" not in p.parts)


def calls(tree, names):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if name in names:
                yield node.lineno, name


def test_only_target_py_builds_hosts():
    offenders = []
    for p in product_files():
        rel = p.relative_to(ROOT).as_posix()
        if rel.startswith("gpudoctor/host/") or rel == "gpudoctor/target.py":
            continue
        tree = ast.parse(p.read_text(), rel)
        offenders += [f"{rel}:{line}: {name}(...)" for line, name in calls(tree, HOST_CLASSES)]
    assert offenders == [], "build hosts through gpudoctor.target (open_target, local_host):\n" + "\n".join(offenders)


def test_host_for_is_called_only_where_an_inventory_entry_is_not_a_target():
    users = []
    for p in product_files():
        rel = p.relative_to(ROOT).as_posix()
        if rel != "gpudoctor/target.py":
            users += [rel for _ in calls(ast.parse(p.read_text(), rel), BUILDERS)]
    assert sorted(set(users)) == ["gpudoctor/commands/inventory.py"]  # `inventory ping` reaches every entry


def test_the_scan_sees_a_host_built_elsewhere(tmp_path):
    tree = ast.parse("from gpudoctor.host.local import LocalHost\nh = LocalHost(name='x')\n")
    assert list(calls(tree, HOST_CLASSES)) == [(2, "LocalHost")]


def test_nothing_in_host_imports_above_it():
    # atomic, cuda_probe (the cuInit probe's text, which host/early.py starts before anything else): stdlib only
    allowed = ("gpudoctor.host", "gpudoctor.errors", "gpudoctor.log", "gpudoctor.files.atomic", "gpudoctor.cuda_probe")
    bad = []
    for p in sorted((ROOT / "gpudoctor" / "host").glob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            mods = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                mods = [node.module]
            elif isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            bad += [f"{p.name}:{node.lineno}: {m}" for m in mods
                    if m.startswith("gpudoctor") and not m.startswith(allowed)]
    assert bad == []


def test_no_second_way_to_open_a_target():
    """The removed copies stay removed: a function that opens a target outside target.py only delegates to it."""
    names = {"open_target", "open_check_target", "build_target", "_open_target", "open_campaign_target",
             "open_host", "proxmox_for", "connect_all", "_target", "_remote"}
    copies = []
    for p in product_files():
        rel = p.relative_to(ROOT).as_posix()
        if rel == "gpudoctor/target.py":
            continue
        for node in ast.walk(ast.parse(p.read_text(), rel)):
            if isinstance(node, ast.FunctionDef) and node.name in names:
                if not list(calls(node, {"open_target"})):
                    copies.append(f"{rel}:{node.lineno}: {node.name}")
    assert copies == []
