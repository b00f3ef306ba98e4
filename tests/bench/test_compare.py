"""`gpudoctor bench compare` and its regression gate: on records of the last round (gpudoctor.bench/2, from
tests/fixtures/bench2/) and on this round's, measured against real stand-in processes."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from gpudoctor.bench.records import compare as cmp
from gpudoctor.errors import InputError
from tests.bench.conftest import run_cli

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "bench2"


def load(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_bench2_methods_in_one_campaign_compared_with_welch():
    res = cmp.compare(cmp.load_side(f"{FIX}/campaign:method=baseline"), cmp.load_side(f"{FIX}/campaign:method=eagle3"))
    assert res["matched_on"] == ["tp", "workload", "load"] and res["compared"] == ["method"]
    assert len(res["cells"]) == 2
    for c in res["cells"]:
        t = c["metrics"]["output_tok_per_s"]
        assert t["test"] == "Welch t on trial values" and t["trials"] == [2, 2] and t["basis"] == "whole level"
        assert t["b"] > t["a"] and t["rel"] > 0.3  # eagle3 decodes at 800 tok/s x accept 3, baseline at 400
    assert res["cells"][0]["verdict"] == cmp.FASTER
    assert any("no provenance" in w for w in res["warnings"])


def test_bench2_one_trial_is_not_enough_data_and_the_gate_cannot_pass_it():
    p = run_cli("bench", "compare", f"{FIX}/one-trial:method=baseline", f"{FIX}/one-trial:method=eagle3",
                "--fail-if", "output_tok_per_s < -5%")
    assert p.returncode == 3, p.stdout + p.stderr
    assert "NOT ENOUGH DATA" in p.stdout and "run 2 or more trials per side" in p.stdout
    assert p.stderr.strip().count("\n") == 0 and "could not judge 2 cell(s)" in p.stderr
    assert "Traceback" not in p.stderr


def test_bench2_gate_a_vs_a_passes(tmp_path):
    p = run_cli("bench", "compare", f"{FIX}/campaign", f"{FIX}/campaign", "--fail-if", "output_tok_per_s < -5%",
                "--fail-if", "ttft_ms_p99 > +10%", "--json")
    assert p.returncode == 0, p.stdout + p.stderr
    out = json.loads(p.stdout)
    assert out["gate"]["outcome"] == "pass" and len(out["gate"]["passed"]) == 8
    assert all(c["verdict"] == cmp.SAME for c in out["cells"])


@pytest.mark.parametrize("expr,says", [("foo < -5%", "unknown metric 'foo'"), ("output_tok_per_s < 5", "expected"),
                                       ("output_tok_per_s = -5%", "expected")])
def test_a_bad_gate_expression_is_one_line_naming_it(expr, says):
    p = run_cli("bench", "compare", f"{FIX}/campaign", f"{FIX}/campaign", "--fail-if", expr)
    assert p.returncode == 3 and not p.stdout
    assert expr in p.stderr and says in p.stderr and p.stderr.strip().count("\n") == 0


def test_bad_sides_are_input_errors(tmp_path):
    with pytest.raises(InputError, match="no such result directory"):
        cmp.load_side(str(tmp_path / "nope"))
    with pytest.raises(InputError, match="FIELD one of"):
        cmp.load_side(f"{FIX}/campaign:colour=red")
    with pytest.raises(InputError, match="no records match method=dflash"):
        cmp.load_side(f"{FIX}/campaign:method=dflash")


def test_suspect_trials_are_left_out_and_named(tmp_path):
    d = tmp_path / "sus"
    d.mkdir()
    recs = load(FIX / "campaign" / "results.jsonl")
    for r in recs:
        if r["method"] == "eagle3" and r["concurrency"] == 4:
            r["suspect"] = [{"reason": "foreign process 4242 (python3) on GPU 0 at 1.2 s", "kind": "foreign", "t": 1.2}]
        if r["method"] == "eagle3" and r["concurrency"] == 1 and r["trial"] == 1:
            r["suspect"] = [{"reason": "sw_power_cap at 0.4 s", "kind": "clock_event", "t": 0.4}]
    (d / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    res = cmp.compare(cmp.load_side(f"{d}:method=baseline"), cmp.load_side(f"{d}:method=eagle3"))
    by = {c["cell"]["load"]: c for c in res["cells"]}
    assert by[4]["verdict"] == cmp.NOT_COMPARED and "foreign process 4242" in by[4]["why"]
    assert any("1 suspect trial(s) left out (sw_power_cap" in n for n in by[1]["notes"])
    assert by[1]["metrics"]["output_tok_per_s"]["trials"] == [2, 1]
    assert by[1]["verdict"] == cmp.NOT_ENOUGH  # 2 vs 1 clean trials, and no per-request values in /2 records
    lines = "\n".join(cmp.render_text(res))
    assert "NOT COMPARED" in lines and "suspect" in lines


def synthetic(tmp_path: Path, name: str, driver: str, scale: float, trials: int = 1) -> Path:
    """Records as this round writes them (per-request rows, steady window, provenance) from the bench/2 fixture's
    identities, per-request values scaled."""
    d = tmp_path / name
    d.mkdir()
    out = []
    for k in range(trials):
        base = load(FIX / "one-trial" / "results.jsonl")[0]
        rows = [[i * 0.05, 12.0 * scale * (1 + 0.01 * (i % 5)), 70.0 * scale * (1 + 0.01 * (i % 3)), 24,
                 2.4 * scale, 24 / (0.070 * scale)] for i in range(30)]
        rec = {**base, "schema": "gpudoctor.bench/3", "trial": k, "output_tok_per_s": 340 / scale,
               "per_request": {"fields": ["start_s", "ttft_ms", "e2e_ms", "output_tokens", "itl_ms", "tok_per_s"],
                               "rows": rows},
               "steady": {"status": "steady", "first": 2, "last": 29, "counted": 28, "requests": 30, "why": "MSER",
                          "metrics": {"output_tok_per_s": 340 / scale, "ttft_ms_p50": 12 * scale,
                                      "ttft_ms_p99": 12.5 * scale, "itl_ms_p50": 2.4 * scale,
                                      "e2e_ms_p50": 70 * scale}},
               "provenance": {"server": {"engine": "sglang", "version": "0.5.23"},
                              "gpu": {"status": "read", "name": "NVIDIA H200", "driver": driver, "cuda": "13.0",
                                      "power_limit_w": 700.0}}}
        out.append(rec)
    (d / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in out))
    return d


def test_one_trial_with_per_request_values_uses_bootstrap_and_mann_whitney(tmp_path):
    a = synthetic(tmp_path, "a", "580.159.04", 1.0)
    b = synthetic(tmp_path, "b", "580.159.04", 1.10)
    res = cmp.compare(cmp.load_side(str(a)), cmp.load_side(str(b)))
    m = res["cells"][0]["metrics"]
    assert "bootstrap" in m["output_tok_per_s"]["test"] and "Mann-Whitney" in m["output_tok_per_s"]["test"]
    assert m["output_tok_per_s"]["basis"] == "steady window"
    assert res["cells"][0]["verdict"] == cmp.SLOWER and m["ttft_ms_p50"]["verdict"] == cmp.SLOWER
    assert res["warnings"] == []
    p = run_cli("bench", "compare", str(a), str(b), "--fail-if", "output_tok_per_s < -5%")
    assert p.returncode == 1, p.stdout + p.stderr
    assert "GATE FAIL output_tok_per_s < -5%" in p.stdout
    p = run_cli("bench", "compare", str(a), str(b), "--fail-if", "output_tok_per_s < -15%")
    assert p.returncode == 0, p.stdout + p.stderr  # significant, but not beyond the threshold


def test_compare_warns_when_a_and_b_differ_in_something_else(tmp_path):
    a = synthetic(tmp_path, "a", "580.159.04", 1.0)
    b = synthetic(tmp_path, "b", "575.57.08", 1.0)
    res = cmp.compare(cmp.load_side(str(a)), cmp.load_side(str(b)))
    assert res["warnings"] == ["A and B differ in gpu.driver: 580.159.04 vs 575.57.08"]
    assert res["cells"][0]["verdict"] == cmp.SAME


def test_no_difference_says_how_many_trials_would_detect_the_effect(tmp_path):
    a = synthetic(tmp_path, "a", "x", 1.0, trials=3)
    recs = load(a / "results.jsonl")
    for r, v in zip(recs, (330.0, 350.0, 340.0)):
        r["steady"]["metrics"]["output_tok_per_s"] = v
    (a / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    b = tmp_path / "b"
    shutil.copytree(a, b)
    res = cmp.compare(cmp.load_side(str(a)), cmp.load_side(str(b)))
    t = res["cells"][0]["metrics"]["output_tok_per_s"]
    assert t["verdict"] == cmp.SAME and t["test"] == "Welch t on trial values"
    # sd 10 on 340: 5 % = 17 -> d = 1.7 -> 7 per side (t-based power, 80 %)
    assert t["need"]["trials_per_side"] == 7
    assert "≈7 trials per side (4 more) would detect 5%" in cmp.need_text(t)


def _agree(line: str) -> tuple[float, float, float]:
    """A, B and the change printed on one metric line; the change is (B - A) / A to the printed precision."""
    m = re.search(r": A ([\d.e+]+) B ([\d.e+]+) ([+-][\d.]+)% \[", line)
    assert m, line
    a, b, pct = float(m.group(1)), float(m.group(2)), float(m.group(3))
    assert abs((b - a) / a * 100 - pct) < 0.1, line
    return a, b, pct


def test_a_b_and_the_change_always_agree_and_are_named(tmp_path):
    """One trial per side with per-request values: the change is the per-request mean's, so A and B are too, and the
    line names them; the levels' throughputs, which can move the other way (B ran at a higher concurrency's share),
    are shown beside, named as such. Before: `tok/s: A 340 B 400 -9.1% [...]` (a real H100's: `A 44.31 B 37.44
    -45.4%`)."""
    a = synthetic(tmp_path, "a", "580.159.04", 1.0)
    b = synthetic(tmp_path, "b", "580.159.04", 1.10)
    recs = load(b / "results.jsonl")
    for r in recs:  # B's level throughput up although each request decodes slower
        r["output_tok_per_s"] = r["steady"]["metrics"]["output_tok_per_s"] = 400.0
    (b / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    res = cmp.compare(cmp.load_side(str(a)), cmp.load_side(str(b)))
    t = res["cells"][0]["metrics"]["output_tok_per_s"]
    assert t["quantity"] == "per-request mean" and t["level"] == [340.0, 400.0]
    assert t["rel"] == pytest.approx((t["b"] - t["a"]) / t["a"]) and t["rel"] < 0
    lines = cmp.render_text(res)
    [tok] = [ln for ln in lines if ln.lstrip().startswith("tok/s")]
    assert tok.lstrip().startswith("tok/s (per-request mean): A "), tok
    a_, b_, pct = _agree(tok)
    assert pct == pytest.approx(-9.1, abs=0.05) and b_ < a_
    assert "the levels' tok/s: A 340 B 400" in tok
    for ln in lines:  # every metric line of every cell agrees with itself
        if re.match(r"^\s+\S.*: A [\d.]+ B [\d.]+ [+-]", ln):
            _agree(ln)
    md = "\n".join(cmp.render_markdown_table(res, "t"))
    assert "per-request mean: bootstrap of the per-request mean" in md


def test_trials_compare_their_mean_and_say_so(tmp_path):
    a = synthetic(tmp_path, "a", "x", 1.0, trials=3)
    b = synthetic(tmp_path, "b", "x", 1.2, trials=3)
    res = cmp.compare(cmp.load_side(str(a)), cmp.load_side(str(b)))
    t = res["cells"][0]["metrics"]["output_tok_per_s"]
    assert t["quantity"] == "mean of the trials" and "level" not in t
    [tok] = [ln for ln in cmp.render_text(res) if ln.lstrip().startswith("tok/s")]
    assert tok.lstrip().startswith("tok/s (mean of the trials): A 340 B 283.3 -16.7% ["), tok
    _agree(tok)
