"""Every skip goes through tests/needs.py, so that under CI=true each one is a failure (#35): a raw `pytest.skip`,
`importorskip`, `skip`/`skipif`/`xfail` mark or unittest skip anywhere else in the suite is found here by walking the
syntax tree of every file under tests/."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests import needs

TESTS = Path(__file__).resolve().parent
NEEDS = TESTS / "needs.py"
FORBIDDEN = {"skip", "skipif", "importorskip", "xfail", "skipTest", "skipIf", "skipUnless", "expectedFailure",
             "SkipTest", "Skipped"}


def raw_skips(source: str, name: str = "<test>") -> list[str]:
    """`file:line: what` for every skip that does not go through tests/needs.py."""
    found = []
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, ast.Attribute) and node.attr in FORBIDDEN:
            found.append(f"{name}:{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.ImportFrom) and node.module in ("pytest", "unittest", "_pytest.outcomes"):
            found += [f"{name}:{node.lineno}: from {node.module} import {a.name}" for a in node.names
                      if a.name in FORBIDDEN]
        elif isinstance(node, ast.Name) and node.id in ("SkipTest", "Skipped"):
            found.append(f"{name}:{node.lineno}: {node.id}")
    return found


def test_no_skip_outside_needs():
    files = sorted(p for p in TESTS.rglob("*.py") if p != NEEDS and "__pycache__" not in p.parts)
    assert len(files) > 100  # the walk really reads the suite
    bad = [hit for p in files for hit in raw_skips(p.read_text(), str(p.relative_to(TESTS.parent)))]
    assert bad == [], "skip through tests/needs.py (a failure under CI=true):\n" + "\n".join(bad)


@pytest.mark.parametrize("line", [
    "pytest.skip('x')", "pytest.importorskip('openai')", "@pytest.mark.skipif(True, reason='x')\ndef f(): pass",
    "pytestmark = pytest.mark.skip", "@pytest.mark.xfail\ndef f(): pass", "from pytest import importorskip",
    "import unittest\n@unittest.skipIf(1, 'x')\ndef f(): pass", "raise unittest.SkipTest('x')",
])
def test_the_walk_finds_each_form_of_raw_skip(line):
    assert raw_skips(line) != []


def test_the_walk_passes_the_needs_forms():
    assert raw_skips("needs.root()\nneeds.need('sshd')\nneeds.module('openai', 'x')\nskipped = 1\n") == []


@pytest.mark.parametrize("ci,outcome", [("", "Skipped"), ("true", "Failed")])  # pytest's outcome exceptions
def test_a_missing_test_extra_skips_with_one_line_and_fails_under_ci(monkeypatch, ci, outcome):
    monkeypatch.setenv("CI", ci)
    with pytest.raises(BaseException) as exc:
        needs.module("gpudoctor_no_such_package_35", "for this test")
    assert type(exc.value).__name__ == outcome
    assert "the Python package gpudoctor_no_such_package_35 is not installed" in str(exc.value)
    assert needs.module("json", "stdlib").dumps([]) == "[]"


@pytest.mark.parametrize("ci,outcome", [("", "Skipped"), ("true", "Failed")])  # pytest's outcome exceptions
def test_what_this_machine_cannot_show_skips_and_fails_under_ci(monkeypatch, ci, outcome):
    monkeypatch.setenv("CI", ci)
    with pytest.raises(BaseException) as exc:
        needs.unavailable("a condition this machine lacks")
    assert type(exc.value).__name__ == outcome and "a condition this machine lacks" in str(exc.value)
