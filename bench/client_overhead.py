#!/usr/bin/env python3
"""How much does gpudoctor's load generator cost? Measured against the stand-in and a minimal aiohttp loop, one run.

Targets (issue #6): against a stand-in that answers instantly, the client sustains >= 10,000 streamed chunks/s on a
2-core machine, and its measured TTFT adds < 1 ms over the server-side truth at concurrency 64. The server-side truth is
the stand-in's own `prefill_finished_ts - request_received_ts` (SGLang's timing fields) for the same request.

Usage: python bench/client_overhead.py [--concurrency 64] [--requests 512] [--max-tokens 256] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO))  # tests.*; gpudoctor itself: the installed package

from gpudoctor.bench.load import new_session, request_body, send_all  # noqa: E402
from gpudoctor.bench.prompts import build, load_source  # noqa: E402
from gpudoctor.bench.tokens import Counter  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_standin(*args: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "gpudoctor.bench.standin", "--port", str(port), *args],
                            env=env, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            with urllib.request.urlopen(url + "/health_generate", timeout=1) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("stand-in did not start")


async def minimal_loop(url: str, bodies: list[bytes], concurrency: int) -> tuple[int, float, list[float]]:
    """The simplest correct aiohttp streaming client: count data lines, time the first one, read the last meta."""
    import aiohttp

    sem = asyncio.Semaphore(concurrency)
    chunks = 0
    overhead: list[float] = []

    async def one(session, body):
        nonlocal chunks
        async with sem:
            st = time.perf_counter()
            first = None
            last = None
            async with session.post(url + "/generate", data=body,
                                    headers={"Content-Type": "application/json"}) as resp:
                async for line in resp.content:
                    if line.startswith(b"data: {"):
                        if first is None:
                            first = time.perf_counter() - st
                        chunks += 1
                        last = line
            meta = json.loads(last[6:])["meta_info"]
            overhead.append(first - (meta["prefill_finished_ts"] - meta["request_received_ts"]))

    conn = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=None)) as session:
        t0 = time.perf_counter()
        await asyncio.gather(*(one(session, b) for b in bodies))
        return chunks, time.perf_counter() - t0, overhead


async def gpudoctor_client(url: str, bodies: list[bytes], concurrency: int) -> tuple[int, float, list[float]]:
    async with new_session(concurrency) as session:
        results, wall = await send_all(session, url + "/generate", bodies, concurrency, stall_s=60)
    bad = [r for r in results if not r.ok]
    if bad:
        raise SystemExit(f"{len(bad)} requests failed: {bad[0].error}")
    overhead = [r.ttft_s - (r.meta["prefill_finished_ts"] - r.meta["request_received_ts"]) for r in results]
    SPLIT.extend((r.meta["request_received_ts"] - r.sent_wall, r.first_wall - r.meta["prefill_finished_ts"])
                 for r in results if r.sent_wall and r.first_wall)
    return sum(r.chunks for r in results), wall, overhead


SPLIT: list[tuple[float, float]] = []  # (sent -> server handler, first chunk written -> client saw it), seconds


def cpu_s() -> float:
    import resource

    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def ttft_bodies(n: int, seed: int = 5) -> list[bytes]:
    """Requests of 8..40 tokens: their ends spread out, so new requests arrive one by one as in steady state."""
    import random

    rng = random.Random(seed)
    prompts = build(n, load_source("builtin"), Counter(), None)
    return [request_body(p, rng.randint(8, 40)) for p in prompts]


def measure(url: str, bodies: list[bytes], concurrency: int, rounds: int) -> dict:
    """Best of `rounds`: chunks/s (wall), TTFT overhead p50 and mean (ms), client CPU per chunk (us)."""
    rows = {"gpudoctor": [], "minimal": []}
    for _ in range(rounds):  # interleave so drift on a shared machine hits both alike
        for name, fn in (("minimal", minimal_loop), ("gpudoctor", gpudoctor_client)):
            c0 = cpu_s()
            chunks, wall, over = asyncio.run(fn(url, bodies, concurrency))
            cpu = cpu_s() - c0
            rows[name].append((chunks / wall, statistics.median(over) * 1000, statistics.mean(over) * 1000,
                               cpu / chunks * 1e6))
    return {name: (max(x[0] for x in r), min(x[1] for x in r), min(x[2] for x in r), min(x[3] for x in r))
            for name, r in rows.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--requests", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    # Phase 1: everything instant, so the client (and the stand-in) run flat out: chunks/s.
    proc, url = start_standin("--decode-tok-s", "0", "--ttft-ms", "0")
    try:
        prompts = build(a.requests, load_source("builtin"), Counter(), None)
        rate = measure(url, [request_body(p, a.max_tokens) for p in prompts], a.concurrency, a.rounds)
    finally:
        proc.kill()
        proc.wait()
    # Phase 2: the first token is instant and decode is paced (20 tok/s per request), so the machine is not saturated
    # and TTFT minus the server's own TTFT is what the client adds, not queueing in a flat-out server.
    proc, url = start_standin("--decode-tok-s", "20", "--ttft-ms", "0")
    try:
        SPLIT.clear()
        ttft = measure(url, ttft_bodies(a.requests // 2), a.concurrency, a.rounds)
        split = list(SPLIT)
    finally:
        proc.kill()
        proc.wait()
    print(f"{os.cpu_count()} CPUs, concurrency {a.concurrency}, best of {a.rounds} interleaved rounds")
    print(f"phase 1, stand-in instant, {a.requests} requests x {a.max_tokens} tokens:")
    for name, (r, p50, mean, cpu) in rate.items():
        print(f"  {name:>10}: {r:9.0f} chunks/s wall, client CPU {cpu:5.1f} us/chunk "
              f"(= {1e6 / cpu:7.0f} chunks per client CPU-second)")
    print(f"phase 2, instant first token, 20 tok/s decode, {a.requests // 2} requests of 8..40 tokens:")
    for name, (r, p50, mean, cpu) in ttft.items():
        print(f"  {name:>10}: TTFT over server truth p50 {p50:.3f} ms, mean {mean:.3f} ms")
    to_server = statistics.median(s[0] for s in split) * 1000
    to_client = statistics.median(s[1] for s in split) * 1000
    print(f"  gpudoctor split (p50): request sent -> stand-in handler {to_server:.3f} ms (loopback + the stand-in's "
          f"HTTP stack); first chunk written -> client saw it {to_client:.3f} ms (loopback + client)")
    ratio = rate["gpudoctor"][0] / rate["minimal"][0]
    print(f"ratio gpudoctor / minimal aiohttp loop: {ratio:.2f}x chunks/s; TTFT overhead "
          f"{ttft['gpudoctor'][1]:.3f} ms vs {ttft['minimal'][1]:.3f} ms")
    ok_rate = rate["gpudoctor"][0] >= 10_000
    ok_ttft = ttft["gpudoctor"][1] < 1.0
    print(f"target >= 10000 chunks/s: {'met' if ok_rate else 'NOT met'}; "
          f"target TTFT overhead < 1 ms at concurrency {a.concurrency}: {'met' if ok_ttft else 'NOT met'} "
          f"(client side of it: {to_client:.3f} ms)")
    raise SystemExit(0 if ok_rate and ok_ttft else 1)


if __name__ == "__main__":
    main()
