"""A level's steady state: its per-request series, the warm-up found in it, and the metrics of the window after it.

The warm-up (the server's first requests of a level, a cold cache, clocks ramping, a batch filling) shows as the first
requests taking longer per token. The series is each ok request's time per output token (e2e / output tokens) in the
order the requests were sent, averaged in batches of b consecutive requests (batch_size: MSER-5 from 50 requests);
the cut is MSER (White 1997, the Marginal Standard Error Rule): drop the first d batches where d minimises the squared
standard error of the remaining mean, sum((x - mean)^2) / (n - d)^2, with d searched up to half the series.
The window is every request from the cut to the last one sent; the record says which (`first`,
`last`: indexes into `per_request.rows`), how many were cut, and why.

A cut is kept only when the requests it removes are at least WARMUP_MARGIN slower per token than the rest (else it
is noise, and every request counts). A level is "too short" (no numbers, and the record says why) when it has fewer
than MIN_REQUESTS ok requests, when the best cut is at the half-way limit and what is left still trends (its halves
differ by > 2 %, Welch p < 0.01: no steady state reached), or when fewer than MIN_WINDOW requests remain.
"""

from __future__ import annotations

from gpudoctor.bench.records.results import percentile

MIN_REQUESTS = 8
WARMUP_MARGIN = 0.01  # a cut must remove requests at least 1 % slower per token than the window it leaves
MIN_WINDOW = 6
FIELDS = ("start_s", "ttft_ms", "e2e_ms", "output_tokens", "itl_ms", "tok_per_s")
STEADY, TOO_SHORT = "steady", "too_short"


def _r(v, nd=3):
    return None if v is None else round(v, nd)


def series(results: list) -> tuple[list, dict]:
    """(the ok requests in the order they were sent, the record's `per_request` section: one row per request of
    FIELDS — start seconds from the first send, TTFT, e2e, output tokens, the request's median inter-token gap,
    its own output tokens / e2e)."""
    good = [r for r in results if r.ok and r.e2e_s]
    good.sort(key=lambda r: (r.sent_perf is None, r.sent_perf or 0.0))
    t0 = next((r.sent_perf for r in good if r.sent_perf is not None), None)
    rows = []
    for r in good:
        itl = percentile(r.itl_s, 50) if r.itl_s else None
        rows.append([_r(None if r.sent_perf is None or t0 is None else r.sent_perf - t0, 4),
                     _r(None if r.ttft_s is None else r.ttft_s * 1000), _r(r.e2e_s * 1000), r.output_tokens,
                     _r(None if itl is None else itl * 1000, 4), _r(r.output_tokens / r.e2e_s)])
    return good, {"fields": list(FIELDS), "rows": rows}


def batch_size(n: int) -> int:
    """MSER-b: the series is cut on means of b consecutive requests (MSER-5 from 50 requests on; smaller levels in
    smaller batches), which keeps one slow request from moving the cut."""
    return max(1, min(5, n // 10))


def mser_cut(xs: list[float]) -> int:
    """MSER's truncation point: the d in [0, len(xs) // 2] minimising sum((x - m)^2) / (n - d)^2 over xs[d:]."""
    n = len(xs)
    best_d, best = 0, None
    for d in range(0, n // 2 + 1):
        tail = xs[d:]
        m = sum(tail) / len(tail)
        v = sum((x - m) ** 2 for x in tail) / (len(tail) ** 2)
        if best is None or v < best - 1e-15:
            best_d, best = d, v
    return best_d


def still_settling(xs: list[float]) -> bool:
    """Does the series still trend: its first and second halves differ by more than 2 % and significantly (Welch,
    p < 0.01)?"""
    from gpudoctor.bench.records.stats import welch

    h = len(xs) // 2
    if h < 2 or len(xs) - h < 2:
        return False
    a, b = xs[:h], xs[h:]
    w = welch(a, b)
    ma = sum(a) / len(a)
    return w["p"] < 0.01 and ma > 0 and abs(w["diff"]) / ma > 0.02


def window(good: list) -> dict:
    """The `steady` section for the ok requests in send order (series()'s first value)."""
    n = len(good)
    if n < MIN_REQUESTS:
        return {"status": TOO_SHORT, "requests": n,
                "why": f"{n} ok requests: at least {MIN_REQUESTS} are needed to find a warm-up and a steady window"}
    xs = [r.e2e_s / max(1, r.output_tokens) for r in good]
    b = batch_size(n)
    means = [sum(xs[i:i + b]) / len(xs[i:i + b]) for i in range(0, n - n % b or n, b)]
    d = mser_cut(means) * b
    if d and sum(xs[:d]) / d <= (sum(xs[d:]) / (n - d)) * (1 + WARMUP_MARGIN):
        d = 0  # what MSER would cut is not slower than the rest: noise, not a warm-up
    if d >= (len(means) // 2) * b and d > 0 and still_settling(xs[d:]):
        return {"status": TOO_SHORT, "requests": n, "cut": d,
                "why": f"the time per token was still changing after half the level (MSER cut at request {d} of "
                       f"{n}, its limit, and the rest still trends): no steady state reached; run more requests "
                       "per level"}
    if n - d < MIN_WINDOW:
        return {"status": TOO_SHORT, "requests": n, "cut": d,
                "why": f"only {n - d} requests after the warm-up (needed: {MIN_WINDOW})"}
    win = good[d:]
    why = (f"MSER on the time per output token cut the first {d} request(s) as warm-up" if d else
           "MSER found no warm-up: every request counted")
    return {"status": STEADY, "requests": n, "first": d, "last": n - 1, "counted": n - d, "cut": d,
            "method": "MSER", "why": why, "metrics": metrics(good, d)}


def token_times(r) -> list[float]:
    """When each of a request's output tokens arrived (perf_counter seconds): the first chunk's at its TTFT, then
    one per inter-token gap."""
    if r.sent_perf is None or r.ttft_s is None:
        return []
    t = r.sent_perf + r.ttft_s
    out = [t] * max(1, r.output_tokens - len(r.itl_s))
    for g in r.itl_s:
        t += g
        out.append(t)
    return out


def metrics(good: list, d: int) -> dict:
    """The level's metrics over the steady window only. Throughput: every output token that arrived between the
    window's first request going out and the last request going out (the level at its full load: before it the
    warm-up, after it the drain, when fewer requests are left in flight), over that time; TTFT p50/p99, ITL p50 and
    e2e p50 over the window's requests."""
    win = good[d:]
    starts = [r.sent_perf for r in good if r.sent_perf is not None]
    t0 = win[0].sent_perf if win and win[0].sent_perf is not None else None
    t1 = max(starts) if starts else None
    span = (t1 - t0) if t0 is not None and t1 is not None else 0.0
    tps = None
    if span > 0:
        tps = sum(1 for r in good for t in token_times(r) if t0 <= t <= t1) / span
    ttft = [r.ttft_s for r in win if r.ttft_s is not None]
    gaps = [g for r in win for g in r.itl_s]
    e2e = [r.e2e_s for r in win]

    def ms(xs, q):
        v = percentile(xs, q)
        return None if v is None else v * 1000

    return {"output_tok_per_s": tps, "ttft_ms_p50": ms(ttft, 50), "ttft_ms_p99": ms(ttft, 99),
            "itl_ms_p50": ms(gaps, 50), "e2e_ms_p50": ms(e2e, 50), "window_s": round(span, 6)}


def sections(results: list) -> dict:
    """The record's `per_request` and `steady` sections for a level's results."""
    good, per = series(results)
    return {"per_request": per, "steady": window(good)}
