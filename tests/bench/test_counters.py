"""The server's own counters over a level (gpudoctor.bench.cell.counters), provenance, and compare's gate on real
stand-in processes measured through `gpudoctor bench load`."""

from __future__ import annotations

import json

from gpudoctor.bench.cell import counters
from tests.bench.conftest import as_trials, run_cli

# What SGLang and vLLM print (prometheus_client's exposition: a counter's family without _total, samples with it).
SGLANG = """# HELP sglang:prompt_tokens Number of prefill tokens processed.
# TYPE sglang:prompt_tokens counter
sglang:prompt_tokens_total{model_name="m",dp_rank="0"} 1000.0
sglang:prompt_tokens_total{model_name="m",dp_rank="1"} 500.0
# TYPE sglang:cached_tokens counter
sglang:cached_tokens_total{model_name="m",dp_rank="0",cache_source="device"} 300.0
sglang:cached_tokens_total{model_name="m",dp_rank="0",cache_source="host"} 100.0
sglang:cached_tokens_total{model_name="m",dp_rank="1",cache_source="device"} 0.0
# TYPE sglang:num_retracted_requests counter
sglang:num_retracted_requests_total{model_name="m",dp_rank="0"} 2.0
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m",dp_rank="0"} 0.25
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m",dp_rank="0"} 3.0
"""
VLLM = """# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 4096.0
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 1024.0
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{engine="0",model_name="m"} 0.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 0.0
"""


def bump(text: str, factor: float) -> str:
    out = []
    for line in text.splitlines():
        if line.startswith("#") or "_total" not in line:
            out.append(line)
            continue
        name, value = line.rsplit(" ", 1)
        out.append(f"{name} {float(value) * factor}")
    return "\n".join(out) + "\n"


def test_sglang_deltas_per_dp_rank_and_the_levels_own_hit_rate():
    before = {"status": "read", "values": counters.parse(SGLANG)}
    after = {"status": "read", "values": counters.parse(bump(SGLANG, 3))}
    s = counters.section(before, after)["engines"]["sglang"]
    assert s["deltas"] == {"prefix_cache_queries": 3000.0, "prefix_cache_hits": 800.0, "preemptions": 4.0}
    assert abs(s["hit_rate"] - 800 / 3000) < 1e-12
    assert s["by_rank"]["0"]["prefix_cache_hits"] == 800.0 and s["by_rank"]["1"]["prefix_cache_queries"] == 1000.0
    assert s["gauges_before"]["kv_usage"] == 0.25 and s["gauges_before"]["queue"] == 3.0


def test_vllm_names_and_a_restart_mid_level():
    before = {"status": "read", "values": counters.parse(VLLM)}
    s = counters.section(before, {"status": "read", "values": counters.parse(bump(VLLM, 2))})["engines"]["vllm"]
    assert s["deltas"]["prefix_cache_queries"] == 4096.0 and s["hit_rate"] == 0.25 and s["by_rank"] is None
    r = counters.section(before, {"status": "read", "values": counters.parse(bump(VLLM, 0.5))})["engines"]["vllm"]
    assert r["deltas"]["prefix_cache_queries"] is None and "restarted" in r["notes"][0]
    assert counters.section({"status": "unavailable", "reason": "GET /metrics answered HTTP 404"}, before) == {
        "status": "unavailable", "reason": "GET /metrics answered HTTP 404"}


def load_level(url: str, out, label: str, *extra: str):
    p = run_cli("bench", "load", "--server-url", url, "--concurrency", "4", "--prompts", "24", "--max-tokens", "16",
                "--label", label, "--warmup", "1", "--out", str(out), *extra, timeout=120)
    assert p.returncode == 0, p.stderr
    return [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]


def test_standin_records_carry_counters_provenance_and_the_gate_judges_them(standin, tmp_path):
    a = standin("--decode-tok-s", "300", "--ttft-ms", "5", "--prefix-cache")
    slow = standin("--decode-tok-s", "200", "--ttft-ms", "5", "--prefix-cache")  # the same server, a third slower
    ra = load_level(a.url, tmp_path / "a1", "cfg", "--server-pid", str(a.proc.pid))
    # A and A again as 2 trials each (what a campaign's `trials: 2` records): the A/A gate is Welch's on trial values
    for n in range(4):
        load_level(a.url, tmp_path / f"run{n}", "cfg")
    as_trials(tmp_path / "aa1", tmp_path / "run0", tmp_path / "run1")
    as_trials(tmp_path / "aa2", tmp_path / "run2", tmp_path / "run3")
    load_level(slow.url, tmp_path / "b", "cfg")
    r = ra[0]
    assert r["schema"] == "gpudoctor.bench/3" and r["status"] == "ok"
    sc = r["server_counters"]
    assert sc["status"] == "read" and set(sc["engines"]) == {"sglang", "vllm"}
    d = sc["engines"]["sglang"]["deltas"]
    assert d["prefix_cache_queries"] == r["prompt_tokens_mean"] * 24  # exactly the level's 24 prompts
    assert sc["engines"]["sglang"]["deltas"] == sc["engines"]["vllm"]["deltas"]
    pv = r["provenance"]
    assert pv["server"]["engine"] == "sglang" and pv["server"]["version"].startswith("0.5.23")
    assert pv["check"]["status"] == "not run" and "bench load" in pv["client"]["command"]
    assert "gpudoctor.bench.standin" in " ".join(pv["server"]["command"])  # --server-pid: its /proc cmdline
    assert pv["gpu"]["status"] in ("read", "unknown") and pv["numa"]["status"] in ("read", "unknown")
    assert r["steady"]["status"] in ("steady", "too_short") and len(r["per_request"]["rows"]) == 24
    # A vs A on 2 trials a side (Welch): one trial a side sees only the run's own noise, and two runs on a loaded
    # 2-core machine differed by -5.9 % with p=3e-06 (docs/bench.md); A vs the slower B is one trial against two, the
    # per-request test, and a third slower is far beyond the threshold
    gate = ("--fail-if", "output_tok_per_s < -15%")
    same = run_cli("bench", "compare", str(tmp_path / "aa1"), str(tmp_path / "aa2"), *gate)
    assert same.returncode == 0, same.stdout + same.stderr
    assert "Welch t on trial values" in same.stdout
    worse = run_cli("bench", "compare", str(tmp_path / "a1"), str(tmp_path / "b"), *gate)
    assert worse.returncode == 1, worse.stdout + worse.stderr
    assert "GATE FAIL output_tok_per_s < -15%" in worse.stdout and "SLOWER" in worse.stdout
    assert "Mann-Whitney" in worse.stdout
    rep = run_cli("bench", "report", str(tmp_path / "a1"), "--no-plots")
    assert rep.returncode == 0, rep.stderr
    text = (tmp_path / "a1" / "report.md").read_text()
    assert "## Provenance" in text and "engine sglang 0.5.23" in text and "## Server counters" in text
    assert "## Steady state" in text


def test_vllm_flavor_counters_are_read_under_vllm_names(standin, tmp_path):
    v = standin("--flavor", "vllm", "--decode-tok-s", "400", "m")
    recs = load_level(v.url, tmp_path / "v", "vllm", "--api", "completions")
    sc = recs[0]["server_counters"]
    assert sc["status"] == "read" and sc["engines"]["vllm"]["deltas"]["prefix_cache_queries"] > 0
    assert recs[0]["provenance"]["server"]["engine"] in ("vllm", "unknown")
