#!/usr/bin/env python3
"""How much does gpudoctor's load generator cost, next to SGLang's own bench_serving, on the same server in one run?

The server is the SGLang 0.5.23 stand-in with real payload sizes (cumulative text and output_ids in every chunk).
  phase 1: it answers instantly; each client streams --requests x --max-tokens chunks at --concurrency: chunks/s.
  phase 2: instant first token, 20 tok/s decode, 8..40 tokens per request, at --concurrency: TTFT error = the
           client's TTFT minus the server's own (first chunk handed to the socket - request arrival, from the
           stand-in's --timing-log), medians over the run, for each client.
Clients, interleaved round by round: gpudoctor (gpudoctor.bench.client.load.send_all), SGLang's bench_serving
(`python -m sglang.benchmark.serving --backend sglang`, sglang 0.5.23), and a minimal aiohttp loop (phase 1 only).

bench_serving runs from a throwaway venv this script makes (--system-site-packages): `pip install --no-deps
sglang==0.5.23` plus the modules its import needs (msgspec, transformers, safetensors, pyzmq, pybase64, and aiohttp,
numpy, tqdm, requests, orjson, huggingface_hub, tokenizers, regex, pyyaml, pillow, psutil when missing). It is not
given torch: a small launcher maps the `sglang`, `sglang.srt`, `sglang.srt.utils` packages to their directories
without running their __init__ (which import torch), provides the one constant serving.py takes from the torch-only
sglang.srt.disaggregation.utils (FAKE_BOOTSTRAP_HOST) and an empty `datasets` for the MMMU loader it never uses.
Its tokenizer is a local WordLevel tokenizer.json written here (no model hub); prompts are `random-ids`.

Usage: python bench/client_overhead.py [--concurrency 64] [--requests 512] [--max-tokens 256] [--rounds 3]
                                       [--venv DIR] (reuse a venv made by an earlier run)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO))  # gpudoctor itself: the installed package, else this checkout

from gpudoctor.bench.client.load import new_session, send_all  # noqa: E402

SGLANG = "sglang==0.5.23"
BENCH_DEPS = ["msgspec", "transformers", "safetensors", "pyzmq", "pybase64", "aiohttp", "numpy", "tqdm", "requests",
              "orjson", "huggingface_hub", "tokenizers", "regex", "pyyaml", "pillow", "psutil", "packaging",
              "filelock"]
LAUNCHER = '''
import importlib.util, os, sys, types
base = os.path.dirname(importlib.util.find_spec("sglang").origin)
def package(name, *parts):
    m = types.ModuleType(name); m.__path__ = [os.path.join(base, *parts)]; sys.modules[name] = m
package("sglang"); package("sglang.srt", "srt"); package("sglang.srt.utils", "srt", "utils")
package("sglang.srt.disaggregation", "srt", "disaggregation")
dis = types.ModuleType("sglang.srt.disaggregation.utils"); dis.FAKE_BOOTSTRAP_HOST = "2.2.2.2"
sys.modules["sglang.srt.disaggregation.utils"] = dis
if importlib.util.find_spec("datasets") is None:
    ds = types.ModuleType("datasets")
    def load_dataset(*a, **k): raise RuntimeError("HF datasets is not installed (only the MMMU loader uses it)")
    ds.load_dataset = load_dataset; sys.modules["datasets"] = ds
from sglang.benchmark.serving import cli_main
cli_main()
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_venv(path: Path) -> Path:
    """A venv with bench_serving importable (see the module docstring); its python."""
    py = path / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(path)], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps", SGLANG,
                    *BENCH_DEPS], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    (path / "bench_serving_launcher.py").write_text(LAUNCHER)
    return py


def make_tokenizer(path: Path) -> Path:
    """A local WordLevel tokenizer (4096 ids) that transformers' AutoTokenizer loads: no model hub."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "[PAD]": 1, **{f"w{i}": i for i in range(2, 4096)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]", "pad_token": "[PAD]",
         "model_max_length": 131072}))
    return path


def start_standin(*args: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gpudoctor.bench.standin", "--port", str(port), *args],
                            env=dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(REPO)]))),
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            with urllib.request.urlopen(url + "/ready", timeout=1) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("stand-in did not start")


def bodies(n: int, input_len: int, out_lens: list[int], seed: int) -> list[bytes]:
    rng = random.Random(seed)
    return [json.dumps({"input_ids": [rng.randrange(2, 4096) for _ in range(input_len)], "stream": True,
                        "sampling_params": {"temperature": 0.0, "max_new_tokens": out, "ignore_eos": True}},
                       separators=(",", ":")).encode() for out in out_lens[:n]]


def cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


async def gpudoctor_run(url: str, reqs: list[bytes], concurrency: int) -> dict:
    async with new_session(concurrency) as session:
        c0 = cpu_s()
        results, wall, _ = await send_all(session, url + "/generate", reqs, concurrency, stall_s=60)
        cpu = cpu_s() - c0
    bad = [r for r in results if not r.ok]
    if bad:
        raise SystemExit(f"gpudoctor: {len(bad)} requests failed: {bad[0].error}")
    chunks = sum(r.chunks for r in results)
    return {"chunks_s": chunks / wall, "cpu_us_chunk": cpu / chunks * 1e6,
            "ttft_ms_p50": statistics.median(r.ttft_s for r in results) * 1000}


async def minimal_run(url: str, reqs: list[bytes], concurrency: int) -> dict:
    """The simplest correct aiohttp streaming client: count data lines."""
    import aiohttp

    sem = asyncio.Semaphore(concurrency)
    chunks = 0

    async def one(session, body):
        nonlocal chunks
        async with sem:
            async with session.post(url + "/generate", data=body,
                                    headers={"Content-Type": "application/json"}) as resp:
                async for line in resp.content:
                    if line.startswith(b"data: {"):
                        chunks += 1

    conn = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=None)) as session:
        c0, t0 = cpu_s(), time.perf_counter()
        await asyncio.gather(*(one(session, b) for b in reqs))
        wall, cpu = time.perf_counter() - t0, cpu_s() - c0
    return {"chunks_s": chunks / wall, "cpu_us_chunk": cpu / chunks * 1e6, "ttft_ms_p50": None}


def bench_serving_run(py: Path, url: str, tok: Path, out_dir: Path, n: int, input_len: int, output_len: int,
                      range_ratio: float, concurrency: int, tag: str) -> dict:
    out = out_dir / f"bs-{tag}.jsonl"
    argv = [str(py), str(py.parent.parent / "bench_serving_launcher.py"), "--backend", "sglang", "--base-url", url,
            "--dataset-name", "random-ids", "--tokenize-prompt", "--random-input-len", str(input_len),
            "--random-output-len", str(output_len), "--random-range-ratio", str(range_ratio), "--num-prompts", str(n),
            "--max-concurrency", str(concurrency), "--tokenizer", str(tok), "--output-file", str(out),
            "--disable-tqdm", "--seed", "1"]
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ, HF_HUB_OFFLINE="1"), timeout=600)
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
    if p.returncode != 0 or not out.exists():
        raise SystemExit(f"bench_serving failed (rc {p.returncode}): {(p.stderr or p.stdout).strip()[-800:]}")
    d = json.loads(out.read_text().splitlines()[-1])
    if d["completed"] != n:
        raise SystemExit(f"bench_serving completed {d['completed']} of {n} requests")
    # one chunk per token here (the stand-in sends 1 token per step): chunks/s = output tokens / duration
    return {"chunks_s": d["total_output_tokens"] / d["duration"], "cpu_s": cpu, "chunks": d["total_output_tokens"],
            "ttft_ms_p50": d["median_ttft_ms"]}


def bench_serving_cpu_per_chunk(py, url, tok, tmp, n, input_len, k, c) -> dict:
    """bench_serving's client CPU per chunk: its process's CPU for the full run minus that of a 1-request run (the
    same imports, start-up and warm-up), over the difference in chunks."""
    full = bench_serving_run(py, url, tok, tmp, n, input_len, k, 1.0, c, "p1")
    tiny = bench_serving_run(py, url, tok, tmp, 1, input_len, k, 1.0, 1, "p1-tiny")
    per = (full["cpu_s"] - tiny["cpu_s"]) / max(1, full["chunks"] - tiny["chunks"]) * 1e6
    return {"chunks_s": full["chunks_s"], "cpu_us_chunk": per, "ttft_ms_p50": full["ttft_ms_p50"]}


def server_ttft_ms(timing_log: Path, since: int) -> tuple[float, int]:
    """Median server-side TTFT (first chunk handed to the socket - arrival) of the requests logged after `since`."""
    lines = timing_log.read_text().splitlines()[since:]
    ttft = [(json.loads(x)["first_sent"] - json.loads(x)["received"]) * 1000 for x in lines]
    return statistics.median(ttft), len(lines)


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="gpudoctor-client-overhead-"))
    try:
        run(tmp)
    finally:  # the throwaway venv (unless --venv named one), the tokenizer, bench_serving's outputs
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


def run(tmp: Path) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--requests", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--venv", default=None, help="where to make (or reuse) bench_serving's venv [default: a temp dir]")
    a = ap.parse_args()
    venv = Path(a.venv) if a.venv else tmp / "venv"
    t0 = time.monotonic()
    try:
        py = make_venv(venv)
    except subprocess.CalledProcessError as exc:
        raise SystemExit(f"cannot make bench_serving's venv in {venv}: {(exc.stderr or b'').decode()[-600:]}")
    print(f"bench_serving venv ready in {time.monotonic() - t0:.0f} s: {venv} ({SGLANG} --no-deps, no torch)")
    tok = make_tokenizer(tmp / "tokenizer")
    c, n, k = a.concurrency, a.requests, a.max_tokens
    rows: dict[str, dict[str, list]] = {"phase1": {}, "phase2": {}}

    # Phase 1: instant server, fixed lengths: chunks/s.
    proc, url = start_standin("--decode-tok-s", "0", "--ttft-ms", "0")
    try:
        reqs = bodies(n, a.input_len, [k] * n, seed=1)
        clients = [("gpudoctor", lambda: asyncio.run(gpudoctor_run(url, reqs, c))),
                   ("bench_serving", lambda: bench_serving_cpu_per_chunk(py, url, tok, tmp, n, a.input_len, k, c)),
                   ("minimal aiohttp", lambda: asyncio.run(minimal_run(url, reqs, c)))]
        for i in range(a.rounds):  # interleaved, order rotated: drift on a shared machine hits every client alike
            for name, fn in clients[i % 3:] + clients[:i % 3]:
                rows["phase1"].setdefault(name, []).append(fn())
    finally:
        proc.kill()
        proc.wait()

    # Phase 2: instant first token, paced decode, 8..40 tokens (arrivals spread out as in steady state): TTFT error.
    timing = tmp / "timing.jsonl"
    timing.touch()
    proc, url = start_standin("--decode-tok-s", "20", "--ttft-ms", "0", "--enable-metrics", "--timing-log",
                              str(timing))
    n2 = max(c * 2, n // 2)
    try:
        rng = random.Random(5)
        reqs = bodies(n2, a.input_len, [rng.randint(8, 40) for _ in range(n2)], seed=2)
        for i in range(a.rounds):
            for name in ("gpudoctor", "bench_serving")[::1 if i % 2 == 0 else -1]:
                since = len(timing.read_text().splitlines())
                if name == "gpudoctor":
                    r = asyncio.run(gpudoctor_run(url, reqs, c))
                else:  # output lengths uniform in [8, 40]: 40 with range ratio 0.2
                    r = bench_serving_run(py, url, tok, tmp, n2, a.input_len, 40, 0.2, c, "p2")
                truth, _ = server_ttft_ms(timing, since)
                r["ttft_err_ms"] = r["ttft_ms_p50"] - truth
                r["server_ttft_ms"] = truth
                rows["phase2"].setdefault(name, []).append(r)
    finally:
        proc.kill()
        proc.wait()

    med = lambda xs: statistics.median(xs) if xs and None not in xs else None  # noqa: E731
    load = os.getloadavg()[0]
    print(f"{os.cpu_count()} CPUs, load average {load:.1f} at the end (a shared machine: the numbers are medians of "
          f"{a.rounds} interleaved rounds in this one run, order rotated)")
    print(f"phase 1, stand-in instant, {n} requests x {k} tokens (cumulative text + output_ids), concurrency {c}:")
    p1 = {name: {key: med([r[key] for r in rs]) for key in rs[0]} for name, rs in rows["phase1"].items()}
    for name, m in p1.items():
        cpu = f", client CPU {m['cpu_us_chunk']:.1f} us/chunk" if m["cpu_us_chunk"] else ""
        print(f"  {name:>16}: {m['chunks_s']:9.0f} chunks/s{cpu}")
    print(f"phase 2, instant first token, 20 tok/s decode, {n2} requests of 8..40 tokens, concurrency {c}:")
    p2 = {name: {key: med([r[key] for r in rs]) for key in rs[0]} for name, rs in rows["phase2"].items()}
    for name, m in p2.items():
        print(f"  {name:>16}: TTFT p50 {m['ttft_ms_p50']:.2f} ms, server's own {m['server_ttft_ms']:.2f} ms: "
              f"TTFT error {m['ttft_err_ms']:+.2f} ms")
    g1, b1 = p1["gpudoctor"], p1["bench_serving"]
    g2, b2 = p2["gpudoctor"], p2["bench_serving"]
    print("  (all three are bound by the stand-in on the other core: chunks/s compares throughput through the same "
          "server; client CPU per chunk is each client's own cost)")
    print(f"ratio gpudoctor / bench_serving: {g1['chunks_s'] / b1['chunks_s']:.2f}x chunks/s, "
          f"{b1['cpu_us_chunk'] / g1['cpu_us_chunk']:.2f}x less client CPU per chunk; TTFT error "
          f"{g2['ttft_err_ms']:.2f} ms vs {b2['ttft_err_ms']:.2f} ms "
          f"({b2['ttft_err_ms'] / g2['ttft_err_ms']:.1f}x smaller)" if g2["ttft_err_ms"] > 0 else "")
    ok_rate = g1["chunks_s"] >= 10_000
    ok_ttft = g2["ttft_err_ms"] < 1.0
    print(f"target >= 10000 chunks/s: {'met' if ok_rate else 'NOT met'}; target TTFT error < 1 ms at concurrency "
          f"{c}: {'met' if ok_ttft else 'NOT met'}")
    raise SystemExit(0 if ok_rate and ok_ttft else 1)


if __name__ == "__main__":
    main()
