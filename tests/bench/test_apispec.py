"""The stand-in against SGLang 0.5.23's wire format (gpudoctor/bench/client/apispec.py, cited to SGLang's source), and the
client against what that format does: abort chunks, cumulative output_ids, timing fields only with --enable-metrics,
/v1/models, slow health checks, the 5 s keep-alive, and transport timings recorded apart from server time."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
import urllib.request

import pytest

from gpudoctor.bench.client import apispec
from gpudoctor.bench.client.load import new_session, send_all
from gpudoctor.bench.client.openai import PATHS, OpenAIParser, request_body
from gpudoctor.bench.client.stream import stream_request

ORDER = [name for name, _, _ in apispec.META_FIELDS]
WHEN = {name: when for name, when, _ in apispec.META_FIELDS}


def sse_events(url: str, body: dict, timeout: float = 10) -> tuple[int, list]:
    """Status and the decoded `data:` events of one streamed request ([DONE] as the string)."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        raw = resp.read().decode()
        status = resp.status
    out = []
    for ev in raw.split("\n\n"):
        if ev.startswith("data: "):
            payload = ev[6:]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return status, out


def native(url, max_new=7, **extra):
    return sse_events(url + "/generate", {"text": "hello there", "stream": True,
                                          "sampling_params": {"max_new_tokens": max_new, "ignore_eos": True},
                                          **extra})


def in_table_order(keys: list[str]) -> bool:
    """meta_info keys appear in the order _handle_batch_output builds them (response_sent_to_client_ts, added by
    _wait_one_response, comes last on the first chunk, or among the metrics fields on the final one)."""
    pos = [ORDER.index(k) for k in keys if k != "response_sent_to_client_ts"]
    return pos == sorted(pos)


def test_native_chunks_have_exactly_the_0_5_23_fields(standin):
    s = standin("--decode-tok-s", "500", "--accept-length", "2.5", "--ttft-ms", "5")
    status, events = native(s.url)
    assert status == 200 and events[-1] == "[DONE]"
    chunks = events[:-1]
    assert len(chunks) == 3  # 7 tokens in steps of 2, 3, 2
    for i, c in enumerate(chunks):
        assert tuple(c) == apispec.CHUNK_KEYS
        meta = c["meta_info"]
        final = i == len(chunks) - 1
        want = {n for n, w in WHEN.items() if w == "every" or (final and w in ("final", "spec-final"))}
        if i == 0:
            want.add("response_sent_to_client_ts")
        assert set(meta) == want, (i, set(meta) ^ want)
        assert in_table_order(list(meta))
        assert not set(meta) & set(apispec.NOT_IN_0_5_23)
        # output_ids are cumulative, like text: every chunk repeats all tokens so far
        assert c["output_ids"] == list(range(meta["completion_tokens"]))
        assert len(c["text"].split()) == meta["completion_tokens"]
    final = chunks[-1]["meta_info"]
    assert final["finish_reason"] == {"type": "length", "length": 7}
    assert final["spec_verify_ct"] == 3 and final["spec_accept_length"] == pytest.approx(7 / 3)
    assert final["spec_num_proposed_drafts"] == 3 * (3 - 1)  # verify_ct x (num_draft_tokens - 1), draft tokens 3
    assert final["spec_num_correct_drafts"] == 7 - 3
    assert sum(final["spec_correct_drafts_histogram"]) == 3


def test_timing_fields_only_with_enable_metrics(standin):
    plain = standin("--decode-tok-s", "500", "--ttft-ms", "20")
    _, ev = native(plain.url)
    assert not any(k in c["meta_info"] for c in ev[:-1] for k in ("request_received_ts", "prefill_finished_time"))
    timed = standin("--decode-tok-s", "500", "--ttft-ms", "20", "--enable-metrics")
    _, ev = native(timed.url)
    chunks = [c["meta_info"] for c in ev[:-1]]
    every = {n for n, w in WHEN.items() if w == "metrics-every"}
    assert all(every <= set(m) for m in chunks)
    final = chunks[-1]
    assert {n for n, w in WHEN.items() if w == "metrics-final"} <= set(final)
    assert not any(k in m for k in ("request_received_ts", "request_finished_ts") for m in chunks[:-1])
    # the server's own TTFT from its own stamps: first write - arrival = the configured 20 ms
    assert final["response_sent_to_client_ts"] == chunks[0]["response_sent_to_client_ts"]
    server_ttft = final["response_sent_to_client_ts"] - final["request_received_ts"]
    assert 0.019 <= server_ttft < 0.040
    assert final["request_finished_ts"] >= final["prefill_finished_time"] >= final["request_received_ts"]


def test_incremental_streaming_output_sends_deltas(standin):
    s = standin("--decode-tok-s", "0", "--incremental-streaming-output")
    _, ev = native(s.url, max_new=4)
    assert [c["output_ids"] for c in ev[:-1]] == [[0], [1], [2], [3]]


def test_queue_full_is_an_abort_chunk_over_http_200(standin):
    # One running, one queued: the third concurrent request would queue beyond --max-queued-requests 1.
    s = standin("--decode-tok-s", "40", "--max-running", "1", "--max-queued-requests", "1")

    async def go(api):
        bodies = [request_body({"text": f"q{i}"}, 12, api, "standin/model") for i in range(3)]
        async with new_session(3) as session:
            return (await send_all(session, s.url + PATHS[api], bodies, 3, 10, api=api, max_error_rate=0.5))[0]

    for api in ("native", "completions"):
        results = asyncio.run(go(api))
        aborted = [r for r in results if not r.ok]
        assert len(aborted) == 1 and sum(r.ok for r in results) == 2, [r.error for r in results]
        r = aborted[0]
        assert r.kind == "abort" and "status 503" in r.error and apispec.QUEUE_FULL_MESSAGE in r.error, r.error
    # The raw native abort: the documented keys, then [DONE], status 200.
    threads = []
    import threading

    out = {}

    def hold(i):
        out[i] = native(s.url, max_new=12)

    for i in range(2):
        threads.append(threading.Thread(target=hold, args=(i,)))
        threads[-1].start()
        time.sleep(0.1)
    status, ev = native(s.url, max_new=12)
    for t in threads:
        t.join()
    assert status == 200 and ev[-1] == "[DONE]" and len(ev) == 2
    meta = ev[0]["meta_info"]
    assert tuple(meta) == (*apispec.ABORT_META, "response_sent_to_client_ts")
    assert tuple(meta["finish_reason"]) == apispec.ABORT_FINISH_KEYS
    assert meta["finish_reason"]["status_code"] == 503 and meta["completion_tokens"] == 0
    assert ev[0]["output_ids"] == [] and ev[0]["text"] == ""


def test_v1_models_usage_per_chunk_and_spec_details(standin):
    s = standin("--decode-tok-s", "500", "--accept-length", "3", "--served-model-name", "llama-70b")
    with urllib.request.urlopen(s.url + "/v1/models", timeout=5) as r:
        models = json.loads(r.read())
    assert models["object"] == "list" and tuple(models["data"][0]) == apispec.MODEL_CARD_KEYS
    assert models["data"][0]["id"] == "llama-70b" and models["data"][0]["owned_by"] == "sglang"
    body = json.loads(request_body({"text": "hi"}, 7, "completions", "llama-70b"))
    _, ev = sse_events(s.url + "/v1/completions", body)
    content = [e for e in ev[:-1] if e["choices"]]
    assert [e["usage"]["completion_tokens"] for e in content] == [3, 6, 7]
    assert all(tuple(e["usage"]) == apispec.USAGE_KEYS for e in content)
    ext = [e for e in ev[:-1] if not e["choices"] and e.get("sglext")]
    assert tuple(ext[0]["sglext"]["spec_tokens_details"]) == apispec.SPEC_DETAILS_KEYS
    assert ext[0]["sglext"]["spec_tokens_details"]["spec_verify_ct"] == 3
    assert ev[-2]["choices"] == [] and ev[-2]["usage"]["completion_tokens"] == 7  # the include_usage chunk
    chat = json.loads(request_body({"text": "hi"}, 3, "chat", "llama-70b"))
    _, ev = sse_events(s.url + "/v1/chat/completions", chat)
    assert ev[0]["choices"][0]["delta"]["role"] == "assistant" and ev[0]["choices"][0]["delta"]["content"] == ""
    with pytest.raises(urllib.error.HTTPError) as exc:
        sse_events(s.url + "/v1/completions", {**body, "model": "nope"})
    err = json.loads(exc.value.read())
    assert exc.value.code == 404 and tuple(err) == apispec.ERROR_KEYS


def test_vllm_flavor_has_its_own_shapes(standin):
    s = standin("--flavor", "vllm", "served-model", "--decode-tok-s", "500")
    with urllib.request.urlopen(s.url + "/v1/models", timeout=5) as r:
        card = json.loads(r.read())["data"][0]
    assert tuple(card) == apispec.VLLM_MODEL_CARD_KEYS and card["id"] == "served-model"
    t0 = time.monotonic()
    with urllib.request.urlopen(s.url + "/health", timeout=5) as r:
        assert r.status == 200
    assert time.monotonic() - t0 < 0.5  # vLLM's /health does not generate
    for path in ("/generate", "/health_generate"):
        with pytest.raises(urllib.error.HTTPError) as exc:
            urllib.request.urlopen(s.url + path, timeout=5)
        assert exc.value.code in (404, 405)
    body = json.loads(request_body({"text": "hi"}, 4, "completions", "served-model"))
    _, ev = sse_events(s.url + "/v1/completions", body)
    assert "stop_reason" in ev[0]["choices"][0] and ev[0]["id"].startswith("cmpl-")
    with pytest.raises(urllib.error.HTTPError) as exc:
        sse_events(s.url + "/v1/completions", {**body, "max_tokens": 10**6})
    assert exc.value.code == 400 and tuple(json.loads(exc.value.read())["error"]) == apispec.VLLM_ERROR_KEYS


def test_health_checks_generate_and_take_a_second(standin):
    s = standin("--decode-tok-s", "500")
    for path in ("/health", "/health_generate"):
        t0 = time.monotonic()
        with urllib.request.urlopen(s.url + path, timeout=10) as r:
            assert r.status == 200
        assert 1.0 <= time.monotonic() - t0 < 2.5, path
    t0 = time.monotonic()
    with urllib.request.urlopen(s.url + "/ready", timeout=5) as r:
        assert r.status == 200
    assert time.monotonic() - t0 < 0.5


def test_health_without_generation_when_disabled(standin, monkeypatch):
    monkeypatch.setitem(os.environ, "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", "false")
    s = standin("--decode-tok-s", "500")
    t0 = time.monotonic()
    with urllib.request.urlopen(s.url + "/health", timeout=5) as r:
        assert r.status == 200
    assert time.monotonic() - t0 < 0.5


def test_idle_keep_alive_connection_is_closed_after_5_s(standin):
    s = standin("--decode-tok-s", "500")
    request = f"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1:{s.port}\r\n\r\n".encode()
    with socket.create_connection(("127.0.0.1", s.port), timeout=10) as sock:
        sock.sendall(request)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        time.sleep(3.0)
        sock.sendall(request)  # still open after 3 s idle
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        t0 = time.monotonic()
        assert sock.recv(65536) == b""  # the server closes it ~5 s after the last response
        assert 4.5 <= time.monotonic() - t0 < 7.0


def one(url, api, body, parser=None):
    async def go():
        async with new_session(1) as session:
            return await stream_request(session, url + PATHS[api], body, 10, None, parser or OpenAIParser)

    return asyncio.run(go())


def test_connect_headers_and_first_token_are_recorded_apart(standin):
    # SGLang's native stream sends its headers at once and the first chunk after TTFT; its OpenAI routes compute the
    # first chunk before HTTP 200 (serving_completions.py kick-starts the generator), so headers come with it.
    s = standin("--decode-tok-s", "500", "--ttft-ms", "60")
    from gpudoctor.bench.client.stream import NativeParser

    r = one(s.url, "native", request_body({"text": "a"}, 4, "native", None), NativeParser)
    assert r.ok and r.connect_s is not None and r.reused is False
    assert r.headers_s < 0.040 and 0.060 <= r.ttft_s < 0.120  # slack for a loaded 2-core machine
    assert r.server_sent_wall is not None and abs(r.first_wall - r.server_sent_wall) < 0.025
    r = one(s.url, "completions", request_body({"text": "a"}, 4, "completions", "standin/model"))
    assert r.ok and r.headers_s >= 0.055 and r.ttft_s - r.headers_s < 0.020


def test_nagle_gap_is_flagged_not_reported_as_server_time(standin, tmp_path):
    from tests.bench.conftest import run_cli

    for flags, flagged in ((["--no-tcp-nodelay"], True), ([], False)):
        s = standin("--decode-tok-s", "200", "--ttft-ms", "2", *flags)
        out = tmp_path / f"out-{flagged}"
        p = run_cli("bench", "load", "--server-url", s.url, "--concurrency", "2", "--max-tokens", "8",
                    "--prompts", "12", "--warmup", "2", "--out", str(out), "--json")
        assert p.returncode == 0, p.stderr
        rec = json.loads(p.stdout)
        if flagged:
            assert rec["transport_note"] and "Nagle" in rec["transport_note"], rec
            assert rec["ttft_ms_p50"] > 30  # what the client saw, kept, but no longer unexplained
        else:
            assert rec["transport_note"] is None and rec["ttft_ms_p50"] < 30, rec
        assert rec["headers_ms_p50"] < 20
