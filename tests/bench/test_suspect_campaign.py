"""A campaign whose host changes mid-campaign: exactly the level during which the stand-in logs an Xid is suspect,
listed apart in report.md, and --rerun-suspect measures only it again; trials=3 give ± intervals, named prompts a
per-prompt table; records of schema /1 still load and report."""

from __future__ import annotations

import json
import sys
import textwrap

from tests.bench.conftest import free_port, run_cli
from tests.bench.fakenvml import assert_real_health

PROMPTS = {"fib": "Write a Python function that returns the n-th Fibonacci number.",
           "qsort": "Implement quicksort in C and explain its worst case.",
           "arith": "What is 1234 * 5678? Show the steps.",
           "json": "Emit a JSON object describing a GPU with five fields.",
           "haiku": "Write a haiku about a datacenter at night."}


def campaign(tmp_path, klog, flag, timing):
    (tmp_path / "model").mkdir(exist_ok=True)
    ps = tmp_path / "seed.jsonl"
    ps.write_text("".join(json.dumps({"name": k, "prompt": v}) + "\n" for k, v in PROMPTS.items()))
    path = tmp_path / "c.yaml"
    # Requests the stand-in sees: 2 warm-up, then 5 per level in the order trial 0 c1, c2, trial 1 c1, ...
    # the 15th arrives during the third level (trial 1, concurrency 1): the Xid is written then.
    path.write_text(textwrap.dedent(f"""\
        name: suspect-test
        model: {tmp_path}/model
        server:
          command: [{sys.executable}, -m, gpudoctor.bench.standin, --decode-tok-s, "800", --ttft-ms, "10",
                    --xid-log, {klog}, --xid-after-requests, "15", --xid-if-exists, {flag}, --timing-log, {timing}]
          port: {free_port()}
        gate:
          command: "true"
        tp: [1]
        concurrency: [1, 2]
        timeouts: {{ready_s: 90, stall_s: 15, stop_s: 5, gpu_release_s: 5}}
        health:
          interval_s: 0.1
          kernel_log: {klog}
        suspect:
          sm_clock_drop: 0.15
        methods:
          baseline: {{}}
        workloads:
          - name: seed
            prompts: {ps}
            max_tokens: [16]
            num_prompts: 5
            trials: 3
        """))
    return path


def test_injected_host_change_makes_exactly_that_level_suspect_and_rerun_measures_only_it(tmp_path):
    klog, flag, timing = tmp_path / "kern.log", tmp_path / "host-broken", tmp_path / "timing.jsonl"
    klog.write_text("")
    flag.write_text("")
    path, out = campaign(tmp_path, klog, flag, timing), tmp_path / "run"
    p = run_cli("bench", "run", str(path), "--out", str(out), timeout=240)
    assert p.returncode == 0, p.stderr
    recs = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert len(recs) == 6 and all(r["status"] == "ok" and r["schema"] == "gpudoctor.bench/3" for r in recs)
    sus = [r for r in recs if r["suspect"]]
    assert [(r["trial"], r["concurrency"]) for r in sus] == [(1, 1)], [r["suspect"] for r in recs]
    (why,) = sus[0]["suspect"]
    assert why["kind"] == "xid" and "Xid 79" in why["reason"] and why["t"] >= 0
    assert "SUSPECT: Xid 79" in p.stderr
    for r in recs:  # no NVML here; the kernel log is read all the same
        assert_real_health(r["host_health"])
    assert all(r["per_prompt"] and set(r["per_prompt"]) == set(PROMPTS) for r in recs)
    assert run_cli("bench", "report", str(out), "--no-plots").returncode == 0
    md = (out / "report.md").read_text()
    assert "## Suspect levels" in md and md.count("Xid 79") == 1
    assert "| 2/3 (1 suspect) |" in md and "| 3/3 |" in md
    row = next(x for x in md.splitlines() if x.startswith("| seed:short:out16 | 2 |"))
    assert row.count(" ± ") == 3  # tok/s, TTFT and ITL over three trials
    assert "## Per prompt" in md and "| fib |" in md and "| haiku |" in md

    flag.unlink()  # the host is fixed
    served_before = len(timing.read_text().splitlines())
    p = run_cli("bench", "run", str(path), "--out", str(out), "--rerun-suspect", timeout=240)
    assert p.returncode == 0, p.stderr
    assert "1 suspect record(s) retracted" in p.stderr
    again = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert len(again) == 6 and not any(r["suspect"] for r in again)
    assert [r for r in again if (r["trial"], r["concurrency"]) != (1, 1)] == \
        [r for r in recs if (r["trial"], r["concurrency"]) != (1, 1)]  # the others untouched
    (gone,) = [json.loads(x) for x in (out / "retracted.jsonl").read_text().splitlines()]
    assert gone["suspect"] and gone["retracted"].startswith("suspect: Xid 79")
    assert len(timing.read_text().splitlines()) - served_before == 2 + 5  # warm-up + that level only
    assert run_cli("bench", "report", str(out), "--no-plots").returncode == 0
    md = (out / "report.md").read_text()
    assert "## Suspect levels" not in md and "(1 suspect)" not in md
    p = run_cli("bench", "run", str(path), "--out", str(out), "--rerun-suspect", timeout=60)
    assert p.returncode == 0 and "0 suspect record(s)" in p.stderr  # nothing suspect: nothing runs


def test_schema_1_records_still_load_and_report(tmp_path):
    out = tmp_path / "old"
    out.mkdir()
    old = {"schema": "gpudoctor.bench/1", "label": "a", "method": "a", "tp": 1, "workload": "w", "concurrency": 1,
           "trial": 0, "status": "ok", "requests": 2, "completed": 2, "output_tok_per_s": 10.0, "ttft_ms_p50": 5.0,
           "itl_ms_p50": 1.0}
    (out / "results.jsonl").write_text(json.dumps(old) + "\n" + json.dumps({**old, "trial": 1,
                                                                            "output_tok_per_s": 12.0}) + "\n")
    p = run_cli("bench", "report", str(out), "--no-plots")
    assert p.returncode == 0, p.stderr
    md = (out / "report.md").read_text()
    assert "| w | 1 | 11.0 ± 12.7 |" in md  # t(1) = 12.706: two trials have a wide interval
    assert "no host_health section" in md


def test_bad_suspect_key_is_file_line_exit_3(tmp_path):
    klog, flag, timing = tmp_path / "k", tmp_path / "f", tmp_path / "t"
    path = campaign(tmp_path, klog, flag, timing)
    path.write_text(path.read_text().replace("sm_clock_drop: 0.15", "sm_clock_drop: 2"))
    p = run_cli("bench", "run", str(path), "--out", str(tmp_path / "o"))
    line = next(i for i, x in enumerate(path.read_text().splitlines(), 1) if "sm_clock_drop" in x)
    assert p.returncode == 3 and f"{path}:{line}" in p.stderr and "sm_clock_drop" in p.stderr, p.stderr
    assert not (tmp_path / "o").exists()


def test_a_foreign_process_on_the_gpu_marks_its_level_and_the_servers_own_does_not(tmp_path):
    """In process, with the fake NVML of an H200: the server's own process on the GPU from the start (its pid from
    server.pid: the session the campaign started it in), a foreign one only while the concurrency-2 level runs."""
    from gpudoctor.campaign.runner import run_campaign
    from tests.bench.fakenvml import FakeNVML

    (tmp_path / "model").mkdir()
    path = tmp_path / "c.yaml"
    path.write_text(textwrap.dedent(f"""\
        model: {tmp_path}/model
        server:
          command: [{sys.executable}, -m, gpudoctor.bench.standin, --decode-tok-s, "800"]
          port: {free_port()}
        gate: {{command: null}}
        tp: [1]
        concurrency: [1, 2, 4]
        timeouts: {{ready_s: 90, stall_s: 15, stop_s: 5, gpu_release_s: 5}}
        health: {{interval_s: 0.05, kernel_log: null}}
        methods: {{baseline: {{}}}}
        workloads: [{{name: w, max_tokens: [32], num_prompts: 4}}]
        """))
    nv, out = FakeNVML(), tmp_path / "run"
    nv.busy()

    def on_event(kind, **data):
        if kind == "level_start" and data["spec"].concurrency == 1:
            nv.add_process(json.loads((out / "server.pid").read_text())["pid"], 70000)
        if kind == "level_start" and data["spec"].concurrency == 2:
            nv.add_process(999_999, 512)
        if kind == "level_done" and data["record"]["concurrency"] == 2:
            nv.set(procs=nv.gpus[0].procs[:1])

    counts = run_campaign(str(path), str(out), on_event=on_event, health_nvml=nv)
    assert counts["ok"] == 3
    recs = {r["concurrency"]: r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    assert all(r["host_health"]["status"] == "sampled" and r["host_health"]["samples"] >= 2 for r in recs.values())
    assert recs[1]["suspect"] is None and recs[4]["suspect"] is None
    (why,) = recs[2]["suspect"]
    assert why["kind"] == "foreign_process" and "pid 999999" in why["reason"] and "512" in why["reason"]
    g = recs[2]["host_health"]["gpus"]["0"]
    assert g["sm_mhz"]["median"] == 1980 and g["util_pct"]["max"] == 97 and g["bus_id"] == "00000000:00:06.0"
