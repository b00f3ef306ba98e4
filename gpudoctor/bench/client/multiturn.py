"""Agentic multi-turn workloads: sessions of K turns, each turn re-sending the conversation so far.

A session is a system prompt and K user messages (the built-in set, or a JSONL of conversations). Turn k sends the
system prompt, the user turns 1..k-1 with the server's *actual* answers to them, and user message k; between turns
the session thinks for `think_s`. A level runs `num_prompts` sessions, `concurrency` of them at a time. On SGLang
what turn k costs depends on its radix cache: turns 1..k-1 (and the answers) are a cached prefix, so TTFT by turn
index and the cache hit rate (cached / prompt tokens) are the level's story; both are in the record's `multi_turn`
section, per turn: TTFT and ITL p50, prompt and cached tokens (gpudoctor.bench.cell.cache.cached_tokens says where the
server reported them; "unknown" where it does not).

Text layout (native /generate and /v1/completions): `SYSTEM\\n\\nUser: U1\\nAssistant:A1\\nUser: U2\\nAssistant:`, so
turn k+1's prompt begins with turn k's prompt and answer byte for byte; /v1/chat/completions sends messages.
Answers are read from the final native chunk (SGLang's cumulative text; not with --incremental-streaming-output)
or from the /v1 deltas.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

from gpudoctor.bench.cell import cache as cachelib
from gpudoctor.bench.client.openai import CHAT, NATIVE, PATHS, OpenAIParser
from gpudoctor.bench.client.stream import _DATA, NativeParser, RequestResult, Watchdog, stream_request
from gpudoctor.errors import InputError

SYSTEM = ("You are a coding agent working in a Linux repository. Think step by step, call tools by writing their "
          "name and arguments, and answer briefly.")
USER_TURNS = ("List the files under src/ and say which one holds the HTTP server.",
              "Open server.py and summarise how requests are routed.",
              "The /health endpoint returns 500 under load. Propose a fix.",
              "Write the patch as a unified diff.",
              "Add a unit test for the fix.",
              "Run the tests and report what failed.",
              "Fix the failing test and show the final diff.",
              "Write the commit message.")


@dataclass
class Conversation:
    system: str
    turns: list[str]


def builtin(n: int, turns: int) -> list[Conversation]:
    """n sessions sharing the system prompt (as an agent's sessions do), each starting at its own user message."""
    return [Conversation(SYSTEM, [f"[session {s}] " + USER_TURNS[(s + k) % len(USER_TURNS)] if k == 0 else
                                  USER_TURNS[(s + k) % len(USER_TURNS)] for k in range(turns)]) for s in range(n)]


def load_conversations(path: str, turns: int) -> list[Conversation]:
    """A JSONL of conversations: {"system": "...", "turns": ["user 1", ...]} or ShareGPT's {"conversations":
    [{"from": "human"|"gpt", "value": ...}]} (its human turns; the server answers them itself). Each needs >= `turns`
    user turns. Bad lines: InputError FILE:LINE."""
    from gpudoctor.files.inputs import read_jsonl

    out = []
    for no, obj in read_jsonl(path, what="conversations file", max_bytes=256 << 20):
        if "conversations" in obj:
            conv = obj["conversations"]
            users = [m.get("value") for m in conv if isinstance(m, dict) and m.get("from") in ("human", "user")] \
                if isinstance(conv, list) else None
            system = next((m.get("value") for m in conv if isinstance(m, dict) and m.get("from") == "system"), "") \
                if isinstance(conv, list) else ""
        else:
            users, system = obj.get("turns"), obj.get("system", "")
        if not isinstance(users, list) or not all(isinstance(u, str) and u for u in users):
            raise InputError('needs "turns" (a list of user messages) or ShareGPT "conversations"', path=path,
                             line=no)
        if not isinstance(system, str):
            raise InputError('"system" must be a string', path=path, line=no)
        if len(users) < turns:
            raise InputError(f"has {len(users)} user turns, the workload asks for {turns}", path=path, line=no)
        out.append(Conversation(system, users[:turns]))
    if not out:
        raise InputError("no conversations", path=path)
    return out


def turn_text(system: str, done: list[tuple[str, str]], user: str) -> str:
    head = system + "\n\n" if system else ""
    return head + "".join(f"User: {u}\nAssistant:{a}\n" for u, a in done) + f"User: {user}\nAssistant:"


def turn_messages(system: str, done: list[tuple[str, str]], user: str) -> list[dict]:
    msgs = [{"role": "system", "content": system}] if system else []
    for u, a in done:
        msgs += [{"role": "user", "content": u}, {"role": "assistant", "content": a}]
    return msgs + [{"role": "user", "content": user}]


def turn_body(api: str, model: str | None, max_tokens: int, system: str, done, user: str,
              kind: str | None = None) -> bytes:
    """One turn's request in the server's dialect (`kind`, gpudoctor.bench.client.openai: SGLang's when unknown)."""
    from gpudoctor.bench.client.openai import SGLANG, request_body

    kind = kind or SGLANG
    if api == CHAT:
        body = json.loads(request_body({"text": ""}, max_tokens, api, model, kind))
        body["messages"] = turn_messages(system, done, user)
        return json.dumps(body, separators=(",", ":")).encode()
    return request_body({"text": turn_text(system, done, user)}, max_tokens, api, model, kind)


class _NativeAnswer(NativeParser):
    def finish(self):
        out = super().finish()
        try:
            self.r.answer = json.loads(self.last_event[len(_DATA):]).get("text") if self.last_event else None
        except ValueError:
            self.r.answer = None
        return out


class _OpenAIAnswer(OpenAIParser):
    def __init__(self, r):
        super().__init__(r)
        self.parts: list[str] = []
        r.answer = ""

    def feed(self, ev, now, st):
        if ev[len(_DATA):len(_DATA) + 1] == b"{" and b'"choices":[{' in ev:
            try:
                c = json.loads(ev[len(_DATA):])["choices"][0]
                t = c.get("text") if "text" in c else (c.get("delta") or {}).get("content")
                if t:
                    self.parts.append(t)
            except (ValueError, KeyError, IndexError, TypeError, AttributeError):
                pass
        super().feed(ev, now, st)

    def finish(self):
        self.r.answer = "".join(self.parts)
        return super().finish()


def turn_stats(results: list[tuple[int, RequestResult]], turns: int) -> dict:
    """The record's multi_turn section from (turn index, result) pairs."""
    from gpudoctor.bench.records.results import percentile

    per = []
    src = "unknown"
    sum_c = sum_p = 0
    known = True
    for k in range(turns):
        rs = [r for i, r in results if i == k and r.ok]
        cached = []
        for r in rs:
            c, where = cachelib.cached_tokens(r.meta)
            cached.append(c)
            if c is not None:
                src = where
        prompt = [r.prompt_tokens for r in rs if isinstance(r.prompt_tokens, int)]
        if any(c is None for c in cached) or len(prompt) != len(rs):
            known = False
        else:
            sum_c += sum(cached)
            sum_p += sum(prompt)
        ttft = [r.ttft_s * 1000 for r in rs if r.ttft_s is not None]
        itl = [g * 1000 for r in rs for g in r.itl_s]
        per.append({"turn": k + 1, "requests": len(rs), "ttft_ms_p50": percentile(ttft, 50),
                    "ttft_ms_mean": sum(ttft) / len(ttft) if ttft else None, "itl_ms_p50": percentile(itl, 50),
                    "prompt_tokens_mean": sum(prompt) / len(prompt) if prompt else None,
                    "cached_tokens_mean": (sum(cached) / len(cached)) if cached and None not in cached else "unknown"})
    return {"turns": turns, "cached_tokens_source": src, "by_turn": per,
            "cache_hit_rate": (sum_c / sum_p) if known and sum_p else "unknown"}


def sender(spec, convs: list[Conversation], turns: int, think_s: float):
    """The level's send step for load.run_level: the sessions, `spec.concurrency` at a time."""
    from gpudoctor.bench.client.load import Breaker

    n = spec.num_prompts
    sessions = [convs[i % len(convs)] for i in range(n)]

    async def send(session, base_url, stall_s, on_request):
        url = base_url + PATHS[spec.api]
        parser = _NativeAnswer if spec.api == NATIVE else _OpenAIAnswer
        sem = asyncio.Semaphore(spec.concurrency or n)
        breaker = Breaker(spec.max_error_rate, n * turns)
        watchdog = Watchdog(stall_s)
        got: list[tuple[int, int, RequestResult]] = []

        async def one(s: int) -> None:
            conv = sessions[s]
            done: list[tuple[str, str]] = []
            async with sem:
                for k in range(turns):
                    if breaker.tripped:
                        return
                    if k and think_s > 0:
                        await asyncio.sleep(think_s)
                    body = turn_body(spec.api, spec.model, spec.max_tokens, conv.system, done, conv.turns[k],
                                     spec.server_kind)
                    r = await stream_request(session, url, body, stall_s, watchdog, parser)
                    got.append((s, k, r))
                    breaker.record(r.ok)
                    if on_request is not None:
                        on_request(r)
                    if not r.ok or r.answer is None:
                        if r.ok:
                            r.ok, r.error = False, "no answer text to continue the conversation with"
                        return
                    done.append((conv.turns[k], r.answer))

        t0 = time.perf_counter()
        dog = asyncio.create_task(watchdog.run())
        try:
            await asyncio.gather(*(one(s) for s in range(n)))
        finally:
            dog.cancel()
        wall = time.perf_counter() - t0
        got.sort(key=lambda x: (x[0], x[1]))
        results = [r for _, _, r in got]
        extra = {"multi_turn": {**turn_stats([(k, r) for _, k, r in got], turns), "sessions": n,
                                "think_s": think_s}}
        return results, wall, {"tripped": breaker.tripped, "late_s": [], "planned": n * turns, "extra": extra}

    return send
