"""tools/crash_points.py runs against the installed gpudoctor (issue #48, item 4): started as a user starts it, with
the installed python, isolated (-I: no PYTHONPATH, no script directory magic) from another directory; it loads only
the harness from the checkout and prints the table with the power-loss states."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import gpudoctor

from tests import needs

TOOL = Path(__file__).resolve().parents[2] / "tools" / "crash_points.py"


def test_the_tool_runs_against_the_installed_package(tmp_path):
    needs.root()
    r = subprocess.run([sys.executable, "-I", str(TOOL), "remedy.audit_log", "snapshot.output", "devices.node.mode"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    first = r.stdout.splitlines()[0]
    assert first == f"gpudoctor: {Path(gpudoctor.__file__).resolve().parent}", first
    m = re.search(r"crash points: 3 writers, (\d+) crash points, (\d+) power-loss states, 0 failures "
                  r"\(0 invariant breaks\)", r.stdout)
    assert m and int(m.group(1)) > 10 and int(m.group(2)) > 5, r.stdout[-1500:]


def test_the_tool_names_a_writer_it_does_not_know(tmp_path):
    needs.root()
    r = subprocess.run([sys.executable, "-I", str(TOOL), "no.such.writer"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 3 and "no writer named no.such.writer" in r.stderr, r.stderr
