"""`gpudoctor bench load` as shipped against a real third-party server: Hugging Face `transformers serve` 5.17 with
continuous batching, a tiny random-weight Llama on CPU (tests/bench/transformers_lab.py). Every workload kind (closed
loop, open loop, multi-turn, trace replay) on both APIs: every level ok, 0 failed requests, exact output-token counts
(the model has no end-of-text token, so every request produces max_tokens tokens, and the server's usage says so)
(#25, #33). One server for the module; a few short requests each."""

from __future__ import annotations

import json

import pytest

from tests.bench.conftest import run_cli

MAX_TOKENS = 12


@pytest.fixture(scope="module")
def tfserve(tmp_path_factory):
    from tests.bench import transformers_lab as lab

    yield from lab.served(tmp_path_factory)


def records(out) -> list[dict]:
    return [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines() if x.strip()]


@pytest.mark.timeout(1500)  # the first test also builds the model and starts the server (torch imports)
@pytest.mark.parametrize("api", ["completions", "chat"])
def test_every_level_ok_with_exact_output_tokens(tfserve, tmp_path, api):
    out = tmp_path / "out"
    common = ["bench", "load", "--server-url", tfserve.url, "--api", api, "--max-tokens", str(MAX_TOKENS),
              "--out", str(out), "--ready-timeout", "300", "--stall-timeout", "120", "--warmup", "1",
              "--tokenizer-dir", str(tfserve.model)]
    p = run_cli(*common, "--concurrency", "1,4", "--prompts", "6", timeout=600)
    assert p.returncode == 0, p.stderr + tfserve.tail()
    p = run_cli(*common, "--request-rate", "3", "--prompts", "6", timeout=600)
    assert p.returncode == 0, p.stderr + tfserve.tail()
    recs = records(out)
    assert [(r["concurrency"], r["request_rate"]) for r in recs] == [(1, None), (4, None), (None, 3.0)]
    for r in recs:
        assert r["status"] == "ok" and r["failed"] == 0 and r["completed"] == 6, r
        assert r["output_tokens"] == 6 * MAX_TOKENS and r["output_tokens_source"] == "usage", r
        assert r["short_requests"] == 0 and r["server_kind"] == "openai" and r["model"] is None
        # ITL is measured (never missing); on a loaded 2-core machine the CPU server's tokens can reach the client in
        # one read, and a median gap of 0 ms is then what the client saw (CI's trixie stage shares the cores)
        assert r["ttft_ms_p50"] > 0 and r["itl_ms_p50"] is not None and r["itl_ms_p50"] >= 0, r
        assert r["prompt_tokens_mean"] > 0
    assert "server dialect: openai" in p.stderr and "context limit: 4096" in p.stderr


def common(tfserve, api, out) -> list[str]:
    return ["bench", "load", "--server-url", tfserve.url, "--api", api, "--out", str(out), "--ready-timeout", "300",
            "--stall-timeout", "120", "--warmup", "1", "--tokenizer-dir", str(tfserve.model)]


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_multi_turn_sessions_are_exact(tfserve, tmp_path, api):
    out = tmp_path / "out"
    p = run_cli(*common(tfserve, api, out), "--turns", "3", "--concurrency", "2", "--prompts", "2",
                "--max-tokens", str(MAX_TOKENS), timeout=600)
    assert p.returncode == 0, p.stderr + tfserve.tail()
    (r,) = records(out)
    assert r["status"] == "ok" and r["failed"] == 0 and r["completed"] == 6 and r["server_kind"] == "openai", r
    assert r["output_tokens"] == 6 * MAX_TOKENS and r["output_tokens_source"] == "usage" and r["short_requests"] == 0
    turns = r["multi_turn"]["by_turn"]
    assert [t["requests"] for t in turns] == [2, 2, 2]
    # each turn re-sends the conversation with the server's answers: its prompt is longer by at least the answer
    assert turns[1]["prompt_tokens_mean"] >= turns[0]["prompt_tokens_mean"] + MAX_TOKENS
    assert turns[2]["prompt_tokens_mean"] >= turns[1]["prompt_tokens_mean"] + MAX_TOKENS


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_trace_replay_is_exact_in_the_servers_dialect(tfserve, tmp_path, api):
    # Before #33 every trace request carried SGLang's ignore_eos and return_spec_tokens_details: HTTP 422 here.
    outputs = (4, 9, 6, 12, 5, 8)
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": 100 * i, "input_length": 40, "output_length": n,
                                         "hash_ids": [7, 100 + i]}) + "\n" for i, n in enumerate(outputs)))
    out = tmp_path / "out"
    p = run_cli(*common(tfserve, api, out), "--trace", str(trace), "--block-tokens", "16", timeout=600)
    assert p.returncode == 0, p.stderr + tfserve.tail()
    (r,) = records(out)
    assert r["status"] == "ok" and r["failed"] == 0 and r["completed"] == 6 and r["arrival"] == "trace", r
    assert r["output_tokens"] == sum(outputs) and r["output_tokens_target"] == sum(outputs), r
    assert r["output_tokens_source"] == "usage" and r["short_requests"] == 0 and r["server_kind"] == "openai"
    assert r["trace"]["requests"] == 6 and r["trace"]["shared_prefix_tokens"] == 5 * 16
    if api == "completions":  # the prompt the trace asked for, decoded from its token ids and counted by the server
        assert abs(r["prompt_tokens_mean"] - 40) <= 2, r["prompt_tokens_mean"]
