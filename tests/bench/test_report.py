"""`gpudoctor bench report`: the tables, the CSV and the plots say exactly what results.jsonl says."""

from __future__ import annotations

import csv
import json
import re

import pytest

from gpudoctor.bench.records.stats import mean_ci

from tests.bench.campaigns import write
from tests.bench.conftest import run_cli


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report")
    body = """\
    methods:
      ar: {baseline: true}
      eagle3: {args: [--accept-length, "3", --decode-tok-s, "1000"]}
      broken: {args: [--fail-mode, die-at-start], tp: [1]}
    """
    path, _ = write(tmp, body, concurrency="[1, 2]")
    path.write_text(path.read_text().replace("tp: [1]\n", "tp: [1, 2]\n", 1).replace("    num_prompts: 4",
                                                                                      "    num_prompts: 4\n    trials: 2"))
    out = tmp / "out"
    p = run_cli("bench", "run", str(path), "--out", str(out))
    assert p.returncode == 1, p.stderr
    p = run_cli("bench", "report", str(out))
    assert p.returncode == 0, p.stderr
    return out


def records(out):
    return [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]


def tables(md: str) -> dict[str, list[list[str]]]:
    out, current = {}, None
    for line in md.splitlines():
        if line.startswith("## "):
            current = line[3:]
            out[current] = []
        elif current and line.startswith("| ") and not line.startswith("|---"):
            out[current].append([c.strip() for c in line.strip("|").split("|")])
    return {k: v[1:] for k, v in out.items()}  # drop header rows


def mean_ok(recs, method, tp, c, field):
    vals = [r[field] for r in recs if r["method"] == method and r["tp"] == tp and r["concurrency"] == c
            and r["status"] == "ok"]
    return sum(vals) / len(vals)


def test_tables_match_results(run_dir):
    recs = records(run_dir)
    md = (run_dir / "report.md").read_text()
    t = tables(md)
    assert "Speedup is output tok/s relative to **ar**" in md
    assert [k for k in t if "TP" in k] == ["ar · TP 1", "ar · TP 2", "eagle3 · TP 1", "eagle3 · TP 2"]
    checked = 0
    for title, rows in t.items():
        m = re.match(r"(\w+) · TP (\d+)", title)
        if not m:
            continue
        method, tp = m.group(1), int(m.group(2))
        for workload, c, toks, sp, acc, ttft, itl, trials in rows:
            c = int(c)
            assert workload == "chat:short:out24" and trials == "2/2"
            # two ok trials: mean ± the 95 % CI half-width (t with 1 degree of freedom)
            for cell, field in ((toks, "output_tok_per_s"), (ttft, "ttft_ms_p50")):
                mean, pm, half = cell.partition(" ± ")
                vals = [r[field] for r in recs if r["method"] == method and r["tp"] == tp and r["concurrency"] == c
                        and r["status"] == "ok"]
                assert pm and float(half) == pytest.approx(mean_ci(vals)[1], abs=0.051)
                assert float(mean) == pytest.approx(mean_ok(recs, method, tp, c, field), abs=0.051)
            if method == "ar":
                assert sp == "—" and acc == "—"
            else:
                ratio = mean_ok(recs, method, tp, c, "output_tok_per_s") / mean_ok(recs, "ar", tp, c,
                                                                                 "output_tok_per_s")
                assert float(sp.rstrip("×")) == pytest.approx(ratio, abs=0.0051)
                assert float(acc) == pytest.approx(mean_ok(recs, method, tp, c, "accept_length"), abs=0.0051)
            checked += 1
    assert checked == 8
    bad = [r for r in recs if r["status"] != "ok"]
    assert len(bad) == 4 and all(r["label"] == "broken-tp1" and r["status"] == "crashed" for r in bad)
    assert len(t["Not measured"]) == 4 and all(row[4] == "crashed" for row in t["Not measured"])
    assert "AssertionError" in t["Not measured"][0][5]


def test_csv_matches_results(run_dir):
    recs = records(run_dir)
    with open(run_dir / "results.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == len(recs)
    for row, r in zip(rows, recs):
        assert (row["label"], row["workload"], int(row["concurrency"]), int(row["trial"]), row["status"]) == (
            r["label"], r["workload"], r["concurrency"], r["trial"], r["status"])
        if r["status"] == "ok":
            assert float(row["output_tok_per_s"]) == r["output_tok_per_s"]
            assert (row["accept_length"] == "") == (r["accept_length"] is None)
        else:
            assert row["output_tok_per_s"] == "" and row["speedup"] == ""


def test_plots_render(run_dir):
    import matplotlib.image

    for name in ("throughput-chat_short_out24.png", "speedup-chat_short_out24.png"):
        path = run_dir / "plots" / name
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        img = matplotlib.image.imread(str(path))
        assert img.shape[0] > 300 and img.shape[1] > 800  # two TP panels side by side
        assert img[..., :3].std() > 0.05  # not a blank canvas
    assert "![throughput-chat_short_out24](plots/throughput-chat_short_out24.png)" in (run_dir / "report.md").read_text()


def test_report_without_results_is_exit_3(tmp_path):
    p = run_cli("bench", "report", str(tmp_path))
    assert p.returncode == 3 and "no results.jsonl here" in p.stderr
