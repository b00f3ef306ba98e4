"""Trace replay: timestamped arrivals with input/output lengths and shared-prefix blocks (the Mooncake format), sent
open loop on the timerfd pacer (gpudoctor.bench.client.pacing via load.send_all) at `time_scale` x the trace's own gaps.

A trace is JSONL, one request a line: {"timestamp": ms, "input_length": tokens, "output_length": tokens,
"hash_ids": [block ids]} (hash_ids optional). Each hash id stands for a block of `block_tokens` prompt tokens
(Mooncake: 512); requests naming the same leading hash ids share those blocks as a prefix, byte for byte, so a prefix
cache can serve them. A prompt is its blocks, cut or padded to input_length with text of its own. The record's
`trace` section says how well the schedule was kept (rate error, send lateness), how many prompt tokens the trace
shares with earlier requests, and what the server reported cached.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass

from gpudoctor.bench.client.prompts import _VOCAB, Prompt
from gpudoctor.bench.client.tokens import CHARS_PER_TOKEN, Counter
from gpudoctor.errors import InputError

DEFAULT_BLOCK_TOKENS = 512
MAX_REQUESTS = 1_000_000


@dataclass
class Entry:
    t_ms: float
    input_length: int
    output_length: int
    hash_ids: list[int]


def load_trace(path: str) -> list[Entry]:
    """The trace's requests in time order; anything malformed is InputError FILE:LINE."""
    from gpudoctor.files.inputs import read_jsonl

    out: list[Entry] = []
    for no, obj in read_jsonl(path, what="trace", max_bytes=512 << 20):
        vals = {}
        for k, lo in (("timestamp", 0), ("input_length", 1), ("output_length", 1)):
            v = obj.get(k)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v < lo or v == float("inf"):
                raise InputError(f"{k} must be a number >= {lo}, got {json.dumps(v)[:40]}", path=path, line=no)
            vals[k] = v
        if vals["input_length"] != int(vals["input_length"]) or vals["output_length"] != int(vals["output_length"]):
            raise InputError("input_length and output_length must be whole numbers of tokens", path=path, line=no)
        h = obj.get("hash_ids", [])
        if not isinstance(h, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in h):
            raise InputError("hash_ids must be a list of integers", path=path, line=no)
        if out and vals["timestamp"] < out[-1].t_ms:
            raise InputError(f"timestamp {vals['timestamp']} is before the previous line's {out[-1].t_ms}: a trace "
                             "is in time order", path=path, line=no)
        out.append(Entry(float(vals["timestamp"]), int(vals["input_length"]), int(vals["output_length"]), h))
        if len(out) > MAX_REQUESTS:
            raise InputError(f"more than {MAX_REQUESTS} requests", path=path, line=no)
    if not out:
        raise InputError("the trace has no requests", path=path)
    return out


def offsets(entries: list[Entry], time_scale: float) -> list[float]:
    """Seconds from the level's start at which each request is due: the trace's gaps x time_scale."""
    t0 = entries[0].t_ms
    return [(e.t_ms - t0) / 1000.0 * time_scale for e in entries]


def _block_text(h: int, tokens: int) -> str:
    """Block `h` as text of exactly `tokens` estimated tokens (4 characters each), starting with its own digest so
    two blocks share no prefix beyond chance."""
    head = hashlib.sha1(str(h).encode()).hexdigest()[:12] + " "
    rng = random.Random(h)
    n = int(tokens * CHARS_PER_TOKEN)
    body = []
    size = len(head)
    while size < n:
        w = rng.choice(_VOCAB)
        body.append(w)
        size += len(w) + 1
    return (head + " ".join(body) + " " * n)[:n]


def build_prompts(entries: list[Entry], counter: Counter, block_tokens: int = DEFAULT_BLOCK_TOKENS,
                  seed: int = 0) -> list[Prompt]:
    """One prompt per request: its hash blocks, then text of its own, input_length tokens in all (exactly with an
    exact counter: the blocks' ids; by the 4-chars-a-token estimate otherwise)."""
    blocks: dict[int, object] = {}
    out = []
    for i, e in enumerate(entries):
        own = f"\n[request {i} ({seed})] "
        if counter.exact:
            ids: list[int] = []
            for h in e.hash_ids:
                if h not in blocks:
                    blocks[h] = counter.encode(_block_text(h, block_tokens))[:block_tokens]
                ids += blocks[h]
            ids = ids[: e.input_length]
            if len(ids) < e.input_length:
                ids += counter.encode(own + _block_text(-1 - i, e.input_length - len(ids)))[: e.input_length - len(ids)]
            out.append(Prompt(input_ids=ids, tokens=len(ids), upper_bound=len(ids), exact=True))
            continue
        text = "".join(blocks.setdefault(h, _block_text(h, block_tokens)) for h in e.hash_ids)
        n = int(e.input_length * CHARS_PER_TOKEN)
        text = text[:n]
        if len(text) < n:
            text += (own + _block_text(-1 - i, e.input_length))[: n - len(text)]
        out.append(Prompt(text=text, tokens=counter.count(text), upper_bound=counter.upper_bound(text)))
    return out


def shared_tokens(entries: list[Entry], block_tokens: int) -> list[int]:
    """Per request: prompt tokens in leading hash blocks an earlier request already sent (what a prefix cache that
    kept everything could serve), at most input_length - 1."""
    seen: set[tuple] = set()
    out = []
    for e in entries:
        k = 0
        while k < len(e.hash_ids) and tuple(e.hash_ids[: k + 1]) in seen:
            k += 1
        out.append(min(k * block_tokens, e.input_length - 1))
        for j in range(1, len(e.hash_ids) + 1):
            seen.add(tuple(e.hash_ids[:j]))
    return out


def sender(spec, entries: list[Entry], prompts: list[Prompt], time_scale: float, block_tokens: int):
    """The level's send step for load.run_level: every request at its (scaled) time, open loop."""
    from gpudoctor.bench.cell import cache as cachelib
    from gpudoctor.bench.client.load import request_body, send_all
    from gpudoctor.bench.client.openai import PATHS, SGLANG, takes_token_ids
    from gpudoctor.bench.client.pacing import rate_error
    from gpudoctor.bench.client.prompts import as_text

    due = offsets(entries, time_scale)

    def bodies() -> list[bytes]:
        """The requests in the server's dialect, built when the level is sent: run_levels settles spec.server_kind
        (--server-kind, else detected) and spec.model after the level is made."""
        kind = spec.server_kind or SGLANG  # native /generate: the dialect does not matter
        sent = prompts if takes_token_ids(kind, spec.api) else [as_text(p, spec.counter) for p in prompts]
        return [request_body(p, e.output_length, spec.api, spec.model, kind) for p, e in zip(sent, entries)]

    shared = shared_tokens(entries, block_tokens)

    async def send(session, base_url, stall_s, on_request):
        wire = bodies()
        results, wall, how = await send_all(session, base_url + PATHS[spec.api], wire, spec.concurrency, stall_s,
                                            on_request, api=spec.api, max_error_rate=spec.max_error_rate,
                                            offsets=due, counter=spec.counter,
                                            targets=[e.output_length for e in entries])
        sent = [r.sent_perf for r in results if r.sent_perf is not None]
        err = rate_error(due[: len(sent)], sorted(sent)) if len(sent) == len(results) else {"rate_error": None}
        cached = [cachelib.cached_tokens(r.meta) for r in results if r.ok]
        known = bool(cached) and all(c is not None for c, _ in cached)
        late = how["late_s"]
        how["planned"] = len(wire)
        how["extra"] = {"trace": {
            "requests": len(entries), "time_scale": time_scale, "block_tokens": block_tokens,
            "span_s": due[-1], "rate_error": err.get("rate_error"),
            "late_ms_max": max(late) * 1000 if late else None,
            "shared_prefix_tokens": sum(shared), "prompt_tokens": sum(e.input_length for e in entries),
            "cached_tokens": sum(c for c, _ in cached) if known else "unknown",
            "cached_tokens_source": cached[0][1] if cached else "unknown",
            "requests_sharing": sum(1 for s in shared if s > 0),
            "requests_sharing_cached": (sum(1 for s, (c, _) in zip(shared, cached) if s > 0 and c and c >= s)
                                        if known and len(cached) == len(shared) else "unknown")}}
        return results, wall, how

    return send
