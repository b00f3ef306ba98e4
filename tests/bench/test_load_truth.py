"""The load generator measures what the stand-in is known to do: tok/s, TTFT, ITL, e2e and accept length."""

from __future__ import annotations

import json
import math

import pytest

from tests.bench.conftest import run_cli
from tests.bench.timing import Slack


def records(out):
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def expected_tok_s(prompts: int, conc: int, max_tokens: int, e2e_s: float) -> float:
    return prompts * max_tokens / (math.ceil(prompts / conc) * e2e_s)


def test_speculative_truth(standin, tmp_path):
    # 100 tok/s per request after the first step, 4 tokens per verify step, 50 ms TTFT, 128 tokens:
    # e2e = 0.050 + (128 - 4) / 100 = 1.290 s; per-token ITL = (4 / 100) / 4 = 10 ms; accept length 4 exactly.
    # Requests last long enough that loopback and scheduling overhead (a few ms on a busy 2-core box) stays < 1 %.
    s = standin("--decode-tok-s", "100", "--accept-length", "4", "--ttft-ms", "50")
    out = tmp_path / "out"
    with Slack().during() as slack:  # the lateness around and during the run (timing.py)
        p = run_cli("bench", "load", "--server-url", s.url, "--concurrency", "4,8", "--max-tokens", "128",
                    "--prompts", "8", "--label", "eagle", "--out", str(out))
    assert p.returncode == 0, p.stderr
    recs = records(out)
    assert [r["concurrency"] for r in recs] == [4, 8]
    for r in recs:
        assert r["status"] == "ok" and r["completed"] == r["requests"] == 8
        assert r["accept_length"] == pytest.approx(4.0, abs=1e-9)
        assert r["e2e_ms_p50"] == pytest.approx(1290.0, abs=1290.0 * 0.015 + 2 * slack.p90_ms), slack
        assert 50.0 <= r["ttft_ms_p50"] < 65.0 + 2 * slack.p90_ms, slack  # includes opening the connection
        assert r["itl_ms_p50"] == pytest.approx(10.0, abs=0.5 + slack.p50_ms), slack
        assert r["output_tokens"] == 8 * 128
        assert r["output_tok_per_s"] == pytest.approx(expected_tok_s(8, r["concurrency"], 128, 1.290),
                                                      rel=0.02 + slack.wall_ms / 1290.0), slack
        assert r["label"] == "eagle" and r["workload"] == "builtin:short:out128"


def test_autoregressive_truth_has_no_accept_length(standin, tmp_path):
    # 1 token per step: e2e = 0.020 + 99 / 100 = 1.010 s, ITL 10 ms.
    s = standin("--decode-tok-s", "100", "--ttft-ms", "20")
    out = tmp_path / "out"
    with Slack().during() as slack:  # the lateness around and during the run (timing.py)
        p = run_cli("bench", "load", "--server-url", s.url, "--concurrency", "4", "--max-tokens", "100",
                    "--prompts", "8", "--out", str(out), "--json")
    assert p.returncode == 0, p.stderr
    (r,) = records(out)
    assert json.loads(p.stdout) == r
    assert r["status"] == "ok" and r["accept_length"] is None
    assert r["e2e_ms_p50"] == pytest.approx(1010.0, abs=1010.0 * 0.015 + 2 * slack.p90_ms), slack
    assert r["itl_ms_p50"] == pytest.approx(10.0, abs=0.5 + slack.p50_ms), slack
    assert r["output_tok_per_s"] == pytest.approx(expected_tok_s(8, 4, 100, 1.010),
                                                  rel=0.02 + slack.wall_ms / 1010.0), slack


def test_fractional_accept_length_is_token_weighted(standin, tmp_path):
    # accept 2.5: steps carry 2,3,2,3,...; 100 tokens take 40 steps, so the truth is exactly 2.5.
    s = standin("--decode-tok-s", "2000", "--accept-length", "2.5")
    out = tmp_path / "out"
    p = run_cli("bench", "load", "--server-url", s.url, "--concurrency", "2", "--max-tokens", "100",
                "--prompts", "4", "--out", str(out))
    assert p.returncode == 0, p.stderr
    (r,) = records(out)
    assert r["accept_length"] == pytest.approx(2.5, abs=1e-9)


def test_rerun_into_same_dir_adds_no_duplicates(standin, tmp_path):
    s = standin("--decode-tok-s", "5000")
    out = tmp_path / "out"
    args = ["bench", "load", "--server-url", s.url, "--concurrency", "1,2", "--max-tokens", "8", "--prompts", "2",
            "--out", str(out)]
    assert run_cli(*args).returncode == 0
    first = (out / "results.jsonl").read_text()
    again = run_cli(*args)  # everything is recorded ok: nothing measured, and it says so (#25)
    assert again.returncode == 0 and "nothing measured: all 2 levels are already recorded ok" in again.stderr
    assert (out / "results.jsonl").read_text() == first
    assert len(first.splitlines()) == 2
