"""A level's steady state: its per-request series, the warm-up found in it, and the metrics of the window after it.

The warm-up (the server's first requests of a level, a cold cache, clocks ramping, a batch filling) shows as the first
requests taking longer per token. The series is each ok request's time per output token (e2e / output tokens) in the
order the requests were sent; the cut is MSER (White 1997, the Marginal Standard Error Rule): drop the first d requests
where d minimises the squared standard error of the remaining mean, sum((x - mean)^2) / (n - d)^2, with d searched up
to half the series. The window is every request from the cut to the last one sent; the record says which (`first`,
`last`: indexes into `per_request.rows`), how many were cut, and why.

A level is "too short" (no numbers, and the record says why) when it has fewer than MIN_REQUESTS ok requests, when
the best cut is at the half-way limit (the series is still changing there: no steady state reached), or when fewer
than MIN_WINDOW requests remain.
"""

from __future__ import annotations

from gpudoctor.bench.records.results import percentile

MIN_REQUESTS = 8
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


def window(good: list) -> dict:
    """The `steady` section for the ok requests in send order (series()'s first value)."""
    n = len(good)
    if n < MIN_REQUESTS:
        return {"status": TOO_SHORT, "requests": n,
                "why": f"{n} ok requests: at least {MIN_REQUESTS} are needed to find a warm-up and a steady window"}
    xs = [r.e2e_s / max(1, r.output_tokens) for r in good]
    d = mser_cut(xs)
    if d == n // 2 and n // 2 > 0:
        return {"status": TOO_SHORT, "requests": n, "cut": d,
                "why": f"the time per token was still settling half-way through the level (MSER cut at request {d} "
                       f"of {n}, its limit): no steady state reached; run more requests per level"}
    if n - d < MIN_WINDOW:
        return {"status": TOO_SHORT, "requests": n, "cut": d,
                "why": f"only {n - d} requests after the warm-up (needed: {MIN_WINDOW})"}
    win = good[d:]
    why = (f"MSER on the time per output token cut the first {d} request(s) as warm-up" if d else
           "MSER found no warm-up: every request counted")
    return {"status": STEADY, "requests": n, "first": d, "last": n - 1, "counted": n - d, "cut": d,
            "method": "MSER", "why": why, "metrics": metrics(win)}


def metrics(win: list) -> dict:
    """The level's metrics over the window's requests only: throughput = their output tokens / (the last one's end
    - the first one's start), TTFT p50/p99, ITL p50 over their inter-token gaps, e2e p50."""
    starts = [r.sent_perf for r in win if r.sent_perf is not None]
    ends = [r.sent_perf + r.e2e_s for r in win if r.sent_perf is not None]
    span = (max(ends) - min(starts)) if starts else 0.0
    ttft = [r.ttft_s for r in win if r.ttft_s is not None]
    gaps = [g for r in win for g in r.itl_s]
    e2e = [r.e2e_s for r in win]

    def ms(xs, q):
        v = percentile(xs, q)
        return None if v is None else v * 1000

    return {"output_tok_per_s": (sum(r.output_tokens for r in win) / span) if span > 0 else None,
            "ttft_ms_p50": ms(ttft, 50), "ttft_ms_p99": ms(ttft, 99), "itl_ms_p50": ms(gaps, 50),
            "e2e_ms_p50": ms(e2e, 50), "duration_s": round(span, 6)}


def sections(results: list) -> dict:
    """The record's `per_request` and `steady` sections for a level's results."""
    good, per = series(results)
    return {"per_request": per, "steady": window(good)}
