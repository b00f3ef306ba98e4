#!/usr/bin/env python3
"""How accurately does the open-loop load generator keep a request rate? Printed at 100, 500 and 2,000 req/s.

Part 1, the pacers alone (constant arrivals, no I/O), medians of --rounds:
  per-gap asyncio.sleep   sleep(1/rate) after each send: the common way (bench_serving's request-rate loop works
                          like this); every wake-up is late by the selector's millisecond rounding, and it adds up
  absolute asyncio.sleep  sleep until each absolute deadline: no drift, but each send still late by up to ~1 ms
  sleep+spin              gpudoctor.bench.client.pacing.SpinPacer: sleep to 1.5 ms before, then yield until due
  timerfd                 gpudoctor.bench.client.pacing.TimerfdPacer (gpudoctor's default on Linux)
  rate error = achieved rate / intended rate - 1 over the same sends; lateness = actual - scheduled send time.
Part 2, the load generator itself (gpudoctor.bench.client.load.send_all, timerfd pacer) against the instant SGLang
stand-in, Poisson arrivals, 4-token requests: the achieved rate from the times requests reached the wire, and how
late the pacer released them, while the same event loop is streaming the responses.

Usage: python bench/pacing.py [--seconds 2] [--rounds 3] [--rates 100,500,2000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO))

from gpudoctor.bench.client.load import new_session, send_all  # noqa: E402
from gpudoctor.bench.client.pacing import (CONSTANT, POISSON, SleepPacer, SpinPacer, TimerfdPacer,  # noqa: E402
                                    arrival_offsets, rate_error)


async def per_gap_sleep(n: int, rate: float) -> tuple[list[float], list[float]]:
    """sleep(1/rate) between sends; the schedule it meant to keep is start + i/rate."""
    start = time.perf_counter()
    actual = []
    for _ in range(n):
        actual.append(time.perf_counter())
        await asyncio.sleep(1.0 / rate)
    return [start + i / rate for i in range(n)], actual


async def with_pacer(pacer, n: int, rate: float) -> tuple[list[float], list[float]]:
    start = time.perf_counter() + 0.005
    sched = [start + t for t in arrival_offsets(n, rate, CONSTANT)]
    actual = [await pacer.wait_until(t) for t in sched]
    pacer.close()
    return sched, actual


def part1(rates: list[float], seconds: float, rounds: int) -> None:
    print("part 1: pacers alone, constant arrivals "
          f"({seconds:g} s per rate, median of {rounds} rounds)")
    print(f"  {'pacer':<24}{'req/s':>7}{'rate error':>13}{'late p50':>12}{'late p99':>12}")
    makers = [("per-gap asyncio.sleep", None), ("absolute asyncio.sleep", SleepPacer), ("sleep+spin", SpinPacer),
              ("timerfd (default)", TimerfdPacer)]
    for rate in rates:
        n = max(50, int(rate * seconds))
        for name, make in makers:
            rows = []
            for _ in range(rounds):
                coro = per_gap_sleep(n, rate) if make is None else with_pacer(make(), n, rate)
                rows.append(rate_error(*asyncio.run(coro)))
            err = statistics.median(r["rate_error"] for r in rows)
            p50 = statistics.median(r["late_us_p50"] for r in rows)
            p99 = statistics.median(r["late_us_p99"] for r in rows)
            print(f"  {name:<24}{rate:>7g}{err * 100:>12.3f}%{p50:>10.0f}us{p99:>10.0f}us")


def start_standin() -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(REPO)])))
    proc = subprocess.Popen([sys.executable, "-m", "gpudoctor.bench.standin", "--port", str(port), "--decode-tok-s",
                             "0", "--ttft-ms", "0"], env=env, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            with urllib.request.urlopen(url + "/ready", timeout=1):
                return proc, url
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("stand-in did not start")


async def open_loop(url: str, rate: float, n: int, seed: int) -> dict:
    body = (b'{"input_ids":[1,2,3,4,5,6,7,8],"stream":true,'
            b'"sampling_params":{"temperature":0.0,"max_new_tokens":4,"ignore_eos":true}}')
    import resource

    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    async with new_session(None) as session:
        results, wall, how = await send_all(session, url + "/generate", [body] * n, None, 30, request_rate=rate,
                                            arrival=POISSON, seed=seed)
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
    bad = [r for r in results if not r.ok]
    starts = sorted(r.sent_perf for r in results if r.sent_perf)
    achieved = (len(starts) - 1) / (starts[-1] - starts[0])
    sched = sorted(arrival_offsets(n, rate, POISSON, seed))
    intended = (n - 1) / (sched[-1] - sched[0])
    late = sorted(how["late_s"])
    return {"failed": len(bad), "rate_error": achieved / intended - 1, "late_p50": late[len(late) // 2] * 1e6,
            "late_p99": late[int(len(late) * 0.99)] * 1e6, "cpu_us": cpu / n * 1e6}


def part2(rates: list[float], seconds: float, rounds: int) -> None:
    print(f"part 2: gpudoctor's open-loop levels against the instant stand-in, Poisson arrivals, 4-token requests "
          f"({seconds:g} s per rate, median of {rounds} rounds)")
    print(f"  {'req/s':>7}{'rate error':>13}{'pacer late p50':>16}{'p99':>10}{'failed':>8}{'client CPU/req':>16}")
    proc, url = start_standin()
    try:
        for rate in rates:
            n = max(50, int(rate * seconds))
            rows = [asyncio.run(open_loop(url, rate, n, seed)) for seed in range(rounds)]
            med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
            print(f"  {rate:>7g}{med['rate_error'] * 100:>12.3f}%{med['late_p50']:>14.0f}us{med['late_p99']:>8.0f}us"
                  f"{int(med['failed']):>8}{med['cpu_us']:>14.0f}us")
        print("  (client CPU per request x rate > the CPU this client gets: the rate is CPU-bound, not pacing-bound;"
              " the stand-in needs about as much again on the same cores)")
    finally:
        proc.kill()
        proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rates", default="100,500,2000")
    a = ap.parse_args()
    rates = [float(r) for r in a.rates.split(",")]
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} (a shared machine; medians of rounds)")
    part1(rates, a.seconds, a.rounds)
    part2(rates, a.seconds, a.rounds)


if __name__ == "__main__":
    main()
