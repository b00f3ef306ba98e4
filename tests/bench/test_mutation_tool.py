"""bench/mutation.py follows the children (#48 item 6): a test's `python -I` child, started with a minimal
environment as host/childpy.py starts them, imports the worker's mutated tree and is traced."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _tool():
    spec = importlib.util.spec_from_file_location("gpudoctor_mutation_tool", ROOT / "bench" / "mutation.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


CHILD_TEST = '''
import subprocess, sys


def test_child():
    subprocess.run([sys.executable, "-I", "-c", "from gpudoctor.host import childpy; childpy.child_env({})"],
                   check=True, env={"PATH": "/usr/bin:/bin"})
'''


def test_an_isolated_child_imports_the_mutant_and_is_traced(tmp_path):
    mut = _tool()
    w = mut.Worker(tmp_path / "w", 0, sys.executable)
    rel = "gpudoctor/host/childpy.py"
    where = subprocess.run([w.python, "-I", "-c", "import gpudoctor.host.childpy as c; print(c.__file__)"],
                           env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, check=True).stdout.strip()
    assert where == str(w.installed(rel)), where
    (tmp_path / "test_child.py").write_text(CHILD_TEST)
    trace = tmp_path / "trace"
    rc, _, out = w.pytest([str(tmp_path / "test_child.py")], 120, trace=trace, target=str(w.installed(rel)))
    assert rc == 0, out
    src = (ROOT / rel).read_text().splitlines()
    body = next(i for i, ln in enumerate(src, 1) if ln.startswith("def child_env")) + 3  # a line of its body
    hits = {(t, int(n)) for t, _, n in (ln.rpartition("\t") for ln in trace.read_text().splitlines())}
    assert any(t.endswith("test_child.py::test_child") and n == body for t, n in hits), sorted(hits)[:20]



STRAY_TEST = '''
import os


def test_writes_into_its_cwd():
    with open("stray-m.json", "w") as fh:  # as a mutant that lost its directory fd writes
        fh.write("{}")
    assert os.path.exists("stray-m.json")
'''


def test_a_mutant_writing_into_its_cwd_never_touches_the_checkout(tmp_path):
    """Round 7: a safe.py mutant made model/stage.py write its lock and record relative to the cwd, which was the
    checkout. The tests now run in an empty directory of the worker's, emptied after each run."""
    mut = _tool()
    w = mut.Worker(tmp_path / "w", 0, sys.executable)
    (tmp_path / "test_stray.py").write_text(STRAY_TEST)
    rc, _, out = w.pytest([str(tmp_path / "test_stray.py")], 120)
    assert rc == 0, out
    assert not (ROOT / "stray-m.json").exists() and list(w.cwd.iterdir()) == []
