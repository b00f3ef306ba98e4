"""The streaming parser against raw bytes: split chunks, tricky text, missing [DONE], empty and aborted streams."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpudoctor.bench.client.load import new_session
from gpudoctor.bench.records.results import percentile
from gpudoctor.bench.client.stream import stream_generate
from tests.bench.conftest import free_port


@pytest.fixture
def raw_server():
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("raw_sse_server.py")), str(port)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "listening"
    yield f"http://127.0.0.1:{port}/generate"
    proc.kill()
    proc.wait()


def fetch(url, scenario):
    async def go():
        async with new_session(1) as s:
            return await stream_generate(s, url, json.dumps({"text": scenario}).encode(), stall_s=5)

    return asyncio.run(go())


def test_split_chunks_and_tricky_text(raw_server):
    r = fetch(raw_server, "split")
    assert r.ok, r.error
    assert r.output_tokens == 4 and r.chunks == 3 and r.verify_ct == 2
    assert len(r.itl_s) == 3  # 1 -> 3 (two tokens, two gaps) -> 4 (one)
    assert r.itl_s[0] == r.itl_s[1]
    assert r.meta["finish_reason"] == {"type": "length", "length": 4}


def test_stream_without_done_is_a_failure(raw_server):
    r = fetch(raw_server, "nodone")
    assert not r.ok and r.kind == "disconnect" and "without [DONE] after 2 tokens" in r.error


def test_empty_stream_is_a_failure(raw_server):
    r = fetch(raw_server, "empty")
    assert not r.ok and r.kind == "empty"


def test_abort_is_a_failure(raw_server):
    r = fetch(raw_server, "abort")
    assert not r.ok and r.kind == "abort" and "out of memory" in r.error


def test_connection_refused():
    r = fetch(f"http://127.0.0.1:{free_port()}/generate", "x")
    assert not r.ok and r.kind == "connect"


def test_percentile_matches_linear_interpolation():
    assert percentile([], 50) is None
    assert percentile([3.0], 99) == 3.0
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile(list(range(101)), 99) == pytest.approx(99.0)
    assert percentile([10, 20], 99) == pytest.approx(19.9)


def test_openai_parser_without_per_chunk_usage_counts_chunks_and_says_so():
    # A server that ignores continuous_usage_stats: one token per content chunk is all a client can assume; the
    # final usage chunk still gives the true total, and the result says the ITLs are per chunk.
    from gpudoctor.bench.client.openai import OpenAIParser
    from gpudoctor.bench.client.stream import RequestResult

    r = RequestResult()
    p = OpenAIParser(r)
    events = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
              {"choices": [{"index": 0, "delta": {"content": " a b c"}}]},
              {"choices": [{"index": 0, "delta": {"content": " d e f"}, "finish_reason": "length"}]},
              {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11}}]
    for t, ev in enumerate(events):
        p.feed(b"data: " + json.dumps(ev).encode(), now=0.1 * (t + 1), st=0.0)
    p.feed(b"data: [DONE]", now=0.5, st=0.0)
    assert p.finish() is None and p.done
    assert r.ttft_s == pytest.approx(0.2)  # the role chunk is not the first token
    assert r.usage_per_chunk is False and r.itl_s == [pytest.approx(0.1)]
    assert r.output_tokens == 6 and r.prompt_tokens == 5


def test_openai_parser_reads_abort_and_error_chunks():
    from gpudoctor.bench.client.openai import OpenAIParser
    from gpudoctor.bench.client.stream import RequestResult

    r = RequestResult()
    p = OpenAIParser(r)
    p.feed(b'data: {"error": {"object": "error", "message": "The request queue is full.", '
           b'"type": "SERVICE_UNAVAILABLE", "param": null, "code": 503}}', 0.1, 0.0)
    assert p.finish() == "request aborted by the server (status 503): The request queue is full."
    r = RequestResult()
    p = OpenAIParser(r)
    p.feed(b'data: {"choices": [{"index": 0, "text": "", "finish_reason": "abort"}]}', 0.1, 0.0)
    assert p.finish() == "request aborted by the server (finish_reason abort)"
