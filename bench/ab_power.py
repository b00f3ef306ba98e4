#!/usr/bin/env python3
"""Does `bench compare` call a difference only when there is one? Its A/A false-positive rate and its power, measured.

Three SGLang stand-ins run as real processes: A and A2 with the same configuration, B with decoding 5 % slower
(--decode-tok-s x 0.95). For each of --pairs pairs, --trials trials per side are measured with gpudoctor's own load
generator (gpudoctor.bench.client.load.run_level: real HTTP streams, every record with its per-request series and
steady window), the sides interleaved (A B A B ...), and the cell is judged by gpudoctor.bench.records.compare, as
`gpudoctor bench compare` does:
  A/A  = A vs A2: a "faster" or "slower" verdict on tok/s is a false positive (target: <= 5 % of the pairs)
  power = A vs B: a "slower" verdict is a detection of the 5 % slowdown (target: >= 80 % of the pairs)

Usage: python bench/ab_power.py [--pairs 40] [--trials 3] [--concurrency 16] [--prompts 64] [--max-tokens 24]
       [--decode-tok-s 100] [--slowdown 0.05]
Prints both rates and the numbers behind them; exit 0 when both targets hold, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO))

from gpudoctor.bench.client.levels import wait_ready  # noqa: E402
from gpudoctor.bench.client.load import LevelSpec, new_session, run_level  # noqa: E402
from gpudoctor.bench.client.prompts import build, load_source  # noqa: E402
from gpudoctor.bench.client.tokens import Counter  # noqa: E402
from gpudoctor.bench.records.compare import FASTER, SLOWER, compare_cell  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(decode_tok_s: float, ttft_ms: float) -> tuple[subprocess.Popen, str]:
    port = free_port()
    p = subprocess.Popen([sys.executable, "-m", "gpudoctor.bench.standin", "--port", str(port), "--decode-tok-s",
                          str(decode_tok_s), "--ttft-ms", str(ttft_ms)], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, cwd=str(REPO))
    return p, f"http://127.0.0.1:{port}"


async def trial(url: str, label: str, k: int, args, prompts) -> dict:
    spec = LevelSpec(label=label, workload="ab", concurrency=args.concurrency, max_tokens=args.max_tokens,
                     num_prompts=args.prompts, trial=k)
    async with new_session(args.concurrency) as s:
        rec = await run_level(s, url, spec, prompts, stall_s=30)
    if rec["status"] != "ok":
        raise SystemExit(f"ab_power: a level failed on {url}: {rec.get('error')}")
    return rec


async def pairs(args) -> dict:
    procs = []
    try:
        a, url_a = start(args.decode_tok_s, args.ttft_ms)
        a2, url_a2 = start(args.decode_tok_s, args.ttft_ms)
        b, url_b = start(args.decode_tok_s * (1 - args.slowdown), args.ttft_ms)
        procs = [a, a2, b]
        for url in (url_a, url_a2, url_b):
            why = await wait_ready(url, 60)
            if why:
                raise SystemExit(f"ab_power: stand-in at {url} not ready: {why}")
        prompts = build(args.prompts, load_source("builtin"), Counter(), None, seed=11)
        for url in (url_a, url_a2, url_b):  # one unrecorded level each: the first connections, imports
            await trial(url, "warm", 0, args, prompts)
        out = {"aa": [], "ab": [], "aa_itl": [], "ab_itl": [], "load_before": os.getloadavg()[0]}
        t0 = time.monotonic()
        for i in range(args.pairs):
            for kind, other in (("aa", url_a2), ("ab", url_b)):
                ra, rb = [], []
                for k in range(args.trials):
                    ra.append(await trial(url_a, "A", k, args, prompts))
                    rb.append(await trial(other, "B", k, args, prompts))
                c = compare_cell({"pair": i}, ra, rb, effect=args.slowdown, min_effect=args.min_effect)
                out[kind].append(c["metrics"]["output_tok_per_s"])
                out[kind + "_itl"].append(c["metrics"]["itl_ms_p50"])
        out["seconds"] = time.monotonic() - t0
        out["load_after"] = os.getloadavg()[0]
        return out
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=40)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--decode-tok-s", type=float, default=100.0)
    ap.add_argument("--ttft-ms", type=float, default=5.0)
    ap.add_argument("--slowdown", type=float, default=0.05)
    ap.add_argument("--min-effect", type=float, default=0.01)
    args = ap.parse_args()
    res = asyncio.run(pairs(args))
    aa, ab = res["aa"], res["ab"]
    fp = [m for m in aa if m["verdict"] in (FASTER, SLOWER)]
    hit = [m for m in ab if m["verdict"] == SLOWER]
    wrong = [m for m in ab if m["verdict"] == FASTER]
    fpr, power = len(fp) / len(aa), len(hit) / len(ab)
    print(f"bench compare on the stand-in: {args.pairs} pairs x {args.trials} trials per side, concurrency "
          f"{args.concurrency}, {args.prompts} requests of {args.max_tokens} tokens per trial, "
          f"{res['seconds']:.0f} s; test: {aa[0].get('test')} ({aa[0].get('basis')}), verdict when significant "
          f"and >= {args.min_effect:.0%}")
    print(f"A/A (same config twice): false-positive rate {len(fp)}/{len(aa)} = {fpr:.1%} (target <= 5 %)")
    rel = sorted(m["rel"] for m in ab if m.get("rel") is not None)
    print(f"A vs B ({args.slowdown:.0%} slower decoding): power {len(hit)}/{len(ab)} = {power:.1%} (target >= 80 %); "
          f"measured change median {rel[len(rel) // 2]:+.2%}, range {rel[0]:+.2%} .. {rel[-1]:+.2%}; "
          f"called faster: {len(wrong)}")
    need = sorted((m.get("need") or {}).get("trials_per_side") or 0 for m in ab)
    if need and need[-1]:
        print(f"trials per side compare said would detect {args.slowdown:.0%} (80 % power), over the A/B pairs: "
              f"median {need[len(need) // 2]}, range {need[0]}..{need[-1]}")
    aarel = sorted(abs(m["rel"]) for m in aa if m.get("rel") is not None)
    print(f"A/A |change| median {aarel[len(aarel) // 2]:.2%}, max {aarel[-1]:.2%}")
    fp_itl = sum(1 for m in res["aa_itl"] if m["verdict"] in (FASTER, SLOWER))
    hit_itl = sum(1 for m in res["ab_itl"] if m["verdict"] == SLOWER)
    print(f"ITL p50 (the decoding the slowdown is in): A/A false positives {fp_itl}/{len(aa)}, power "
          f"{hit_itl}/{len(ab)}")
    print(f"load average (1 min) on this machine: {res['load_before']:.1f} before, {res['load_after']:.1f} after, "
          f"{os.cpu_count()} CPUs")
    ok = fpr <= 0.05 and power >= 0.80
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
