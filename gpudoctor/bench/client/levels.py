"""Run a server's levels in order: warm up, skip what is recorded, stop sending once the server is broken.

Shared by `gpudoctor bench load` (a server someone else started) and the campaign runner (a server we started).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Callable

from gpudoctor.bench.server import logscan
from gpudoctor.bench.client.load import LevelSpec, new_session, run_level
from gpudoctor.bench.client.openai import (NATIVE, Probe, body_words, choose_model, detect_kind, model_cards,
                                           probe_completion, tiny_completion)
from gpudoctor.bench.client.prompts import Prompt, build, load_source
from gpudoctor.bench.client.tokens import Counter
from gpudoctor.bench.records.results import CRASHED, ERROR, OK, SKIPPED, ResultStore, key


@dataclass
class Level:
    """A level to run: its spec, its prompts, and why it cannot be sent (None when it can)."""

    spec: LevelSpec
    prompts: list[Prompt] = field(default_factory=list)
    misfit: str | None = None
    send: Callable | None = None  # a multi-turn or trace level's own send step (load.run_level's `send`)

    @property
    def key(self) -> tuple:
        s = self.spec
        return key({"label": s.label, "workload": s.workload, "concurrency": s.concurrency, "trial": s.trial,
                    "request_rate": s.request_rate})


async def health_generate(base_url: str, timeout: float) -> str | None:
    """None when /health_generate answers 200 within `timeout`, else what it did."""
    return (await _health_generate(base_url, timeout)).problem


async def _health_generate(base_url: str, timeout: float) -> Probe:
    """health_generate's answer; permanent on 404/405 (no SGLang /health_generate there)."""
    import aiohttp

    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as s:
            async with s.get(base_url + "/health_generate") as resp:
                if resp.status == 200:
                    return Probe(None)
                words = body_words(await resp.read())
                return Probe(f"/health_generate answered HTTP {resp.status}" + (f": {words}" if words else ""),
                             resp.status in (404, 405), resp.status, words)
    except asyncio.TimeoutError:
        return Probe(f"/health_generate did not answer in {timeout:g} s")
    except aiohttp.ClientError as exc:
        return Probe(f"/health_generate failed: {exc}")


async def ready_probe(base_url: str, timeout: float, api: str = NATIVE, model: str | None = None) -> str | None:
    """None when the server can generate: /health_generate on SGLang's native API (a one-token generation), a
    one-token /v1/completions request on an OpenAI server (vLLM's /health does not generate); else what it did."""
    if api == NATIVE:
        return await health_generate(base_url, timeout)
    return await tiny_completion(base_url, model, timeout)


# A server error is "consistent" once this many probes in a row, over at least this many seconds, got the same 5xx
# status with the same non-empty body. SGLang's 503 while it starts has an empty body, so it never counts.
CONSISTENT_5XX_PROBES = 3
CONSISTENT_5XX_S = 2.0
STOP, WAIT = "stop", "wait"  # wait_ready's on_5xx: end the wait, or say so once and keep waiting


class _ServerErrors:
    """The run of identical 5xx-with-a-body answers the readiness probe got, and when it began."""

    def __init__(self):
        self.key: tuple | None = None
        self.count = 0
        self.since = 0.0

    def see(self, answer: Probe, now: float) -> bool:
        """Count this answer; True when the run is now consistent."""
        if answer.status is None or not 500 <= answer.status <= 599 or not answer.words:
            self.key, self.count = None, 0
            return False
        key = (answer.status, answer.words)
        if key != self.key:
            self.key, self.count, self.since = key, 0, now
        self.count += 1
        return self.count >= CONSISTENT_5XX_PROBES and now - self.since >= CONSISTENT_5XX_S

    def line(self, now: float) -> str:
        status, words = self.key
        return (f"the server answered HTTP {status} to all {self.count} readiness probes in {now - self.since:.1f} s: "
                f"{words}")


async def wait_ready(base_url: str, deadline_s: float, alive: Callable[[], str | None] | None = None,
                     api: str = NATIVE, model: str | None = None, on_5xx: str | None = None,
                     say: Callable[[str], None] | None = None) -> str | None:
    """Poll the readiness probe until it passes (None) or the deadline passes (why not). `alive` says if it died.
    A permanent refusal (an HTTP 4xx such as a pinned server's 400 for another model, or 422) ends the wait at once
    with the server's words: waiting would not change it.

    A consistent server error (the same 5xx with the same body, CONSISTENT_5XX_PROBES times over CONSISTENT_5XX_S):
    on_5xx=STOP ends the wait with one line in the server's words; WAIT says that line once through `say` and keeps
    waiting to the deadline (a server that answers 5xx while it loads); None (the campaign's servers) waits silently."""
    import time

    end = time.monotonic() + deadline_s
    last = "no answer yet"
    errors = _ServerErrors()
    said = False
    while True:
        if alive is not None:
            gone = alive()
            if gone:
                return gone
        left = end - time.monotonic()
        if left <= 0:
            return f"not ready in {deadline_s:g} s (last: {last})"
        probe_s = max(1.5, min(left, 25.0))
        if api == NATIVE:
            answer = await _health_generate(base_url, probe_s)
        else:
            answer = await probe_completion(base_url, model, probe_s)
        last = answer.problem
        if not last:
            return None
        if answer.permanent:
            return f"the server refused the readiness probe: {last}"
        if on_5xx is not None and errors.see(answer, time.monotonic()) and not said:
            line = errors.line(time.monotonic())
            if on_5xx == STOP:
                return line + " (--wait-through-5xx waits the whole --ready-timeout instead)"
            said = True
            if say is not None:
                say(line + f"; waiting up to {deadline_s:g} s (--wait-through-5xx)")
        waited = deadline_s - (end - time.monotonic())
        await asyncio.sleep(max(0.0, min(0.2 if waited < 10 else 1.0, end - time.monotonic())))


def skipped_record(level: Level, reason: str) -> dict:
    """The record of a level that was not sent, with the reason."""
    return {**level.spec.head(), "status": SKIPPED, "completed": 0, "error": reason, "log_excerpt": None}


async def run_levels(base_url: str, store: ResultStore, levels: list[Level], *, stall_s: float = 120.0,
                     level_timeout_s: float | None = None, warmup: int = 2, log_path: str | None = None,
                     log_sync: Callable[[], None] | None = None, ready_timeout_s: float = 0.0,
                     record_skips: bool = True,
                     server_gone: Callable[[], str | None] | None = None,
                     on_event: Callable[..., None] | None = None, watch=None,
                     rerun_failed: bool = False, ready_5xx: str | None = None) -> list[dict]:
    """Run every level not yet in `store`, append its record, and return the records written now.

    With rerun_failed, a level recorded as anything but ok is measured again: its old record is retracted
    (kept in retracted.jsonl) when the new one is written.

    `log_sync` brings a remote server's local log mirror up to date before it is read.
    Once the server is broken (crashed, or unhealthy after a failed level) the remaining levels are recorded as
    skipped with the reason, or, with record_skips=False, left unrecorded for a restarted server to run.
    `watch` (gpudoctor.bench.cell.watch.CellWatch; default: one with its defaults) records and flushes the prefix cache
    before each level and samples the host's GPUs during it. `ready_5xx` is wait_ready's on_5xx for the readiness
    wait (ready_timeout_s > 0).
    """
    if watch is None:
        from gpudoctor.bench.cell.watch import CellWatch

        watch = CellWatch()
    emit = on_event or (lambda *a, **k: None)
    recorded = {key(r): r.get("status") for r in store.load()}
    again = {k for k, st in recorded.items() if st != OK} if rerun_failed else set()
    todo = [lv for lv in levels if lv.key not in recorded or lv.key in again]
    written: list[dict] = []
    log = logscan.LogWatch(log_path, sync=log_sync) if log_path else None
    broken: str | None = None

    def put(rec: dict) -> None:
        if key(rec) in again:
            store.retract([key(rec)], "measured again by a later run")
        rec = store.append(rec)
        written.append(rec)
        emit("level_done", record=rec)

    api = next((lv.spec.api for lv in todo), NATIVE)
    wanted = next((lv.spec.model for lv in todo if lv.spec.model), None)
    if ready_timeout_s > 0 and any(not lv.misfit for lv in todo):
        not_ready = await wait_ready(base_url, ready_timeout_s, api=api, model=wanted, on_5xx=ready_5xx,
                                     say=lambda text: emit("note", text=text))
        if not_ready:
            text = log.read_all() if log is not None else ""
            for lv in todo:
                rec = skipped_record(lv, lv.misfit) if lv.misfit else {
                    **lv.spec.head(), "status": ERROR, "completed": 0,
                    "error": f"server not ready: {not_ready}" + (f"; server log: {logscan.reason(text)}"
                                                                 if text and logscan.reason(text) else ""),
                    **logscan.record_fields(text)}
                put(rec)
            return written

    if api != NATIVE and todo:
        await dialect(base_url, [lv.spec for lv in todo], emit)
    warmed = warmup <= 0
    for lv in todo:
        if lv.misfit:
            put(skipped_record(lv, lv.misfit))
            continue
        if broken:
            if not record_skips:
                break
            put(skipped_record(lv, f"not run: {broken}"))
            continue
        emit("level_start", spec=lv.spec)
        async with new_session(lv.spec.concurrency) as session:
            if not warmed:
                warm = LevelSpec(label=lv.spec.label, workload="warmup", concurrency=min(warmup, 4),
                                 max_tokens=16, num_prompts=warmup, api=lv.spec.api, model=lv.spec.model,
                                 server_kind=lv.spec.server_kind)
                # Short prompts of their own: warming up on the level's prompts would prime the radix cache.
                wprompts = build(warmup, load_source("builtin"), Counter(), None, seed=7919)
                wrec = await run_level(session, base_url, warm, wprompts, stall_s=stall_s,
                                       level_timeout_s=level_timeout_s, log=log, server_gone=server_gone)
                warmed = True
                if wrec["status"] != OK:
                    rec = {**lv.spec.head(), **{k: wrec.get(k) for k in ("status", "cause", "diagnosis", "fix", "log_excerpt")},
                           "completed": 0, "error": "warm-up failed: " + wrec["error"],
                           # the warm-up's own counters: the text says "2 of 2 requests failed", so do the numbers
                           "warmup_requests": warm.num_prompts, "failed": wrec.get("failed"),
                           "error_rate": wrec.get("error_rate")}
                    put(rec)
                    broken = f"warm-up failed before {lv.spec.where}"
                    continue
            await watch.before(base_url)
            try:
                rec = await run_level(session, base_url, lv.spec, lv.prompts, stall_s=stall_s,
                                      level_timeout_s=level_timeout_s, log=log, server_gone=server_gone,
                                      on_request=lambda r: emit("request", result=r), send=lv.send)
            except BaseException:
                watch.abort()
                raise
            rec = await watch.finish(base_url, rec)
        put(rec)
        if rec["status"] == CRASHED:
            broken = f"the server crashed during {lv.spec.where}"
        elif rec["status"] != OK:
            unhealthy = await ready_probe(base_url, min(stall_s, 30.0), lv.spec.api, lv.spec.model)
            if unhealthy:
                broken = f"the server was unhealthy after {lv.spec.where} ({unhealthy})"
    return written


async def dialect(base_url: str, specs: list[LevelSpec], emit: Callable[..., None]) -> None:
    """Settle what the OpenAI levels send: the server's dialect (openai.detect_kind, unless a spec names it) and the
    model name (openai.choose_model: --model, else what /v1/models lists), with a note where it was not obvious."""
    need_kind = any(s.server_kind is None for s in specs)
    kind, how = await detect_kind(base_url) if need_kind else (specs[0].server_kind, "--server-kind")
    cards, why = await model_cards(base_url) if any(s.model is None for s in specs) else ([], None)
    notes = set()
    for s in specs:
        s.server_kind = s.server_kind or kind
        if s.model is None:
            s.model, note = choose_model(cards, None, s.server_kind)
            if note:
                notes.add(note + (f" ({why})" if why else ""))
    if need_kind:
        emit("note", text=f"server dialect: {kind} ({how})")
    for n in sorted(notes):
        emit("note", text=n)


async def server_context_limit(base_url: str, timeout: float = 10.0) -> int | None:
    """The context limit a running server reports: SGLang's /server_info (context_length, else max_req_input_len + 1),
    else the max_model_len of /v1/models (vLLM)."""
    import aiohttp

    for path in ("/server_info", "/get_server_info"):
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as s:
                async with s.get(base_url + path) as resp:
                    if resp.status != 200:
                        continue
                    info = await resp.json(content_type=None)
        except (asyncio.TimeoutError, aiohttp.ClientError, ValueError):
            continue
        if isinstance(info.get("context_length"), int):
            return info["context_length"]
        if isinstance(info.get("max_req_input_len"), int):
            return info["max_req_input_len"] + 1
    try:  # an OpenAI server (vLLM): the model card's max_model_len
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as s:
            async with s.get(base_url + "/v1/models") as resp:
                cards = (await resp.json(content_type=None)).get("data") or [] if resp.status == 200 else []
    except (asyncio.TimeoutError, aiohttp.ClientError, ValueError, AttributeError):
        return None
    limit = cards[0].get("max_model_len") if cards and isinstance(cards[0], dict) else None
    return limit if isinstance(limit, int) else None


async def unreachable(base_url: str, timeout: float = 2.0) -> str | None:
    """Why nothing can answer at base_url's host and port (a TCP connect: "connection refused", "timed out"), or
    None when something accepts connections there. Says at once what a readiness wait would only say at its end."""
    from urllib.parse import urlsplit

    u = urlsplit(base_url)
    port = u.port or (443 if u.scheme == "https" else 80)
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(u.hostname, port), timeout)
    except asyncio.TimeoutError:
        return f"no answer to a TCP connect to {u.hostname}:{port} in {timeout:g} s"
    except ConnectionRefusedError:
        return f"{u.hostname}:{port}: connection refused"
    except OSError as e:
        return f"{u.hostname}:{port}: {e.strerror or e}"
    writer.close()
    return None


async def context_limit(base_url: str, model_dirs: list[str | None] = (), timeout: float = 10.0
                        ) -> tuple[int | None, str]:
    """The context limit and where it came from: what the server publishes (SGLang /server_info, vLLM's /v1/models
    max_model_len), else max_position_embeddings of the model's config.json when the model is a local directory
    (`model_dirs`: --model, --tokenizer-dir), else None with the line that says the fit check is off."""
    import json
    import os

    limit = await server_context_limit(base_url, timeout)
    if limit:
        return limit, "the server"
    for d in model_dirs:
        path = os.path.join(d, "config.json") if d else None
        if not path or not os.path.isfile(path):
            continue
        try:
            with open(path, encoding="utf-8") as fh:
                conf = json.load(fh)
        except (OSError, ValueError):
            continue
        value = conf.get("max_position_embeddings") if isinstance(conf, dict) else None
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value, f"{path} (max_position_embeddings)"
    down = await unreachable(base_url)
    server = f"no server answers at {base_url} yet" if down else "the server publishes none"
    return None, (f"context limit unknown ({server} and no local config.json names one): the fit check is off; "
                  "--context-limit N turns it on")


def workload_name(prompt_set: str, context_len: int | None, max_tokens: int) -> str:
    """A stable, readable workload id: `builtin:ctx30000:out256` or `chat:short:out128`."""
    return f"{prompt_set}:{f'ctx{context_len}' if context_len else 'short'}:out{max_tokens}"
