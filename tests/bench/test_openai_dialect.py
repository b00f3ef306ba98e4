"""Any OpenAI-compatible server, not only SGLang and vLLM: the dialect, the end of a stream, the model name, the
prompt's wire form, the context limit and re-runs (#25).

The server is the stand-in's strict OpenAI flavour (`--flavor openai`: transformers serve 5.17 as it behaves, each
request validated against the `openai` package's types) or the raw SSE server for byte-level stream endings. The
same client runs against real `transformers serve` in tests/bench/test_transformers_serve.py.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from gpudoctor.bench.standin import wire
from gpudoctor.bench.client.load import new_session
from gpudoctor.bench.client.openai import OpenAIParser, request_body
from gpudoctor.bench.client.prompts import build, load_source
from gpudoctor.bench.client.stream import stream_request
from gpudoctor.bench.client.tokens import load_counter
from tests import needs
from tests.bench.conftest import run_cli
from tests.bench.test_stream import raw_server  # noqa: F401  (the fixture)

needs.module("openai", "the strict flavour validates against the `openai` package")
OPENAI, SGLANG, VLLM = "openai", "sglang", "vllm"  # gpudoctor.bench.client.openai.SERVER_KINDS


def records(out) -> list[dict]:
    path = out / "results.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def load(url, out, *extra, timeout=120):
    return run_cli("bench", "load", "--server-url", url, "--out", str(out), "--warmup", "1", *extra,
                   timeout=timeout)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    """A tokenizer.json trained here (byte-level BPE, `tokenizers` from the test extra) and a config.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    d = tmp_path_factory.mktemp("tok")
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(load_source("builtin") * 20, trainer)
    tok.save(str(d / "tokenizer.json"))
    (d / "config.json").write_text(json.dumps({"max_position_embeddings": 200}))
    return d


# ---- 1. the dialect ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("api", ["completions", "chat"])
def test_standard_requests_carry_only_openai_schema_fields(api):
    body = json.loads(request_body({"text": "hi", "input_ids": [1, 2]}, 8, api, "m", OPENAI))
    assert wire.strict_unexpected(body, api == "chat") is None
    assert "ignore_eos" not in body and body["stream_options"] == {"include_usage": True}
    ext = json.loads(request_body({"text": "hi"}, 8, api, "m", SGLANG))
    assert wire.strict_unexpected(ext, api == "chat") is not None  # the SGLang/vLLM extensions stay for them
    assert ext["ignore_eos"] is True and ext["stream_options"]["continuous_usage_stats"] is True


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_strict_server_closed_and_open_loop_every_level_ok(standin, tmp_path, api):
    s = standin("--flavor", "openai", "--model-path", "/models/tiny", "--decode-tok-s", "400")
    out = tmp_path / "out"
    p = load(s.url, out, "--api", api, "--concurrency", "1,4", "--max-tokens", "12", "--prompts", "8")
    assert p.returncode == 0, p.stderr
    p = load(s.url, out, "--api", api, "--request-rate", "20", "--max-tokens", "12", "--prompts", "8")
    assert p.returncode == 0, p.stderr
    recs = records(out)
    assert [r["status"] for r in recs] == ["ok"] * 3
    for r in recs:
        assert r["failed"] == 0 and r["completed"] == 8 and r["output_tokens"] == 96
        assert r["output_tokens_source"] == "usage" and r["short_requests"] == 0 and r["server_kind"] == "openai"
    assert "server dialect: openai" in p.stderr and "96/96 output tokens (usage)" in p.stderr
    assert "Unexpected fields" not in s.log_text()


def test_short_answers_are_recorded_as_such_not_as_errors(standin, tmp_path):
    s = standin("--flavor", "openai", "--decode-tok-s", "400", "--eos-after", "5")
    out = tmp_path / "out"
    p = load(s.url, out, "--api", "completions", "--concurrency", "2", "--max-tokens", "16", "--prompts", "6")
    assert p.returncode == 0, p.stderr
    (r,) = records(out)
    assert r["status"] == "ok" and r["failed"] == 0
    assert r["output_tokens"] == 30 and r["output_tokens_target"] == 96 and r["short_requests"] == 6
    assert "6 of 6 requests ended before max_tokens 16 (finish_reason stop" in r["length_note"]
    assert "30/96 output tokens (usage)" in p.stderr


def test_server_kind_detected_from_what_sglang_and_vllm_answer(standin):
    from gpudoctor.bench.client.openai import detect_kind

    assert asyncio.run(detect_kind(standin("--decode-tok-s", "500").url))[0] == SGLANG
    assert asyncio.run(detect_kind(standin("--flavor", "vllm", "m", "--decode-tok-s", "500").url))[0] == VLLM
    assert asyncio.run(detect_kind(standin("--flavor", "openai").url))[0] == OPENAI


def test_tokens_without_usage_come_from_the_tokenizer_and_say_so(tokenizer_dir):
    from gpudoctor.bench.client.openai import parser_for
    from gpudoctor.bench.client.stream import RequestResult

    counter = load_counter(str(tokenizer_dir))
    events = [{"choices": [{"index": 0, "text": "the cache"}]}, {"choices": [{"index": 0, "text": " model layers"}]},
              {"choices": [{"index": 0, "text": "", "finish_reason": "length"}]}]
    for cls, want, source in ((parser_for(counter), len(counter.encode("the cache model layers")), "tokenizer"),
                              (OpenAIParser, 2, "estimate")):
        r = RequestResult()
        p = cls(r)
        for t, ev in enumerate(events):
            p.feed(b"data: " + json.dumps(ev).encode(), now=0.1 * (t + 1), st=0.0)
        assert p.finish() is None and p.ended
        assert r.output_tokens == want and r.tokens_source == source and r.finish_reason == "length"
    assert want != len(counter.encode("the cache model layers"))  # the two sources really differ here


# ---- 2. the end of a stream ------------------------------------------------------------------------------------
def oa_fetch(url, scenario):
    async def go():
        async with new_session(1) as s:
            body = json.dumps({"prompt": scenario}).encode()
            return await stream_request(s, url.replace("/generate", "/v1/completions"), body, 5, None, OpenAIParser)

    return asyncio.run(go())


@pytest.mark.parametrize("scenario", ["oa-final", "oa-final-nolf"])
def test_a_final_chunk_then_a_clean_close_is_a_complete_stream(raw_server, scenario):  # noqa: F811
    r = oa_fetch(raw_server, scenario)
    assert r.ok, r.error
    assert r.output_tokens == 4 and r.tokens_source == "usage" and r.prompt_tokens == 3  # 3 content chunks, 4 tokens
    assert r.chunks == 4 and len(r.itl_s) == 2  # the usage-only final chunk is the total, not a step


def test_a_stream_cut_before_its_final_chunk_is_a_failure(raw_server):  # noqa: F811
    r = oa_fetch(raw_server, "oa-cut")
    assert not r.ok and r.kind == "disconnect" and "without [DONE] after 2 tokens" in r.error


def test_an_unescaped_error_event_is_shown_verbatim(raw_server):  # noqa: F811
    r = oa_fetch(raw_server, "oa-error")
    assert not r.ok and r.kind == "stream_error"
    assert r.error == 'error in stream: CUDA error: "device-side assert" triggered'


def test_strict_server_error_event_reaches_the_record(standin, tmp_path):
    s = standin("--flavor", "openai", "--decode-tok-s", "400", "--fail-mode", "error-chunk",
                "--fail-after-requests", "2")
    out = tmp_path / "out"
    p = load(s.url, out, "--api", "chat", "--concurrency", "1", "--max-tokens", "4", "--prompts", "4",
             "--warmup", "0")
    assert p.returncode == 2
    (r,) = records(out)
    assert r["status"] == "error" and 'stand-in fault: "error-chunk"' in r["error"] and "[DONE]" not in r["error"]


# ---- 3. the model -------------------------------------------------------------------------------------------
def test_pinned_server_with_other_models_cached_gets_no_model_name(standin, tmp_path):
    s = standin("--flavor", "openai", "--model-path", "/models/tiny", "--hub-models", "org/a,org/b",
                "--decode-tok-s", "400")
    out = tmp_path / "out"
    p = load(s.url, out, "--api", "completions", "--concurrency", "2", "--max-tokens", "4", "--prompts", "4")
    assert p.returncode == 0, p.stderr
    assert "lists 2 models (org/a, org/b): requests name none" in p.stderr
    assert records(out)[0]["model"] is None
    p = load(s.url, tmp_path / "out2", "--api", "completions", "--concurrency", "2", "--max-tokens", "4",
             "--prompts", "4", "--model", "/models/tiny")
    assert p.returncode == 0, p.stderr
    assert records(tmp_path / "out2")[0]["model"] == "/models/tiny"


def test_readiness_stops_at_a_permanent_4xx_with_the_servers_words(standin, tmp_path):
    s = standin("--flavor", "openai", "--model-path", "/models/tiny")
    t0 = time.monotonic()
    p = load(s.url, tmp_path / "out", "--api", "completions", "--concurrency", "1", "--max-tokens", "4",
             "--model", "org/other", "--ready-timeout", "60")
    assert p.returncode == 2 and time.monotonic() - t0 < 30
    (r,) = records(tmp_path / "out")
    assert r["status"] == "error" and "HTTP 400: Server is pinned to '/models/tiny'; requested 'org/other'." in r["error"]


def test_model_cards_as_servers_answer(standin):
    from gpudoctor.bench.client.levels import server_context_limit
    from gpudoctor.bench.client.openai import model_cards

    v = standin("--flavor", "vllm", "served", "--max-model-len", "8192", "--decode-tok-s", "500")
    cards, why = asyncio.run(model_cards(v.url))
    assert [c["id"] for c in cards] == ["served"] and why is None
    assert asyncio.run(server_context_limit(v.url)) == 8192
    o = standin("--flavor", "openai", "--hub-models", "org/a")
    assert [c["id"] for c in asyncio.run(model_cards(o.url))[0]] == ["org/a"]


# ---- 4. the prompt's wire form --------------------------------------------------------------------------------
def test_tokenizer_dir_never_changes_a_string_endpoints_wire_form(standin, tmp_path, tokenizer_dir):
    from gpudoctor.bench.client.prompts import as_text

    counter = load_counter(str(tokenizer_dir))
    p = build(2, load_source("builtin"), counter, 150)[0]
    assert p.input_ids is not None and p.tokens == 150
    t = as_text(p, counter)
    assert isinstance(t.text, str) and t.exact and t.tokens == len(counter.encode(t.text))
    assert json.loads(request_body(t.payload(), 4, "completions", None, OPENAI))["prompt"] == t.text
    assert json.loads(request_body(p.payload(), 4, "completions", None, VLLM))["prompt"] == p.input_ids
    s = standin("--flavor", "openai", "--decode-tok-s", "400")
    out = tmp_path / "out"
    r = load(s.url, out, "--api", "completions", "--concurrency", "2", "--max-tokens", "4", "--prompts", "4",
             "--tokenizer-dir", str(tokenizer_dir), "--context-len", "150")
    assert r.returncode == 0, r.stderr
    assert records(out)[0]["status"] == "ok" and "prompt must be a string" not in s.log_text()


# ---- 4b. trace replay in the server's dialect (#33) --------------------------------------------------------------
def small_trace(path, outputs=(3, 7, 5, 6, 4, 8)) -> int:
    """A trace of len(outputs) requests 40 ms apart, output lengths as given, a shared 16-token block; their sum."""
    with open(path, "w") as fh:
        for i, n in enumerate(outputs):
            fh.write(json.dumps({"timestamp": 40 * i, "input_length": 40, "output_length": n,
                                 "hash_ids": [7, 100 + i]}) + "\n")
    return sum(outputs)


def test_request_fields_follow_the_apispec_table():
    from gpudoctor.bench.client import apispec

    for kind in (SGLANG, VLLM, OPENAI):
        for api in ("completions", "chat"):
            body = json.loads(request_body({"text": "hi"}, 8, api, "m", kind))
            sent = set(body) | {f"stream_options.{k}" for k in body["stream_options"]}
            sent -= {"stream_options"}
            table = {name for name, kinds, _ in apispec.REQUEST_FIELDS if kind in kinds}
            assert sent <= table, (kind, api, sent - table)
            for field in ("ignore_eos", "return_spec_tokens_details", "stream_options.continuous_usage_stats"):
                assert (field in sent) == apispec.takes(kind, field), (kind, field)
    vllm = json.loads(request_body({"text": "hi"}, 8, "completions", "m", VLLM))
    assert vllm["ignore_eos"] is True and "return_spec_tokens_details" not in vllm  # SGLang's field, not vLLM's


@pytest.mark.parametrize("tokenizer", [False, True])
def test_trace_replay_speaks_a_strict_servers_dialect(standin, tmp_path, tokenizer_dir, tokenizer):
    # Against transformers serve the trace's requests carried SGLang's ignore_eos and return_spec_tokens_details:
    # HTTP 422 on every request, although multi-turn on the same server worked (#33).
    trace = tmp_path / "t.jsonl"
    want = small_trace(trace)
    s = standin("--flavor", "openai", "--decode-tok-s", "400")
    out = tmp_path / "out"
    extra = ("--tokenizer-dir", str(tokenizer_dir)) if tokenizer else ()  # token-id prompts must go as text
    p = load(s.url, out, "--api", "completions", "--trace", str(trace), "--block-tokens", "16", *extra)
    assert p.returncode == 0, p.stderr + s.log_text()[-2000:]
    (r,) = records(out)
    assert r["status"] == "ok" and r["failed"] == 0 and r["completed"] == 6 and r["server_kind"] == "openai"
    assert r["output_tokens"] == want and r["output_tokens_target"] == want and r["short_requests"] == 0, r
    assert r.get("length_note") is None and "Unexpected fields" not in s.log_text()
    assert "server dialect: openai" in p.stderr


def test_trace_replay_honours_server_kind(standin, tmp_path):
    trace = tmp_path / "t.jsonl"
    want = small_trace(trace)
    s = standin("--decode-tok-s", "400")  # SGLang answers as SGLang; the user says to speak OpenAI's schema only
    out = tmp_path / "out"
    p = load(s.url, out, "--api", "completions", "--trace", str(trace), "--block-tokens", "16",
             "--server-kind", "openai")
    assert p.returncode == 0, p.stderr
    (r,) = records(out)
    assert r["status"] == "ok" and r["server_kind"] == "openai" and r["output_tokens"] == want
    assert "server dialect:" not in p.stderr  # named, not detected


# ---- 5. the context limit -------------------------------------------------------------------------------------
def test_context_limit_from_the_local_config_json_else_one_line(standin, tmp_path, tokenizer_dir):
    s = standin("--flavor", "openai", "--decode-tok-s", "400")
    p = load(s.url, tmp_path / "a", "--api", "completions", "--concurrency", "1", "--max-tokens", "60",
             "--prompts", "2", "--tokenizer-dir", str(tokenizer_dir), "--context-len", "150")
    assert p.returncode == 2
    (r,) = records(tmp_path / "a")
    assert r["status"] == "skipped" and "> context limit 200" in r["error"]
    assert f"context limit: 200 (from {tokenizer_dir}/config.json" in p.stderr
    p = load(s.url, tmp_path / "b", "--api", "completions", "--concurrency", "1", "--max-tokens", "4",
             "--prompts", "2")
    assert p.returncode == 0, p.stderr
    lines = [x for x in p.stderr.splitlines() if "fit check is off" in x]
    assert len(lines) == 1 and "--context-limit N" in lines[0]


# ---- 6. re-runs ------------------------------------------------------------------------------------------------
def test_a_failed_level_is_measured_again_and_nothing_measured_says_so(standin, tmp_path):
    out = tmp_path / "out"
    bad = standin("--decode-tok-s", "500", "--fail-mode", "http500", "--fail-after-requests", "3")
    p = load(bad.url, out, "--concurrency", "1", "--max-tokens", "4", "--prompts", "4", "--warmup", "0")
    assert p.returncode == 2 and records(out)[0]["status"] == "error"
    good = standin("--decode-tok-s", "500")
    p = load(good.url, out, "--concurrency", "1", "--max-tokens", "4", "--prompts", "4", "--warmup", "0")
    assert p.returncode == 0, p.stderr
    (r,) = records(out)
    assert r["status"] == "ok" and r["completed"] == 4
    assert json.loads((out / "retracted.jsonl").read_text())["status"] == "error"
    p = load(good.url, out, "--concurrency", "1", "--max-tokens", "4", "--prompts", "4", "--warmup", "0")
    assert p.returncode == 0 and "nothing measured: all 1 levels are already recorded ok" in p.stderr


def test_warmup_failure_record_carries_its_counters(standin, tmp_path):
    s = standin("--decode-tok-s", "500", "--fail-mode", "http500", "--fail-after-requests", "1")
    out = tmp_path / "out"
    p = load(s.url, out, "--concurrency", "1,2", "--max-tokens", "4", "--prompts", "4", "--warmup", "2")
    assert p.returncode == 2
    first = records(out)[0]
    assert first["status"] == "error" and "warm-up failed" in first["error"]
    assert first["failed"] >= 1 and first["error_rate"] is not None and first["error_rate"] > 0
    assert f"{first['failed']} of 2 requests failed" in first["error"]
