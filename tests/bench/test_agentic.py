"""Multi-turn sessions and trace replay against the stand-in's prefix cache: per-turn TTFT and cached tokens, shared
trace prefixes and the replay's rate, held to the stand-in's known truth."""

from __future__ import annotations

import json
import math

import pytest

from gpudoctor.bench.standin.wire import WORDS
from tests.bench.conftest import run_cli
from tests.bench.fakenvml import assert_real_health
from tests.bench.timing import Slack

TTFT_MS = 300.0


def records(out):
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def tokens(text: str) -> int:  # the stand-in's count of a text prompt: 4 characters a token, rounded up
    return max(1, math.ceil(len(text) / 4))


def test_three_turns_at_concurrency_4_match_the_standins_truth(standin, tmp_path):
    systems = [f"{c}: you are agent {c}, terse and exact; reply with the tool call only." for c in "ABCD"]
    users = ["Find the failing test in tests/ and print its name please.",
             "Open that file and show me the assertion which fails.",
             "Write the smallest patch that makes the assertion pass."]
    conv = tmp_path / "conv.jsonl"
    conv.write_text("".join(json.dumps({"system": s, "turns": users}) + "\n" for s in systems))
    timing = tmp_path / "timing.jsonl"
    s = standin("--prefix-cache", "--ttft-ms", str(TTFT_MS), "--decode-tok-s", "4000", "--timing-log", str(timing))
    out = tmp_path / "out"
    with Slack().during() as slack:
        p = run_cli("bench", "load", "--server-url", s.url, "--turns", "3", "--concurrency", "4", "--prompts", "4",
                    "--conversations", str(conv), "--max-tokens", "16", "--out", str(out))
    assert p.returncode == 0, p.stderr
    (r,) = records(out)
    assert r["status"] == "ok" and r["completed"] == 12 and r["workload"] == "conv:turns3:out16"
    answer = "".join(" " + WORDS[i % len(WORDS)] for i in range(16))  # what the stand-in writes for 16 tokens
    # The truth: turn k re-sends turn k-1's prompt and answer; the stand-in cached both, so that much is a hit.
    p1 = f"{systems[0]}\n\nUser: {users[0]}\nAssistant:"
    p2 = p1 + answer + f"\nUser: {users[1]}\nAssistant:"
    p3 = p2 + answer + f"\nUser: {users[2]}\nAssistant:"
    want = [(tokens(p1), 0), (tokens(p2), len(p1 + answer) // 4), (tokens(p3), len(p2 + answer) // 4)]
    m = r["multi_turn"]
    assert m["cached_tokens_source"] == "meta_info.cached_tokens" and m["sessions"] == 4
    for t, (prompt, cached) in zip(m["by_turn"], want):
        assert t["requests"] == 4
        assert t["prompt_tokens_mean"] == prompt and t["cached_tokens_mean"] == cached, (t, prompt, cached)
        truth = TTFT_MS * (prompt - cached) / prompt  # the stand-in's TTFT: its ttft x the uncached share
        # Four requests a turn on a loaded 2-core machine: the stand-in's own process waits for a core too.
        assert t["ttft_ms_p50"] == pytest.approx(truth, abs=10.0 + 4 * slack.p90_ms), (t, truth, slack)
    assert m["by_turn"][2]["ttft_ms_p50"] < m["by_turn"][0]["ttft_ms_p50"] / 3
    assert m["cache_hit_rate"] == pytest.approx(sum(c for _, c in want) / sum(p for p, _ in want))
    served = [json.loads(x) for x in timing.read_text().splitlines()]
    got = sorted((x["prompt_tokens"], x["cached_tokens"]) for x in served if x["prompt_tokens"] >= want[0][0])  # not the warm-up
    assert got == sorted(want * 4)  # the server's own account of every turn of every session
    for x in served:  # and its own clock: the first token went out after --ttft-ms x the uncached share
        if x["prompt_tokens"] >= want[0][0]:
            truth = TTFT_MS * (x["prompt_tokens"] - x["cached_tokens"]) / x["prompt_tokens"] / 1000
            assert truth - 0.002 <= x["first_sent"] - x["received"] <= truth + 0.010 + 4 * slack.p90_ms / 1000, x
    assert r["cache"]["action"] == "flushed (POST /flush_cache)" and r["cache"]["before"]["cached_tokens"] > 0
    assert_real_health(r["host_health"])  # here: no NVML, said with the reason
    assert r["suspect"] is None
    rep = run_cli("bench", "report", str(out), "--no-plots")
    assert rep.returncode == 0, rep.stderr
    md = (out / "report.md").read_text()
    assert "## Multi-turn sessions" in md and f"{m['cache_hit_rate']:.1%}" in md


def test_keep_policy_leaves_the_cache(standin, tmp_path):
    s = standin("--prefix-cache", "--decode-tok-s", "4000")
    out = tmp_path / "out"
    p = run_cli("bench", "load", "--server-url", s.url, "--turns", "2", "--concurrency", "2", "--max-tokens", "8",
                "--cache", "keep", "--out", str(out))
    assert p.returncode == 0, p.stderr
    (r,) = records(out)
    assert r["cache"]["action"] == "kept (policy keep)" and r["multi_turn"]["by_turn"][1]["cached_tokens_mean"] > 0


def test_chat_sessions_read_cached_tokens_from_usage(standin, tmp_path):
    s = standin("--prefix-cache", "--enable-cache-report", "--decode-tok-s", "4000")
    out = tmp_path / "out"
    p = run_cli("bench", "load", "--server-url", s.url, "--api", "chat", "--turns", "2", "--concurrency", "2",
                "--max-tokens", "8", "--out", str(out))
    assert p.returncode == 0, p.stderr
    (r,) = records(out)
    m = r["multi_turn"]
    assert m["cached_tokens_source"] == "usage.prompt_tokens_details.cached_tokens"
    first, second = m["by_turn"]
    assert second["cached_tokens_mean"] > 0 and 0 < m["cache_hit_rate"] < 1
    # the second turn re-sends the first's messages and answer: all of its first turn is cached
    assert second["cached_tokens_mean"] >= first["prompt_tokens_mean"] - 4


def test_a_server_that_does_not_say_is_unknown(standin, tmp_path):
    s = standin("--prefix-cache", "--decode-tok-s", "4000")  # no --enable-cache-report: /v1 usage has no details
    out = tmp_path / "out"
    p = run_cli("bench", "load", "--server-url", s.url, "--api", "completions", "--turns", "2", "--concurrency", "1",
                "--max-tokens", "8", "--out", str(out))
    assert p.returncode == 0, p.stderr
    (r,) = records(out)
    assert r["multi_turn"]["cache_hit_rate"] == "unknown" and r["multi_turn"]["cached_tokens_source"] == "unknown"
    assert r["multi_turn"]["by_turn"][1]["cached_tokens_mean"] == "unknown"


def make_trace(path, n=200, gap_ms=20.0, block=64, groups=10):
    """n requests every gap_ms; request i shares two leading blocks with every request of its group (i % groups)
    and has a third of its own."""
    with open(path, "w") as fh:
        for i in range(n):
            g = i % groups
            fh.write(json.dumps({"timestamp": round(i * gap_ms, 3), "input_length": 3 * block, "output_length": 4,
                                 "hash_ids": [1000 * g, 1000 * g + 1, 10_000 + i]}) + "\n")


def test_trace_of_200_replays_on_time_with_shared_prefixes_cached(standin, tmp_path):
    trace = tmp_path / "mooncake.jsonl"
    make_trace(trace)
    s = standin("--prefix-cache", "--ttft-ms", "2", "--decode-tok-s", "2000")
    out = tmp_path / "out"
    with Slack().during() as slack:
        p = run_cli("bench", "load", "--server-url", s.url, "--trace", str(trace), "--time-scale", "0.5",
                    "--block-tokens", "64", "--out", str(out))
    assert p.returncode == 0, p.stderr
    (r,) = records(out)
    assert r["status"] == "ok" and r["completed"] == 200 and r["arrival"] == "trace"
    assert r["request_rate"] == pytest.approx(199 / (199 * 0.010))  # 20 ms gaps x 0.5
    t = r["trace"]
    span_ms = 199 * 10.0
    assert abs(t["rate_error"]) < 0.01 + 2 * slack.p90_ms / span_ms, (t, slack)
    assert r["send_late_ms_p99"] is not None and t["late_ms_max"] is not None
    assert t["shared_prefix_tokens"] == 190 * 128  # all but each group's first share two 64-token blocks
    assert t["requests_sharing"] == 190 and t["requests_sharing_cached"] == 190
    assert 190 * 128 <= t["cached_tokens"] <= 190 * 128 * 1.05  # + what unrelated blocks share by chance
    assert r["prompt_tokens_mean"] == 192
    rep = run_cli("bench", "report", str(out), "--no-plots")
    assert rep.returncode == 0 and "## Trace replay" in (out / "report.md").read_text()


@pytest.mark.parametrize("line, msg", [
    ('{"timestamp": 0, "input_length": 0, "output_length": 4}', "input_length must be a number >= 1"),
    ('{"timestamp": 0, "input_length": 8, "output_length": 4, "hash_ids": ["a"]}', "hash_ids must be a list"),
    ('{"timestamp": 5, "input_length": 8, "output_length": 4}\n{"timestamp": 1, "input_length": 8, '
     '"output_length": 4}', "is before the previous line"),
    ("not json", "not valid JSON"),
])
def test_bad_trace_is_file_line_exit_3(tmp_path, line, msg):
    trace = tmp_path / "t.jsonl"
    trace.write_text(line + "\n")
    p = run_cli("bench", "load", "--server-url", "http://127.0.0.1:9", "--trace", str(trace), "--out",
                str(tmp_path / "out"), "--context-limit", "4096")
    assert p.returncode == 3 and "Traceback" not in p.stderr
    assert f"{trace}:{len(line.splitlines())}" in p.stderr and msg in p.stderr, p.stderr
    assert not (tmp_path / "out").exists()


def test_bad_conversations_is_file_line_exit_3(tmp_path):
    conv = tmp_path / "c.jsonl"
    conv.write_text('{"turns": ["one", "two"]}\n{"turns": ["only one"]}\n')
    p = run_cli("bench", "load", "--server-url", "http://127.0.0.1:9", "--turns", "2", "--conversations", str(conv),
                "--max-tokens", "8", "--out", str(tmp_path / "out"), "--context-limit", "4096")
    assert p.returncode == 3 and f"{conv}:2" in p.stderr and "has 1 user turns" in p.stderr, p.stderr


def test_campaign_with_turns_and_trace_workloads(tmp_path):
    import sys
    import textwrap

    from tests.bench.conftest import free_port

    (tmp_path / "model").mkdir()
    make_trace(tmp_path / "t.jsonl", n=40, gap_ms=10.0, block=16, groups=4)
    path = tmp_path / "c.yaml"
    path.write_text(textwrap.dedent(f"""\
        model: {tmp_path}/model
        server:
          command: [{sys.executable}, -m, gpudoctor.bench.standin, --decode-tok-s, "4000", --prefix-cache]
          port: {free_port()}
        gate: {{command: null}}
        tp: [1]
        concurrency: [2]
        timeouts: {{ready_s: 90, stall_s: 15, stop_s: 5, gpu_release_s: 5}}
        methods: {{baseline: {{}}}}
        workloads:
          - {{name: agent, turns: 2, think_ms: 20, max_tokens: [8]}}
          - {{name: replay, trace: t.jsonl, block_tokens: 16, trials: 2}}
        """))
    out = tmp_path / "run"
    p = run_cli("bench", "run", str(path), "--out", str(out))
    assert p.returncode == 0, p.stderr
    recs = records(out)
    assert [(r["workload"], r["trial"]) for r in recs] == [
        ("agent:turns2:out8", 0), ("replay:trace:x1", 0), ("replay:trace:x1", 1)]
    agent, *replays = recs
    assert agent["multi_turn"]["sessions"] == 2 and agent["multi_turn"]["by_turn"][1]["cached_tokens_mean"] > 0
    for r in replays:
        assert r["completed"] == 40 and r["trace"]["requests_sharing_cached"] == 36 and r["concurrency"] is None
    assert all(r["cache"]["action"] == "flushed (POST /flush_cache)" for r in recs)
    bad = path.read_text().replace("trace: t.jsonl", "trace: t.jsonl, max_tokens: [8]")
    path.write_text(bad)
    p = run_cli("bench", "run", str(path), "--out", str(tmp_path / "run2"))
    assert p.returncode == 3 and "no max_tokens or context_lengths" in p.stderr and f"{path}:" in p.stderr
