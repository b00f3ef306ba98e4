"""The load generator: levels of streamed requests, closed-loop (a fixed concurrency) or open-loop (a request rate with
Poisson or constant arrivals), turned into honest records.

A closed-loop level sends its prompts through a semaphore of `concurrency`; an open-loop level sends each prompt when
its arrival is due (gpudoctor.bench.client.pacing: a timerfd pacer, sub-millisecond) whatever is still in flight, optionally
capped at `concurrency`. Each request is measured by gpudoctor.bench.client.stream (native /generate) or the OpenAI parser
(/v1/completions, /v1/chat/completions). Once more requests failed than `max_error_rate` allows (default 0: the first
failure) no new request starts: a dead or hung server costs one stall timeout, not one per remaining prompt.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Callable

from gpudoctor.bench.server import logscan
from gpudoctor.bench.client.openai import NATIVE, PATHS, SGLANG, parser_for, request_body as api_request_body, takes_token_ids
from gpudoctor.bench.client.pacing import POISSON, arrival_offsets, best_pacer
from gpudoctor.bench.client.prompts import Prompt, as_text
from gpudoctor.bench.records.results import CRASHED, ERROR, OK, percentile
from gpudoctor.bench.records.steady import sections as steady_sections
from gpudoctor.bench.client.stream import (CONNECT, DISCONNECT, NativeParser, RequestResult, Watchdog, sent_trace,
                                    stream_request)

MIN_SAMPLES = 10  # requests finished before an error rate above max_error_rate stops a level


@dataclass
class LevelSpec:
    """What one level is: who (label/method/tp), what (workload, context, max_tokens), how hard (concurrency, or a
    request rate) and through which API; the SLOs goodput is counted against; the error rate it tolerates."""

    label: str
    workload: str
    concurrency: int | None
    max_tokens: int
    num_prompts: int
    context_len: int | None = None
    method: str | None = None
    tp: int | None = None
    trial: int = 0
    api: str = NATIVE
    model: str | None = None  # OpenAI APIs: the served model name (--model, else from /v1/models)
    server_kind: str | None = None  # OpenAI APIs: the dialect (openai.SERVER_KINDS); None: not known yet
    request_rate: float | None = None  # requests/s; None = closed loop at `concurrency`
    arrival: str = POISSON
    max_error_rate: float = 0.0
    slo_ttft_ms: float | None = None
    slo_itl_ms: float | None = None
    counter: object = None  # OpenAI APIs: a tokens.Counter for output without usage (exact ones only are used)

    def head(self) -> dict:
        return {"label": self.label, "method": self.method, "tp": self.tp, "workload": self.workload,
                "context_len": self.context_len, "max_tokens": self.max_tokens, "concurrency": self.concurrency,
                "request_rate": self.request_rate, "arrival": self.arrival if self.request_rate else None,
                "api": self.api, "trial": self.trial, "requests": self.num_prompts,
                **({"server_kind": self.server_kind, "model": self.model} if self.api != NATIVE else {})}

    @property
    def where(self) -> str:
        load = f"{self.request_rate:g} req/s" if self.request_rate else f"concurrency {self.concurrency}"
        return f"workload {self.workload} at {load}"


def request_body(prompt: Prompt, max_tokens: int, api: str = NATIVE, model: str | None = None,
                 kind: str | None = SGLANG) -> bytes:
    """The streamed request: greedy, max_tokens new tokens (exactly, with ignore_eos, where the server takes it), in
    the server's dialect (gpudoctor.bench.client.openai)."""
    return api_request_body(prompt.payload(), max_tokens, api, model, kind)


def new_session(concurrency: int | None):
    """A client session sized for the level: one pooled connection per concurrent request, no total timeout."""
    import aiohttp

    conn = aiohttp.TCPConnector(limit=concurrency or 0, ttl_dns_cache=300)  # 0: no limit (open loop)
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


class Breaker:
    """Stops a level once its errors exceed `max_error_rate`: at the first failure when it is 0, else when the rate
    over at least MIN_SAMPLES finished requests is above it, or when the level can no longer meet it."""

    def __init__(self, max_error_rate: float, planned: int):
        self.max_rate, self.planned = max_error_rate, planned
        self.finished = self.failed = 0

    def record(self, ok: bool) -> None:
        self.finished += 1
        self.failed += not ok

    @property
    def tripped(self) -> bool:
        if self.failed == 0:
            return False
        if self.max_rate <= 0 or self.failed > self.max_rate * self.planned:
            return True
        return self.finished >= MIN_SAMPLES and self.failed / self.finished > self.max_rate


async def send_all(session, url: str, bodies: list[bytes], concurrency: int | None, stall_s: float,
                   on_request: Callable[[RequestResult], None] | None = None, *, api: str = NATIVE,
                   request_rate: float | None = None, arrival: str = POISSON, seed: int = 0,
                   max_error_rate: float = 0.0, offsets: list[float] | None = None,
                   counter=None, targets: list[int] | None = None) -> tuple[list[RequestResult], float, dict]:
    """Send every body closed-loop (at most `concurrency` in flight) or open-loop (at `request_rate`, capped at
    `concurrency` when given); stop starting new ones once the breaker trips. Returns the results, the wall time
    (first send to last completion) and how the level went ({"tripped", "late_s"}: send lateness, open loop).
    `offsets` (seconds from the start, one per body: a trace) replace the arrivals drawn from `request_rate`;
    `counter` counts an OpenAI stream's tokens where the server sends no usage; `targets` (one per body) are the
    output lengths the requests ask for where they differ (a trace): each result keeps its own."""
    parser = NativeParser if api == NATIVE else parser_for(counter)
    sem = asyncio.Semaphore(concurrency) if concurrency else None
    breaker = Breaker(max_error_rate, len(bodies))
    results: list[RequestResult | None] = [None] * len(bodies)
    watchdog = Watchdog(stall_s)

    async def one(i: int) -> None:
        if sem is not None:
            await sem.acquire()
        try:
            if breaker.tripped:
                return
            r = await stream_request(session, url, bodies[i], stall_s, watchdog, parser)
            if targets is not None:
                r.max_tokens = targets[i]
            results[i] = r
            breaker.record(r.ok)
            if on_request is not None:
                on_request(r)
        finally:
            if sem is not None:
                sem.release()

    late: list[float] = []
    t0 = time.perf_counter()
    dog = asyncio.create_task(watchdog.run())
    try:
        if request_rate is None and offsets is None:
            await asyncio.gather(*(one(i) for i in range(len(bodies))))
        else:
            pacer = best_pacer()
            tasks = []
            start = time.perf_counter() + 0.002
            t0 = start
            try:
                dues = offsets if offsets is not None else arrival_offsets(len(bodies), request_rate, arrival, seed)
                for i, due in enumerate(dues):
                    woke = await pacer.wait_until(start + due)
                    if breaker.tripped:
                        break
                    late.append(woke - (start + due))
                    tasks.append(asyncio.ensure_future(one(i)))
            finally:
                pacer.close()
            await asyncio.gather(*tasks)
    finally:
        dog.cancel()
    return ([r for r in results if r is not None], time.perf_counter() - t0,
            {"tripped": breaker.tripped, "late_s": late})


def _ms(xs: list[float], q: float) -> float | None:
    v = percentile(xs, q)
    return None if v is None else v * 1000


def transport_note(results: list[RequestResult]) -> str | None:
    """Flag the Nagle + delayed-ACK artifact: first chunks arriving ~40 ms after the response headers although the
    server wrote them earlier (its own stamp), or only on reused keep-alive connections (a new connection starts in
    TCP quick-ACK mode, which hides it)."""
    gaps = [(r.ttft_s - r.headers_s, r) for r in results if r.ok and r.ttft_s is not None and r.headers_s is not None]
    if len(gaps) < 3:
        return None
    suspect = [(g, r) for g, r in gaps if 0.034 <= g <= 0.050]
    stamped = [r.first_wall - r.server_sent_wall for _, r in suspect if r.server_sent_wall and r.first_wall]
    fresh = [g for g, r in gaps if not r.reused]
    reused = [g for g, r in gaps if r.reused]
    by_stamp = len(stamped) >= max(2, len(gaps) // 3) and (percentile(stamped, 50) or 0) >= 0.005
    by_reuse = (len(fresh) >= 2 and len(reused) >= 2
                and 0.030 <= (percentile(reused, 50) or 0) - (percentile(fresh, 50) or 0) <= 0.060)
    if not (by_stamp or by_reuse) or len(suspect) < len(gaps) // 3:
        return None
    why = (f"{percentile(stamped, 50) * 1000:.1f} ms after the server wrote them (its response_sent_to_client_ts)"
           if by_stamp else
           f"on reused connections ({percentile(reused, 50) * 1000:.1f} ms) but not on new ones "
           f"({percentile(fresh, 50) * 1000:.1f} ms)")
    return (f"transport artifact: {len(suspect)} of {len(gaps)} requests got their first chunk "
            f"{percentile([g for g, _ in suspect], 50) * 1000:.1f} ms after the response headers, {why}: Nagle's "
            f"algorithm + delayed ACK on a server without TCP_NODELAY; their TTFT includes it")


def summarize(results: list[RequestResult], wall_s: float, spec: LevelSpec | None = None,
              late_s: list[float] | None = None) -> dict:
    """The metrics of a level: throughput over its wall time, latency percentiles, token-weighted accept length,
    transport timings, goodput against the level's SLOs."""
    good = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in good)
    ttft = [r.ttft_s for r in good if r.ttft_s is not None]
    e2e = [r.e2e_s for r in good if r.e2e_s is not None]
    itl = [g for r in good for g in r.itl_s]
    spec_rs = [r for r in good if r.verify_ct]
    prompt_tokens = [r.prompt_tokens for r in good if isinstance(r.prompt_tokens, int)]
    rec = {
        "completed": len(good), "failed": len(results) - len(good),
        "error_rate": (len(results) - len(good)) / len(results) if results else None,
        "output_tokens": out_tokens, "duration_s": round(wall_s, 6),
        "output_tok_per_s": out_tokens / wall_s if wall_s > 0 else None,
        "ttft_ms_p50": _ms(ttft, 50), "ttft_ms_p99": _ms(ttft, 99), "itl_ms_p50": _ms(itl, 50),
        "e2e_ms_p50": _ms(e2e, 50),
        "accept_length": (sum(r.output_tokens for r in spec_rs) / sum(r.verify_ct for r in spec_rs))
        if spec_rs else None,
        "prompt_tokens_mean": (sum(prompt_tokens) / len(prompt_tokens)) if prompt_tokens else None,
        "connect_ms_p50": _ms([r.connect_s for r in good if r.connect_s is not None], 50),
        "headers_ms_p50": _ms([r.headers_s for r in good if r.headers_s is not None], 50),
        "itl_source": None if not good else ("usage" if all(r.usage_per_chunk for r in good) else "per-chunk"),
        **output_length(good, spec),
        "transport_note": transport_note(good),
        **steady_sections(results),  # per_request and steady (gpudoctor.bench.records.steady)
    }
    if late_s:
        rec["send_late_ms_p50"], rec["send_late_ms_p99"] = _ms(late_s, 50), _ms(late_s, 99)
        starts = sorted(r.sent_perf for r in results if r.sent_perf is not None)
        if len(starts) > 1 and starts[-1] > starts[0]:
            rec["achieved_req_per_s"] = (len(starts) - 1) / (starts[-1] - starts[0])
    if spec is not None and (spec.slo_ttft_ms or spec.slo_itl_ms) and wall_s > 0:
        met = [r for r in good if _meets(r, spec)]
        rec["goodput_req_per_s"] = len(met) / wall_s
        rec["slo_ok_fraction"] = len(met) / len(results) if results else None
    return rec


def per_prompt(prompts: list[Prompt], results: list[RequestResult]) -> dict | None:
    """A workload that names its prompts (the seed's fib/qsort/arith/json/haiku): per name, the requests and their
    mean single-request tok/s (output tokens / e2e) and TTFT; None when the prompts have no names or not every
    request has a result to pair with its prompt."""
    if not prompts or not all(p.name for p in prompts) or len(results) != len(prompts):
        return None
    out: dict = {}
    for p, r in zip(prompts, results):
        if r.ok and r.e2e_s:
            out.setdefault(p.name, []).append((r.output_tokens / r.e2e_s, (r.ttft_s or 0) * 1000))
    return {name: {"requests": len(xs), "tok_per_s": sum(x[0] for x in xs) / len(xs),
                   "ttft_ms": sum(x[1] for x in xs) / len(xs)} for name, xs in out.items()} or None


def output_length(good: list[RequestResult], spec: LevelSpec | None) -> dict:
    """Output length against its target (OpenAI APIs): where the counts came from, how many requests ended before
    max_tokens (a server without ignore_eos stops at the model's end of text), a note saying so. Native: nothing."""
    sources = sorted({r.tokens_source for r in good if r.tokens_source})
    if not sources:
        return {}
    out: dict = {"output_tokens_source": sources[0] if len(sources) == 1 else "mixed: " + ", ".join(sources)}
    if spec is None:
        return out
    def want(r: RequestResult) -> int:
        return r.max_tokens or spec.max_tokens

    target = sum(want(r) for r in good)
    short = [r for r in good if r.output_tokens < want(r)]
    out.update({"output_tokens_target": target, "short_requests": len(short)})
    if short:
        why = sorted({str(r.finish_reason) for r in short})
        asked = (f"max_tokens {spec.max_tokens}" if all(r.max_tokens is None for r in good)
                 else "their max_tokens (the trace's output_length)")
        out["length_note"] = (f"{len(short)} of {len(good)} requests ended before {asked} "
                              f"(finish_reason {', '.join(why)}; the server does not take ignore_eos): "
                              f"{sum(r.output_tokens for r in good)} of {target} target tokens, counted from "
                              f"{out['output_tokens_source']}")
    return out


def _meets(r: RequestResult, spec: LevelSpec) -> bool:
    """TTFT and mean inter-token latency (TPOT) within the level's SLOs (SGLang's goodput definition, ms)."""
    if spec.slo_ttft_ms is not None and (r.ttft_s is None or r.ttft_s * 1000 > spec.slo_ttft_ms):
        return False
    if spec.slo_itl_ms is not None and r.output_tokens > 1 and r.itl_s:
        if sum(r.itl_s) / len(r.itl_s) * 1000 > spec.slo_itl_ms:
            return False
    return True


async def run_level(session, base_url: str, spec: LevelSpec, prompts: list[Prompt], *, stall_s: float = 120.0,
                    level_timeout_s: float | None = None, log: logscan.LogWatch | None = None,
                    server_gone: Callable[[], str | None] | None = None,
                    on_request: Callable[[RequestResult], None] | None = None, send=None) -> dict:
    """Run one level and return its record (ok only if no more requests failed than max_error_rate allows).

    `send` (an async callable of (session, base_url, stall_s, on_request)) replaces sending `prompts` as one batch:
    a multi-turn or trace level (gpudoctor.bench.client.multiturn, .trace); its `how` gives the requests it planned
    ("planned") and the record's own sections ("extra")."""
    kind = spec.server_kind or SGLANG
    bodies: list = []
    if send is None:
        sent = prompts[: spec.num_prompts]
        if not takes_token_ids(kind, spec.api):  # a string endpoint: the prompt's wire form is text, always
            sent = [as_text(p, spec.counter) for p in sent]
        bodies = [request_body(p, spec.max_tokens, spec.api, spec.model, kind) for p in sent]

        async def send(session, base_url, stall_s, on_request):
            out = await send_all(session, base_url + PATHS[spec.api], bodies, spec.concurrency, stall_s, on_request,
                                 api=spec.api, request_rate=spec.request_rate, arrival=spec.arrival, seed=spec.trial,
                                 max_error_rate=spec.max_error_rate, counter=spec.counter)
            per = per_prompt(prompts[: spec.num_prompts], out[0])
            if per:
                out[2]["extra"] = {"per_prompt": per}
            return out
    if log is not None:
        log.mark()
    timed_out = False
    how: dict = {"tripped": False, "late_s": []}
    try:
        results, wall, how = await asyncio.wait_for(send(session, base_url, stall_s, on_request), level_timeout_s)
    except asyncio.TimeoutError:
        results, wall, timed_out = [], float(level_timeout_s or 0), True
    bodies = bodies or [b""] * how.get("planned", 0)
    rec = {**spec.head(), **summarize(results, wall, spec, how["late_s"]), **how.get("extra", {})}
    failures = [r for r in results if not r.ok]
    within = len(failures) <= spec.max_error_rate * len(bodies) and not how["tripped"]
    if not timed_out and within and rec["completed"] + len(failures) == len(bodies) and rec["output_tokens"] > 0:
        note = (f"{len(failures)} of {len(bodies)} requests failed (allowed: max_error_rate "
                f"{spec.max_error_rate:g}); first: {failures[0].error}") if failures else None
        return {**rec, "status": OK, "error": note, "log_excerpt": None}
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
        limit = "" if spec.max_error_rate <= 0 else f", above max_error_rate {spec.max_error_rate:g}"
        msg = (f"{len(failures)} of {len(bodies)} requests failed ({len(results)} started{limit}); "
               f"first: {failures[0].error}")
    else:
        msg = f"no output: {rec['completed']} of {len(bodies)} requests completed, {rec['output_tokens']} tokens"
    if cause:  # the cause first: it is what a reader needs, and long messages get cut in tables
        msg = f"server log: {cause}; " + msg
    if gone is not None:
        msg = f"server crashed ({gone}); " + msg
    return {**rec, "status": CRASHED if gone is not None else ERROR, "error": msg, **logscan.record_fields(text)}
