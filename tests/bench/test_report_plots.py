"""`gpudoctor bench report` with and without matplotlib (#23): the plots are the `plots` extra; without it report.md
and results.csv are still written, one line says how to get the plots (in the Python gpudoctor runs from), exit 0.
"Without" is a child interpreter whose import system refuses matplotlib (a sitecustomize meta-path hook)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import textwrap

import pytest

from gpudoctor.bench.records.results import ResultStore
from tests.bench.test_report_layout import META, RECORDS
from tests import needs
from tests.console import console_script

BLOCK = textwrap.dedent("""\
    import sys

    class _NoMatplotlib:
        def find_spec(self, name, path=None, target=None):
            if name == "matplotlib" or name.startswith("matplotlib."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, _NoMatplotlib())
    """)


@pytest.fixture
def run_dir(tmp_path):
    d = tmp_path / "run"
    store = ResultStore(d)
    for r in RECORDS:
        store.append(dict(r))
    (d / "campaign.json").write_text(json.dumps(META))
    return d


def _report(run_dir, tmp_path, *, matplotlib: bool) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if not matplotlib:
        hook = tmp_path / "hook"
        hook.mkdir()
        (hook / "sitecustomize.py").write_text(BLOCK)
        env["PYTHONPATH"] = os.pathsep.join([str(hook), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    return subprocess.run([console_script(), "bench", "report", str(run_dir)], capture_output=True, text=True,
                          env=env, timeout=120)


def _written(run_dir):
    md = (run_dir / "report.md").read_text()
    rows = list(csv.DictReader((run_dir / "results.csv").open()))
    assert "## zeta · TP 1" in md and "| 8 req/s | 500.0 | 2.00× |" in md
    assert len(rows) == len(RECORDS)
    return md


def test_without_matplotlib_the_tables_are_written_and_one_line_says_how_to_get_plots(run_dir, tmp_path):
    p = _report(run_dir, tmp_path, matplotlib=False)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("plots not drawn: matplotlib is not installed in ")
    assert f"in {sys.prefix} (the Python gpudoctor runs from)" in lines[0]  # the console script's own interpreter
    interpreter = open(console_script()).readline()[2:].strip()  # the script's shebang: the Python it runs in
    assert f"`{interpreter} -m pip install 'matplotlib>=3.7'`" in lines[0] and "`plots` extra" in lines[0]
    assert p.stdout.split() == [str(run_dir / "report.md"), str(run_dir / "results.csv")]
    md = _written(run_dir)
    assert "## Plots\n\nplots not drawn: matplotlib is not installed" in md
    assert not (run_dir / "plots").exists()


def test_with_matplotlib_the_plots_are_drawn_and_nothing_is_said(run_dir, tmp_path):
    needs.module("matplotlib", "matplotlib is the plots extra")
    p = _report(run_dir, tmp_path, matplotlib=True)
    assert p.returncode == 0 and p.stderr == "", p.stderr
    pngs = sorted((run_dir / "plots").glob("*.png"))
    assert pngs and all(f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for f in pngs)
    assert set(p.stdout.split()[2:]) == {str(f) for f in pngs}
    md = _written(run_dir)
    assert "plots not drawn" not in md and "![throughput-zz_short_out64](plots/throughput-zz_short_out64.png)" in md


def test_no_plots_says_nothing_about_matplotlib(run_dir, tmp_path):
    env = dict(os.environ)
    p = subprocess.run([console_script(), "bench", "report", str(run_dir), "--no-plots"], capture_output=True,
                       text=True, env=env, timeout=120)
    assert p.returncode == 0 and p.stderr == ""
    assert "## Plots" not in _written(run_dir)
