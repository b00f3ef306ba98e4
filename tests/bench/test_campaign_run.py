"""`gpudoctor bench run` end to end with the stand-in as the server: gate, launch, levels, crashes, resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.bench.campaigns import write
from tests.bench.conftest import REPO, env, run_cli
from tests.procs import alive


def records(out):
    path = out / "results.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def by_key(recs):
    return {(r["label"], r["workload"], r["concurrency"], r["trial"]): r for r in recs}


def assert_honest(recs):
    keys = [(r["label"], r["workload"], r["concurrency"], r["trial"]) for r in recs]
    assert len(keys) == len(set(keys)), "duplicate records"
    for r in recs:
        if r["status"] == "ok":
            assert r["output_tok_per_s"] > 0 and r["completed"] == r["requests"]
        else:
            assert r["error"] and r["output_tok_per_s"] is None


def test_campaign_records_every_config(tmp_path):
    path, port = write(tmp_path, "methods:\n  baseline: {baseline: true}\n  eagle3:\n"
                       "    args: [--speculative-algorithm, EAGLE3, --accept-length, '4', --decode-tok-s, '1200']\n"
                       f"    draft_model: {tmp_path}/draft\n", extra="nccl_env: {1: {NCCL_P2P_LEVEL: NVL}}\n")
    out = tmp_path / "out"
    p = run_cli("bench", "run", str(path), "--out", str(out))
    assert p.returncode == 0, p.stderr
    recs = records(out)
    assert_honest(recs)
    assert sorted((r["label"], r["concurrency"]) for r in recs) == [
        ("baseline-tp1", 1), ("baseline-tp1", 2), ("eagle3-tp1", 1), ("eagle3-tp1", 2)]
    assert all(r["status"] == "ok" for r in recs)
    k = by_key(recs)
    assert k[("eagle3-tp1", "chat:short:out24", 2, 0)]["accept_length"] == pytest.approx(4.0)
    assert k[("baseline-tp1", "chat:short:out24", 2, 0)]["accept_length"] is None
    log = (out / "logs" / "eagle3-tp1.log").read_text()
    assert f"--speculative-draft-model-path {tmp_path}/draft" in log and "--tp-size 1" in log
    assert "The server is fired up and ready to roll!" in log
    assert json.loads((out / "campaign.json").read_text())["baseline"] == "baseline"
    assert "== eagle3-tp1: 2 of 2 levels to run" in p.stderr
    assert not (out / "server.pid").exists()


def test_gate_failure_stops_the_campaign(tmp_path):
    gate = "[sh, -c, 'echo devices.uvm.open FAIL open /dev/nvidia-uvm EPERM; exit 2']"
    path, _ = write(tmp_path, "methods: {baseline: {}}\n", gate=gate)
    out = tmp_path / "out"
    p = run_cli("bench", "run", str(path), "--out", str(out))
    assert p.returncode == 2
    assert p.stderr.strip().splitlines()[-1].startswith("gpudoctor: gate failed before baseline-tp1, campaign stopped")
    assert "EPERM" in p.stderr and "Traceback" not in p.stderr
    assert records(out) == []


def test_gate_heals_then_runs(tmp_path):
    marker = tmp_path / "healed"
    gate = f"[test, -e, {marker}]"
    path, _ = write(tmp_path, "methods: {baseline: {}}\n", gate=gate, concurrency="[1]")
    text = path.read_text().replace(f"  command: {gate}\n", f"  command: {gate}\n  heal_command: [touch, {marker}]\n")
    path.write_text(text)
    out = tmp_path / "out"
    p = run_cli("bench", "run", str(path), "--out", str(out))
    assert p.returncode == 0, p.stderr
    assert "gate passed after healing" in p.stderr
    assert [r["status"] for r in records(out)] == ["ok"]


def test_server_that_dies_at_start_is_recorded_and_campaign_goes_on(tmp_path):
    body = """\
    methods:
      baseline: {baseline: true}
      broken: {args: [--fail-mode, die-at-start]}
    """
    path, _ = write(tmp_path, body, concurrency="[1]")
    out = tmp_path / "out"
    p = run_cli("bench", "run", str(path), "--out", str(out))
    assert p.returncode == 1, p.stderr
    recs = by_key(records(out))
    assert_honest(recs.values())
    assert recs[("baseline-tp1", "chat:short:out24", 1, 0)]["status"] == "ok"
    broken = recs[("broken-tp1", "chat:short:out24", 1, 0)]
    assert broken["status"] == "crashed" and "server process exited with rc 1" in broken["error"]
    assert "AssertionError" in broken["error"] and "Traceback" in broken["log_excerpt"]


def test_server_that_never_becomes_ready(tmp_path):
    path, _ = write(tmp_path, "methods:\n  stuck: {args: [--fail-mode, never-ready]}\n", concurrency="[1, 2]")
    path.write_text(path.read_text().replace("ready_s: 90", "ready_s: 2"))
    out = tmp_path / "out"
    p = run_cli("bench", "run", str(path), "--out", str(out))
    assert p.returncode == 1, p.stderr
    recs = records(out)
    assert_honest(recs)
    assert [r["concurrency"] for r in recs] == [1, 2]
    for r in recs:
        assert r["status"] == "error" and "never became ready: not ready in 2 s" in r["error"]
    assert "=== gpudoctor: starting at" in recs[0]["log_excerpt"]


@pytest.mark.parametrize("on_crash,last", [("skip", "skipped"), ("restart", "ok")])
def test_crash_mid_campaign(tmp_path, on_crash, last):
    # warm-up 2 + c=1: 4 requests = 6; c=2 dies at the 8th request; c=4 is skipped, or run on a restarted server.
    body = "methods:\n  flaky: {args: [--fail-mode, die-mid-level, --fail-after-requests, '8']}\n"
    path, _ = write(tmp_path, body, concurrency="[1, 2, 4]", extra=f"on_crash: {on_crash}\n")
    out = tmp_path / "out"
    p = run_cli("bench", "run", str(path), "--out", str(out))
    assert p.returncode == 1
    recs = records(out)
    assert_honest(recs)
    assert [(r["concurrency"], r["status"]) for r in recs] == [(1, "ok"), (2, "crashed"), (4, last)]
    assert "illegal instruction" in recs[1]["error"]
    assert "CUDA error: an illegal instruction was encountered" in recs[1]["log_excerpt"]


def test_port_taken_stops_campaign(tmp_path, standin):
    s = standin("--decode-tok-s", "100")
    path, _ = write(tmp_path, "methods: {baseline: {}}\n", port=s.port)
    p = run_cli("bench", "run", str(path), "--out", str(tmp_path / "out"))
    assert p.returncode == 2 and f"port {s.port} on 127.0.0.1 is already in use" in p.stderr
    assert records(tmp_path / "out") == []


def test_rerun_without_resume_refuses(tmp_path):
    path, _ = write(tmp_path, "methods: {baseline: {}}\n", concurrency="[1]")
    out = tmp_path / "out"
    assert run_cli("bench", "run", str(path), "--out", str(out)).returncode == 0
    p = run_cli("bench", "run", str(path), "--out", str(out))
    assert p.returncode == 3 and "pass --resume" in p.stderr
    p = run_cli("bench", "run", str(path), "--out", str(out), "--resume")
    assert p.returncode == 0 and "complete (1 levels recorded), skipped" in p.stderr
    assert len(records(out)) == 1


def test_sigkill_then_resume_has_no_duplicate_or_lost_records(tmp_path):
    gate_log = tmp_path / "gates"
    body = """\
    methods:
      baseline: {baseline: true}
      eagle3: {args: [--accept-length, "2", --decode-tok-s, "200"]}
    """
    path, port = write(tmp_path, body, gate=f"[sh, -c, 'echo gate >> {gate_log}']", concurrency="[1, 2, 3]")
    path.write_text(path.read_text().replace('--decode-tok-s, "400"', '--decode-tok-s, "100"'))
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "gpudoctor", "bench", "run", str(path), "--out", str(out)],
                            env=env(), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(records(out)) < 2:
        time.sleep(0.05)
    time.sleep(0.3)  # now a level of the first server is in flight
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = records(out)
    assert 2 <= len(before) < 6
    assert_honest(before)
    pid = json.loads((out / "server.pid").read_text())["pid"]
    assert alive(pid)  # the killed runner left its server running
    p = run_cli("bench", "run", str(path), "--out", str(out), "--resume")
    assert p.returncode == 0, p.stderr
    assert "stopped server left running by an interrupted campaign" in p.stderr
    after = records(out)
    assert_honest(after)
    assert sorted((r["label"], r["concurrency"]) for r in after) == sorted(
        (label, c) for label in ("baseline-tp1", "eagle3-tp1") for c in (1, 2, 3))
    assert after[: len(before)] == before  # nothing recorded before the kill was rewritten
    assert all(r["status"] == "ok" for r in after)
    # stopped: gone, or a zombie its new parent never reaps (the killed runner's child is reparented to PID 1, which is
    # pytest itself when it runs as a container's first process)
    assert not alive(pid)
    assert gate_log.read_text().count("gate") >= 2  # the resumed run gated the host again


def test_long_context_that_cannot_fit_is_skipped_never_sent(tmp_path):
    # The server's limit (1500) comes from its /server_info; 2000-token prompts cannot fit and are never sent.
    path, _ = write(tmp_path, "methods: {baseline: {args: [--context-length, '1500']}}\n", concurrency="[1]")
    path.write_text(path.read_text().replace("    max_tokens: [24]", "    max_tokens: [24]\n    context_lengths: [null, 1000, 2000]"))
    out = tmp_path / "out"
    p = run_cli("bench", "run", str(path), "--out", str(out))
    assert p.returncode == 1, p.stderr
    recs = by_key(records(out))
    assert recs[("baseline-tp1", "chat:short:out24", 1, 0)]["status"] == "ok"
    fits = recs[("baseline-tp1", "chat:ctx1000:out24", 1, 0)]
    assert fits["status"] == "ok" and fits["prompt_tokens_mean"] == 1000
    skipped = recs[("baseline-tp1", "chat:ctx2000:out24", 1, 0)]
    assert skipped["status"] == "skipped" and "> context limit 1500; not sent" in skipped["error"]
    assert "longer than the model's context length" not in (out / "logs" / "baseline-tp1.log").read_text()


def test_flags_sglang_would_refuse_are_caught_before_launch(tmp_path):
    # The seed's failing EAGLE-3 flags: draft tokens without steps is a bare AssertionError after the model load.
    body = """\
    validate: true
    methods:
      baseline: {baseline: true}
      eagle3_bad: {args: [--speculative-algorithm, EAGLE3, --speculative-num-draft-tokens, "3"]}
    """
    path, _ = write(tmp_path, body, concurrency="[1, 2]")
    out = tmp_path / "out"
    p = run_cli("bench", "run", str(path), "--out", str(out))
    assert p.returncode == 1, p.stderr
    recs = by_key(records(out))
    assert_honest(recs.values())
    assert recs[("baseline-tp1", "chat:short:out24", 1, 0)]["status"] == "ok"
    for c in (1, 2):
        r = recs[("eagle3_bad-tp1", "chat:short:out24", c, 0)]
        assert r["status"] == "error" and r["error"].startswith("not launched: sglang validate says")
        assert "sglang.spec.draft_without_steps" in r["log_excerpt"]
    assert not (out / "logs" / "eagle3_bad-tp1.log").exists()  # never launched
