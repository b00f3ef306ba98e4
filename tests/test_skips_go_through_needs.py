"""Every skip goes through tests/needs.py, so that under CI=true each one is a failure (#35): a raw `pytest.skip`,
`importorskip`, `skip`/`skipif`/`xfail` mark or unittest skip anywhere else in the suite is found here by walking the
syntax tree of every file under tests/."""

from __future__ import annotations

import ast
import os
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


# GPUDOCTOR_CI_ELSEWHERE (#34): a stage that cannot run a lab names it; the lab is skipped with one line even under
# CI=true, a lab not named takes its normal path, and a name that is no lab is a failure.
ELSEWHERE_ENTRIES = {  # each lab's single entry: what a test of that lab calls first
    "systemd-lab": lambda: _fixture_body("tests.systemd.conftest", "sdlab"),
    "lxc-lab": lambda: _fixture_body("tests.e2e.conftest", "lab_parts"),
    "slurm-lab": lambda: __import__("tests.slurmlab", fromlist=["need_lab"]).need_lab(),
    "podman": lambda: _fixture_body("tests.boundary.test_podman_cdi", "engine", tmp_path=None),
    "transformers-lab": lambda: __import__("tests.bench.transformers_lab", fromlist=["x"]).venv_for_tests(),
}


def _fixture_body(module: str, name: str, **kw):
    """Run a fixture function's body up to its first yield (or its return), as pytest does."""
    import importlib
    import inspect

    fn = getattr(importlib.import_module(module), name)
    fn = getattr(fn, "__wrapped__", None) or getattr(fn, "__pytest_wrapped__").obj
    out = fn(**kw)
    return next(out) if inspect.isgenerator(out) else out


def test_every_lab_has_its_entry_here_and_a_reason():
    assert set(ELSEWHERE_ENTRIES) == set(needs.LABS)
    assert all(len(why) > 40 for why in needs.LABS.values())


@pytest.mark.parametrize("lab", sorted(needs.LABS))
def test_a_lab_named_elsewhere_skips_with_its_one_line_even_under_ci(monkeypatch, lab):
    monkeypatch.setenv("CI", "true")
    others = [x for x in needs.LABS if x != lab]
    monkeypatch.setenv(needs.ELSEWHERE_ENV, f"{others[0]}, {lab} {others[1]}")
    with pytest.raises(BaseException) as exc:
        ELSEWHERE_ENTRIES[lab]()
    assert type(exc.value).__name__ == "Skipped"
    line = str(exc.value)
    assert line == (f"GPUDOCTOR_CI_ELSEWHERE: the {lab} runs in CI's main suite on Debian 12 (.ci/run), not in this "
                    f"stage: {needs.LABS[lab]}{needs.MARK}")
    assert "\n" not in line


class _NormalPath(Exception):
    """Raised where a lab's entry goes on past the elsewhere check: its own first step."""


@pytest.mark.parametrize("lab", sorted(needs.LABS))
def test_a_lab_not_named_takes_its_normal_path_under_ci(monkeypatch, lab):
    monkeypatch.setenv("CI", "true")
    monkeypatch.setenv(needs.ELSEWHERE_ENV, " ".join(x for x in needs.LABS if x != lab))
    seen = []

    def first_step(*a, **kw):
        seen.append(a)
        raise _NormalPath()

    # each entry's first step after the elsewhere check, stopped there
    from tests import systemdlab, lxclab
    from tests.bench import transformers_lab

    monkeypatch.setattr(systemdlab, "skip_reason", first_step)
    monkeypatch.setattr(lxclab, "skip_reason", first_step)
    monkeypatch.setattr(needs, "root", first_step)
    monkeypatch.setattr(needs, "need", first_step)
    monkeypatch.setattr(transformers_lab, "venv_ok", first_step)
    with pytest.raises(_NormalPath):
        ELSEWHERE_ENTRIES[lab]()
    assert len(seen) == 1


def test_an_unknown_lab_in_the_variable_is_a_clear_failure(monkeypatch):
    monkeypatch.setenv("CI", "")
    monkeypatch.setenv(needs.ELSEWHERE_ENV, "systemd-lab,no-such-lab")
    with pytest.raises(BaseException) as exc:
        needs.elsewhere("systemd-lab")
    assert type(exc.value).__name__ == "Failed"
    assert "GPUDOCTOR_CI_ELSEWHERE names no lab no-such-lab" in str(exc.value)
    assert "systemd-lab" in str(exc.value).split("LABS:")[1]
    with pytest.raises(KeyError):
        needs.elsewhere("no-such-lab")


def test_the_systemd_lab_says_once_why_it_cannot_start_an_install_under_tmp(monkeypatch):
    """An install under /tmp is hidden from the units (PrivateTmp=yes: status=203/EXEC in every test): the lab's one
    line says why, as `gpudoctor daemon --check-install` does, and it goes through needs (a failure under CI=true)."""
    from tests import systemdlab

    if os.geteuid() != 0:
        needs.unavailable("the systemd lab's skip reason is judged as root")
    monkeypatch.setattr(systemdlab, "_install_roots", lambda: ["/tmp/gpudoctor-venv"])
    line = systemdlab.skip_reason()
    assert line == ("the systemd lab: /tmp/gpudoctor-venv lies under /tmp, which the systemd units hide "
                    "(PrivateTmp=yes): they cannot start it (status=203/EXEC); install gpudoctor elsewhere "
                    "(./install.sh as root: /opt/gpudoctor)")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(BaseException) as exc:
        needs.unavailable(line)
    assert type(exc.value).__name__ == "Failed"
