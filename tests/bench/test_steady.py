"""Steady state per level (gpudoctor.bench.records.steady): the warm-up cut, the window, "too short"."""

from __future__ import annotations

import random

from gpudoctor.bench.client.stream import RequestResult
from gpudoctor.bench.records import steady


def results(per_token_s: list[float], tokens: int = 20, concurrency: int = 4) -> list[RequestResult]:
    out, clock = [], [0.0] * concurrency
    for i, pt in enumerate(per_token_s):
        slot = min(range(concurrency), key=lambda k: clock[k])
        start = clock[slot]
        e2e = pt * tokens
        r = RequestResult(ok=True, ttft_s=pt, e2e_s=e2e, itl_s=[pt] * (tokens - 1), output_tokens=tokens,
                          sent_perf=1000.0 + start)
        clock[slot] = start + e2e
        out.append(r)
    return out


def test_a_slow_start_is_cut_and_the_window_recorded():
    rng = random.Random(1)
    series = [0.030 - 0.001 * i for i in range(10)] + [0.020 * (1 + rng.uniform(-0.01, 0.01)) for _ in range(40)]
    sec = steady.sections(results(series))
    s = sec["steady"]
    assert s["status"] == "steady" and 5 <= s["first"] <= 15 and s["last"] == 49
    assert s["counted"] == 50 - s["first"] and "warm-up" in s["why"]
    assert len(sec["per_request"]["rows"]) == 50 and sec["per_request"]["fields"][0] == "start_s"
    m = s["metrics"]
    assert m["ttft_ms_p50"] < 21 and m["output_tok_per_s"] > 0


def test_no_warm_up_counts_every_request():
    rng = random.Random(2)
    s = steady.sections(results([0.02 * (1 + rng.uniform(-0.02, 0.02)) for _ in range(30)]))["steady"]
    assert s["status"] == "steady" and s["first"] == 0 and s["counted"] == 30


def test_too_few_requests_says_so_instead_of_a_number():
    s = steady.sections(results([0.02] * 5))["steady"]
    assert s["status"] == "too_short" and "metrics" not in s and "5 ok requests" in s["why"]


def test_a_level_still_slowing_down_has_no_steady_state():
    s = steady.sections(results([0.02 + 0.001 * i for i in range(40)]))["steady"]
    # the time per token grows through the level: later requests are slower, nothing to cut, and the trend stays
    assert s["status"] in ("steady", "too_short")
    s2 = steady.sections(results([0.04 - 0.0008 * i for i in range(40)]))["steady"]
    assert s2["status"] == "too_short" and "no steady state" in s2["why"]


def test_mser_cut_on_a_step():
    assert steady.mser_cut([5, 5, 5, 1, 1, 1, 1, 1, 1, 1]) == 3
    assert steady.mser_cut([1.0] * 10) == 0
