"""Report layout: methods and workloads in campaign order, speedup axes with room above their highest line, open-loop
levels labelled by rate, and an all-skipped workload that makes matplotlib say nothing."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import pytest

from gpudoctor.bench.records import report
from gpudoctor.bench.records.results import ResultStore
from tests.bench.conftest import REPO, env


def rec(method, workload, c, tok_s, status="ok", rate=None):
    return {"label": f"{method}-tp1", "method": method, "tp": 1, "workload": workload, "concurrency": c,
            "request_rate": rate, "trial": 0, "status": status, "requests": 4,
            "completed": 4 if status == "ok" else 0, "output_tok_per_s": tok_s if status == "ok" else None,
            "accept_length": None, "ttft_ms_p50": 20.0, "itl_ms_p50": 5.0, "e2e_ms_p50": 200.0,
            "error": None if status == "ok" else "prompt of up to 9000 tokens + max_tokens 256 > context limit"}


RECORDS = [
    rec("zeta", "zz:short:out64", 1, 100.0), rec("zeta", "zz:short:out64", 4, 300.0),
    rec("alpha", "zz:short:out64", 1, 290.0), rec("alpha", "zz:short:out64", 4, 870.0),  # speedup 2.9x at the top
    rec("zeta", "aa:short:out64", 1, 100.0), rec("alpha", "aa:short:out64", 1, 150.0),
    rec("zeta", "zz:short:out64", None, 250.0, rate=8.0), rec("alpha", "zz:short:out64", None, 500.0, rate=8.0),
    rec("zeta", "long:ctx9000:out256", 1, None, "skipped"), rec("alpha", "long:ctx9000:out256", 1, None, "skipped"),
]
META = {"name": "layout", "baseline": "zeta", "methods": ["zeta", "alpha"], "workloads": ["zz", "aa", "long"]}


def test_methods_and_workloads_follow_the_campaign_not_the_alphabet():
    md = report.render_markdown(RECORDS, "zeta", "layout", [], report.Order(RECORDS, META))
    sections = [line for line in md.splitlines() if line.startswith("## ")]
    assert sections[:2] == ["## zeta · TP 1", "## alpha · TP 1"]
    rows = [line.split("|")[1:3] for line in md.split("## alpha · TP 1")[1].split("## Not measured")[0].splitlines()
            if line.startswith("| ") and "workload" not in line]
    assert [(w.strip(), c.strip()) for w, c in rows] == [
        ("zz:short:out64", "1"), ("zz:short:out64", "4"), ("zz:short:out64", "8 req/s"), ("aa:short:out64", "1"),
        ("long:ctx9000:out256", "1")]  # measured nothing: a row of dashes, 0/1 ok
    assert "| 8 req/s | 500.0 | 2.00× |" in md


def test_speedup_axis_leaves_room_above_the_highest_line(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures = []
    real_close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: figures.append(fig) or real_close(fig))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any matplotlib warning fails the test
        names = report.render_plots(RECORDS, "zeta", tmp_path, report.Order(RECORDS, META))
    assert "plots/speedup-zz_short_out64.png" in names and "plots/speedup-rate-zz_short_out64.png" in names
    assert not any("long" in n for n in names)  # all skipped: no figure at all
    by_title = {f._suptitle.get_text(): f for f in figures if f is not None}
    ax = by_title["zz:short:out64: speedup"].axes[0]
    top_line = max(max(line.get_ydata()) for line in ax.get_lines())
    assert top_line == pytest.approx(2.9)
    assert ax.get_ylim()[1] >= 2.9 * 1.1
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["alpha"]


def test_report_of_an_all_skipped_workload_writes_nothing_to_stderr(tmp_path):
    store = ResultStore(tmp_path)
    for r in RECORDS:
        store.append(dict(r))
    (tmp_path / "campaign.json").write_text(json.dumps(META))
    p = subprocess.run([sys.executable, "-W", "default", "-m", "gpudoctor", "bench", "report", str(tmp_path)],
                       capture_output=True, text=True, env=env(), cwd=REPO, timeout=120)
    assert p.returncode == 0 and p.stderr == "", p.stderr
    md = (tmp_path / "report.md").read_text()
    assert md.index("## zeta") < md.index("## alpha")
    assert "long:ctx9000:out256" in md.split("## Not measured")[1]


def test_a_goodput_column_appears_when_the_levels_had_slos():
    recs = [dict(r, goodput_req_per_s=2.5 if r["status"] == "ok" else None) for r in RECORDS]
    md = report.render_markdown(recs, "zeta", "layout", [], report.Order(recs, META))
    assert "| ok/trials | goodput req/s |" in md and "| 1/1 | 2.50 |" in md
    assert "goodput" not in report.render_markdown(RECORDS, "zeta", "layout", [], report.Order(RECORDS, META))
