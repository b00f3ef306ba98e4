"""The load generator: levels of streamed /generate requests at a fixed concurrency, turned into honest records.

A level sends its prompts through a semaphore of `concurrency`, measures each request (gpudoctor.bench.stream), and
becomes one record. After the first failed request no new request starts: a dead or hung server costs one stall
timeout, not one per remaining prompt.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Callable

from gpudoctor.bench import logscan
from gpudoctor.bench.prompts import Prompt
from gpudoctor.bench.results import CRASHED, ERROR, OK, percentile
from gpudoctor.bench.stream import CONNECT, DISCONNECT, RequestResult, Watchdog, sent_trace, stream_generate


@dataclass
class LevelSpec:
    """What one level is: who (label/method/tp), what (workload, context, max_tokens) and how hard (concurrency)."""

    label: str
    workload: str
    concurrency: int
    max_tokens: int
    num_prompts: int
    context_len: int | None = None
    method: str | None = None
    tp: int | None = None
    trial: int = 0

    def head(self) -> dict:
        return {"label": self.label, "method": self.method, "tp": self.tp, "workload": self.workload,
                "context_len": self.context_len, "max_tokens": self.max_tokens, "concurrency": self.concurrency,
                "trial": self.trial, "requests": self.num_prompts}


def request_body(prompt: Prompt, max_tokens: int) -> bytes:
    """SGLang's native streaming request: greedy, ignore_eos, exactly max_tokens new tokens."""
    return json.dumps({**prompt.payload(), "stream": True,
                       "sampling_params": {"temperature": 0.0, "max_new_tokens": max_tokens, "ignore_eos": True}},
                      separators=(",", ":")).encode()


def new_session(concurrency: int):
    """A client session sized for the level: one pooled connection per concurrent request, no total timeout."""
    import aiohttp

    conn = aiohttp.TCPConnector(limit=max(1, concurrency), ttl_dns_cache=300)
    return aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=None), auto_decompress=False,
                                 trace_configs=[sent_trace()])


async def probe_alive(base_url: str, timeout: float = 3.0) -> str | None:
    """None when the server accepts connections, else why not (for servers we did not start ourselves)."""
    import aiohttp

    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as s:
            async with s.get(base_url + "/health"):
                return None
    except aiohttp.ClientConnectorError as exc:
        return f"server is gone: {exc.os_error or exc}"
    except (asyncio.TimeoutError, aiohttp.ClientError):
        return None  # it answers the TCP handshake but is slow or odd: alive, maybe hung


async def send_all(session, url: str, bodies: list[bytes], concurrency: int, stall_s: float,
                   on_request: Callable[[RequestResult], None] | None = None) -> tuple[list[RequestResult], float]:
    """Send every body with at most `concurrency` in flight; stop starting new ones after the first failure."""
    sem = asyncio.Semaphore(concurrency)
    failed = asyncio.Event()
    results: list[RequestResult | None] = [None] * len(bodies)
    watchdog = Watchdog(stall_s)

    async def one(i: int) -> None:
        async with sem:
            if failed.is_set():
                return
            r = await stream_generate(session, url, bodies[i], stall_s, watchdog)
            results[i] = r
            if not r.ok:
                failed.set()
            if on_request is not None:
                on_request(r)

    t0 = time.perf_counter()
    dog = asyncio.create_task(watchdog.run())
    try:
        await asyncio.gather(*(one(i) for i in range(len(bodies))))
    finally:
        dog.cancel()
    return [r for r in results if r is not None], time.perf_counter() - t0


def summarize(results: list[RequestResult], wall_s: float) -> dict:
    """The metrics of a level: throughput over its wall time, latency percentiles, token-weighted accept length."""
    good = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in good)
    ttft = [r.ttft_s * 1000 for r in good if r.ttft_s is not None]
    e2e = [r.e2e_s * 1000 for r in good if r.e2e_s is not None]
    itl = [g * 1000 for r in good for g in r.itl_s]
    spec = [r for r in good if r.verify_ct]
    prompt_tokens = [r.prompt_tokens for r in good if isinstance(r.prompt_tokens, int)]
    return {
        "completed": len(good), "output_tokens": out_tokens, "duration_s": round(wall_s, 6),
        "output_tok_per_s": out_tokens / wall_s if wall_s > 0 else None,
        "ttft_ms_p50": percentile(ttft, 50), "ttft_ms_p99": percentile(ttft, 99),
        "itl_ms_p50": percentile(itl, 50), "e2e_ms_p50": percentile(e2e, 50),
        "accept_length": (sum(r.output_tokens for r in spec) / sum(r.verify_ct for r in spec)) if spec else None,
        "prompt_tokens_mean": (sum(prompt_tokens) / len(prompt_tokens)) if prompt_tokens else None,
    }


async def run_level(session, base_url: str, spec: LevelSpec, prompts: list[Prompt], *, stall_s: float = 120.0,
                    level_timeout_s: float | None = None, log: logscan.LogWatch | None = None,
                    server_gone: Callable[[], str | None] | None = None,
                    on_request: Callable[[RequestResult], None] | None = None) -> dict:
    """Run one level and return its record (status ok only if every request completed with output)."""
    bodies = [request_body(p, spec.max_tokens) for p in prompts[: spec.num_prompts]]
    if log is not None:
        log.mark()
    timed_out = False
    try:
        results, wall = await asyncio.wait_for(
            send_all(session, base_url + "/generate", bodies, spec.concurrency, stall_s, on_request), level_timeout_s)
    except asyncio.TimeoutError:
        results, wall, timed_out = [], float(level_timeout_s or 0), True
    rec = {**spec.head(), **summarize(results, wall)}
    failures = [r for r in results if not r.ok]
    if not timed_out and not failures and rec["completed"] == len(bodies) and rec["output_tokens"] > 0:
        return {**rec, "status": OK, "error": None, "log_excerpt": None}
    gone = None
    lost = any(r.kind in (CONNECT, DISCONNECT) for r in failures)
    if server_gone is not None:
        gone = server_gone()
        # A dying process closes its sockets a moment before it can be reaped: give it that moment.
        for _ in range(20 if lost else 0):
            if gone is not None:
                break
            await asyncio.sleep(0.05)
            gone = server_gone()
    elif lost:
        gone = await probe_alive(base_url)
    if gone is not None:
        await asyncio.sleep(0.2)  # let a dying server finish writing its last words
    text = log.read_new() if log is not None else ""
    cause = logscan.reason(text) if text else None
    if timed_out:
        msg = f"level did not finish in {level_timeout_s:g} s"
    elif failures:
        msg = f"{len(failures)} of {len(bodies)} requests failed ({len(results)} started); first: {failures[0].error}"
    else:
        msg = f"no output: {rec['completed']} of {len(bodies)} requests completed, {rec['output_tokens']} tokens"
    if cause:  # the cause first: it is what a reader needs, and long messages get cut in tables
        msg = f"server log: {cause}; " + msg
    if gone is not None:
        msg = f"server crashed ({gone}); " + msg
    return {**rec, "status": CRASHED if gone is not None else ERROR, "error": msg, **logscan.record_fields(text)}
