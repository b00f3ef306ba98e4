"""Nothing a user reads cites this project's issue numbers ("#47", "issue 47"): every command's help (hidden ones
too), every check's `--explain` text, `checks --markdown`, the manual page, the files shipped in the package
(gpudoctor/data, any doc), the package's description (README.md, which pip and PyPI show from its METADATA) and
every message string in its code (a string that is not a docstring). Issue numbers
belong in commit messages and docs/testing.md (#49). An upstream reference ("sglang#4693") names its project and is
not one of ours."""

from __future__ import annotations

import ast
import importlib.metadata
import re
from pathlib import Path

import click
from click.testing import CliRunner

import gpudoctor
import gpudoctor.checks
import gpudoctor.remedies
from gpudoctor.checkreg import all_checks
from gpudoctor.cli import cli as root

OURS = re.compile(r"(?<![\w/&])#\d+\b|\bissues? #?\d+\b", re.IGNORECASE)
ROOTS = sorted({Path(p) for m in (gpudoctor, gpudoctor.checks, gpudoctor.remedies) for p in m.__path__})


def _cited(text: str) -> list[str]:
    return OURS.findall(text)


def _leaves(group: click.Group, prefix=()):
    for name in group.list_commands(click.Context(group)):
        cmd = group.get_command(click.Context(group), name)
        yield (*prefix, name), cmd
        if isinstance(cmd, click.Group):
            yield from _leaves(cmd, (*prefix, name))


def test_the_pattern_finds_ours_and_leaves_upstreams_alone():
    assert _cited("stale since the driver update (#47)") == ["#47"] and _cited("see issue 31") == ["issue 31"]
    assert _cited("sglang#4693, NVIDIA/libnvidia-container#1227, &#39; #!/bin/sh, #ff0000") == []


def test_no_help_cites_an_issue_number():
    bad = {}
    for path, _ in [((), root), *_leaves(root)]:
        r = CliRunner().invoke(root, [*path, "--help"], catch_exceptions=False)
        assert r.exit_code == 0, (path, r.output)
        if _cited(r.output):
            bad[" ".join(path) or "gpudoctor"] = _cited(r.output)
    man = CliRunner().invoke(root, ["manpage"], catch_exceptions=False).output
    assert len(man) > 10000 and not _cited(man), _cited(man)
    assert bad == {}


def test_no_check_explanation_cites_an_issue_number():
    bad = {c.id: _cited(f"{c.summary}\n{c.doc}") for c in all_checks() if _cited(f"{c.summary}\n{c.doc}")}
    assert len(list(all_checks())) > 50 and bad == {}
    md = CliRunner().invoke(root, ["checks", "--markdown"], catch_exceptions=False).output
    assert not _cited(md), _cited(md)


def test_no_shipped_file_or_message_cites_an_issue_number():
    bad, strings = [], 0
    for base in ROOTS:
        for p in sorted(base.rglob("*")):
            if not p.is_file() or "__pycache__" in p.parts or p.suffix == ".pyc":
                continue
            if p.suffix != ".py":  # data, docs shipped in the package
                bad += [f"{p}:{n}: {ln.strip()[:80]}" for n, ln in enumerate(p.read_text(errors="replace")
                                                                             .splitlines(), 1) if _cited(ln)]
                continue
            tree = ast.parse(p.read_text(), str(p))
            docs = {id(n.body[0].value) for n in ast.walk(tree)
                    if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
                    and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
            for n in ast.walk(tree):
                if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs:
                    strings += 1
                    if _cited(n.value):
                        bad.append(f"{p}:{n.lineno}: {n.value[:80]!r}")
    assert strings > 5000 and bad == []  # the walk really reads the package's messages


def test_the_installed_description_cites_no_issue_number():
    """README.md is the distribution's long description: `pip show -v`, PyPI and every installed copy carry it."""
    # the distribution beside the gpudoctor these tests import (not a stale gpudoctor.egg-info in the cwd, which an
    # old editable install of the checkout leaves and importlib.metadata would find first)
    site = str(Path(gpudoctor.__file__).resolve().parent.parent)
    meta = next(importlib.metadata.distributions(name="gpudoctor", path=[site])).metadata
    desc = meta.get_payload() or meta.get("Description") or ""
    assert "gpudoctor" in desc and len(desc) > 2000  # the README itself, not an empty field
    cited = [ln.strip()[:80] for ln in desc.splitlines() if _cited(ln)]
    assert cited == []
