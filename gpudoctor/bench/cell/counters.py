"""The server's own accounting over a level: its Prometheus counters read before and after, the level's deltas.

Server-side counters are cumulative since the server started (vLLM #46938, SGLang #37359): only the difference over
the level says what the level's own requests did — its prefix-cache hit rate, its preemptions. The names are the
engines' own (read from their sources):

- SGLang (srt/metrics/collector.py, TokenizerMetricsCollector / SchedulerMetricsCollector):
  `sglang:prompt_tokens_total` (prompt tokens: the prefix-cache queries), `sglang:cached_tokens_total` (prompt tokens
  served from the cache, summed over its cache_source label where there is one), `sglang:num_retracted_requests_total`
  (SGLang's preemption: a running request retracted for memory); gauges `sglang:token_usage` (KV pool in use, 0..1),
  `sglang:num_queue_reqs`, `sglang:num_running_reqs`. Needs `--enable-metrics`.
- vLLM (v1/metrics/loggers.py, PrometheusStatLogger): `vllm:prefix_cache_queries` and `vllm:prefix_cache_hits`
  (tokens; exposed with prometheus_client's `_total`), `vllm:num_preemptions_total`; gauges `vllm:kv_cache_usage_perc`,
  `vllm:num_requests_waiting`, `vllm:num_requests_running`.

Per DP rank where the series are labelled: SGLang's `dp_rank`, vLLM's `engine` (one engine core per DP rank).
A server without /metrics (transformers serve, SGLang without --enable-metrics) gets `{status: unavailable, reason}`.
"""

from __future__ import annotations

import asyncio

COUNTERS = {  # what -> {engine: exposed sample name}
    "prefix_cache_queries": {"sglang": "sglang:prompt_tokens_total", "vllm": "vllm:prefix_cache_queries_total"},
    "prefix_cache_hits": {"sglang": "sglang:cached_tokens_total", "vllm": "vllm:prefix_cache_hits_total"},
    "preemptions": {"sglang": "sglang:num_retracted_requests_total", "vllm": "vllm:num_preemptions_total"},
}
GAUGES = {
    "kv_usage": {"sglang": "sglang:token_usage", "vllm": "vllm:kv_cache_usage_perc"},
    "queue": {"sglang": "sglang:num_queue_reqs", "vllm": "vllm:num_requests_waiting"},
    "running": {"sglang": "sglang:num_running_reqs", "vllm": "vllm:num_requests_running"},
}
RANK_LABELS = {"sglang": "dp_rank", "vllm": "engine"}
READ, UNAVAILABLE = "read", "unavailable"


def parse(text: str) -> dict[str, dict[str, float]]:
    """Prometheus text -> {engine: {what: {rank: value}}} for the names above (sums over other labels)."""
    from prometheus_client.parser import text_string_to_metric_families

    wanted = {}
    for table in (COUNTERS, GAUGES):
        for what, names in table.items():
            for engine, name in names.items():
                wanted[name] = (engine, what)
    out: dict = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            hit = wanted.get(s.name)
            if hit is None:
                continue
            engine, what = hit
            rank = s.labels.get(RANK_LABELS[engine], "0")
            slot = out.setdefault(engine, {}).setdefault(what, {})
            slot[rank] = slot.get(rank, 0.0) + float(s.value)
    return out


async def scrape(base_url: str, timeout: float = 5.0) -> dict:
    """GET /metrics: {status: read, values} or {status: unavailable, reason}."""
    import aiohttp

    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as s:
            async with s.get(base_url + "/metrics") as resp:
                if resp.status != 200:
                    return {"status": UNAVAILABLE, "reason": f"GET /metrics answered HTTP {resp.status}"}
                text = await resp.text()
    except (asyncio.TimeoutError, aiohttp.ClientError) as exc:
        return {"status": UNAVAILABLE, "reason": f"GET /metrics failed: {type(exc).__name__}: {exc}"[:200]}
    try:
        values = parse(text)
    except ValueError as exc:
        return {"status": UNAVAILABLE, "reason": f"GET /metrics is not Prometheus text: {exc}"[:200]}
    if not values:
        return {"status": UNAVAILABLE, "reason": "GET /metrics has none of SGLang's or vLLM's counters (SGLang needs "
                                                 "--enable-metrics)"}
    return {"status": READ, "values": values}


def section(before: dict, after: dict) -> dict:
    """The record's `server_counters`: per engine found, the counters' deltas over the level (total and per rank),
    the level's own prefix-cache hit rate, and the gauges before and after."""
    for s in (before, after):
        if s.get("status") != READ:
            return {"status": UNAVAILABLE, "reason": s.get("reason") or "not read"}
    engines = {}
    for engine, vals_b in before["values"].items():
        vals_a = after["values"].get(engine, {})
        deltas, by_rank, notes = {}, {}, []
        for what in COUNTERS:
            b, a = vals_b.get(what), vals_a.get(what)
            if b is None or a is None:
                deltas[what] = None
                continue
            total = 0.0
            for rank in sorted(set(a) | set(b)):
                d = a.get(rank, 0.0) - b.get(rank, 0.0)
                if d < 0:
                    notes.append(f"{what} went down on rank {rank}: the server restarted during the level")
                    d = None
                by_rank.setdefault(rank, {})[what] = d
                total = None if d is None or total is None else total + d
            deltas[what] = total
        for rank, ds in by_rank.items():
            q, h = ds.get("prefix_cache_queries"), ds.get("prefix_cache_hits")
            ds["hit_rate"] = (h / q) if q and h is not None else None
        q, h = deltas.get("prefix_cache_queries"), deltas.get("prefix_cache_hits")
        engines[engine] = {"deltas": deltas, "hit_rate": (h / q) if q and h is not None else None,
                           "by_rank": by_rank if len(by_rank) > 1 else None,
                           "gauges_before": {w: _total(vals_b.get(w)) for w in GAUGES},
                           "gauges_after": {w: _total(vals_a.get(w)) for w in GAUGES},
                           "notes": notes or None}
    return {"status": READ, "source": "GET /metrics before and after the level", "engines": engines}


def _total(v: dict | None):
    return None if not v else sum(v.values())
