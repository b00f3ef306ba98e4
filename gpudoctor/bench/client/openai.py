"""OpenAI-compatible load (/v1/completions and /v1/chat/completions): the server's dialect, requests, the delta
parser, the served model's name, the context limit a server publishes and a readiness probe.

Dialects. By default a request carries only fields of OpenAI's own request schema (model, prompt or messages,
max_tokens, temperature, stream, stream_options.include_usage): servers that validate against that schema (Hugging
Face `transformers serve`, OpenAI's API, several others) refuse anything else with HTTP 422. SGLang and vLLM take
more, and are detected from what they answer (the /v1/models card's owned_by, SGLang's /server_info, vLLM's
/version) or named with `--server-kind`. To them a request is greedy (temperature 0) with ignore_eos and exactly
max_tokens new tokens, and asks for `stream_options: {"include_usage": true, "continuous_usage_stats": true}`: every
chunk then carries the cumulative completion_tokens, so a chunk that delivers three speculative tokens counts as
three tokens with a third of the gap each, as on the native API. SGLang's `return_spec_tokens_details` adds the
request's verify steps (sglext.spec_tokens_details), so accept length is per request on /v1 too; vLLM has no such
field. Token-id prompts go only to servers known to take them; to any other /v1/completions the prompt is a string.

Without ignore_eos a request may end early (finish_reason "stop"): the tokens it really produced are recorded, from
the usage the server reports, else from the tokenizer (--tokenizer-dir) over the streamed text, else one token per
content chunk (the estimate), and the request says which (`tokens_source`). A server that sends no per-chunk usage is
measured one token per content chunk (`itl_source: per-chunk`).

End of stream: `data: [DONE]`, or, from a server that never sends it, the connection closing cleanly after a chunk
with a finish_reason. An error event is kept verbatim, also when it is not valid JSON (transformers serve writes
`data: {"error": "<text>"}` without escaping the text).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import NamedTuple

from gpudoctor.bench.client.apispec import takes
from gpudoctor.bench.client.stream import _DATA, _DONE, RequestResult, error_message

NATIVE, COMPLETIONS, CHAT = "native", "completions", "chat"
APIS = (NATIVE, COMPLETIONS, CHAT)
PATHS = {NATIVE: "/generate", COMPLETIONS: "/v1/completions", CHAT: "/v1/chat/completions"}
STREAM_OPTIONS = {"include_usage": True, "continuous_usage_stats": True}
SGLANG, VLLM, OPENAI = "sglang", "vllm", "openai"
SERVER_KINDS = (SGLANG, VLLM, OPENAI)
EXTENDED = (SGLANG, VLLM)  # servers that take ignore_eos, continuous_usage_stats and token-id prompts
# Fields of OpenAI's request schema this client sends to any other server (openai.types.completion_create_params /
# chat.completion_create_params; stream_options is ChatCompletionStreamOptionsParam).
STANDARD_STREAM_OPTIONS = {"include_usage": True}
USAGE, TOKENIZER, ESTIMATE = "usage", "tokenizer", "estimate"
_FLAT_ERROR = re.compile(rb'^\{\s*"error"\s*:\s*"(.*)"\s*\}\s*$', re.S)
PERMANENT_4XX = (400, 401, 403, 404, 405, 413, 415, 422)  # a readiness probe answered so will never pass by waiting


def takes_token_ids(kind: str | None, api: str) -> bool:
    """Whether prompts may go as token ids: SGLang's /generate, and /v1/completions of SGLang and vLLM."""
    return api == NATIVE or (api == COMPLETIONS and kind in EXTENDED)


def request_body(payload: dict, max_tokens: int, api: str, model: str | None, kind: str | None = SGLANG) -> bytes:
    """The streamed request for one prompt (`payload`: {"text"} and/or {"input_ids"}, as Prompt.payload gives) in the
    dialect of `kind`: the fields apispec.REQUEST_FIELDS lists for it (SGLANG, VLLM: their extensions; anything else:
    OpenAI's schema only)."""
    ids = payload.get("input_ids")
    text = payload.get("text")
    if api == NATIVE:
        prompt = {"input_ids": ids} if ids is not None else {"text": text}
        return json.dumps({**prompt, "stream": True,
                           "sampling_params": {"temperature": 0.0, "max_new_tokens": max_tokens, "ignore_eos": True}},
                          separators=(",", ":")).encode()
    extended = kind in EXTENDED
    body: dict = {"model": model} if model else {}
    if api == CHAT:
        if text is None:
            raise ValueError("chat requests need text prompts (token-id prompts go to /v1/completions)")
        body["messages"] = [{"role": "user", "content": text}]
    elif ids is not None and (extended or text is None):
        body["prompt"] = ids
    else:
        body["prompt"] = text
    body.update({"max_tokens": max_tokens, "temperature": 0.0, "stream": True})
    if takes(kind, "ignore_eos"):
        body["ignore_eos"] = True
    body["stream_options"] = STREAM_OPTIONS if takes(kind, "stream_options.continuous_usage_stats") \
        else STANDARD_STREAM_OPTIONS
    if takes(kind, "return_spec_tokens_details"):
        body["return_spec_tokens_details"] = True
    return json.dumps(body, separators=(",", ":")).encode()


class OpenAIParser:
    """OpenAI chunks: per-chunk usage (cumulative completion_tokens) when present, else one token per content chunk.

    Chat's first chunk carries only the role: it is not the first token. An `{"error": ...}` chunk is the failure
    (SGLang turns an abort with a status code, e.g. 503 queue full, into one; transformers serve writes its text
    unescaped, so it is kept verbatim); `finish_reason: "abort"` is an abort. A chunk with a finish_reason ends the
    stream for a server that sends no [DONE]. A usage that arrives only with the final chunk (no per-chunk usage) is the
    total, not a step. `counter` (a subclass's, see parser_for) counts the streamed text when no usage came.
    """

    counter = None

    def __init__(self, r: RequestResult):
        self.r = r
        self.last_n = 0
        self.last_t = 0.0
        self.done = False
        self.ended = False  # a chunk with a finish_reason arrived: a clean close after it is a complete stream
        self.finish_reason = None
        self.error_code = None
        self.final_usage = None
        self.usage_chunks = 0
        self.parts: list[str] = []

    def feed(self, ev: bytes, now: float, st: float) -> None:
        r = self.r
        raw = ev[len(_DATA):]
        if raw[:1] != b"{":
            if ev.startswith(_DONE):
                self.done = True
            return
        try:
            obj = json.loads(raw)
        except ValueError:
            m = _FLAT_ERROR.match(raw)
            text = (m.group(1) if m else raw).decode("utf-8", "replace")
            r.error = " ".join(text.split())[:500] or "an empty error event"
            return
        if not isinstance(obj, dict):
            return
        if "error" in obj or obj.get("object") == "error":
            r.error, self.error_code = error_message(raw)
            return
        usage = obj.get("usage")
        ext = obj.get("sglext")
        if isinstance(ext, dict) and isinstance(ext.get("spec_tokens_details"), dict):
            vc = ext["spec_tokens_details"].get("spec_verify_ct")
            r.verify_ct = int(vc) if isinstance(vc, (int, float)) and vc > 0 else None
        choices = obj.get("choices") or []
        if not choices:
            if isinstance(usage, dict):
                self.final_usage = usage
            return
        c = choices[0]
        text = c.get("text")
        if text is None:
            text = (c.get("delta") or {}).get("content")
        if c.get("finish_reason"):
            self.finish_reason = c["finish_reason"]
            self.ended = True
        r.chunks += 1
        if text:
            self.parts.append(text)
        counted = isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int)
        if counted and (text or self.usage_chunks):
            n = usage["completion_tokens"]
            self.usage_chunks += 1
            if isinstance(usage.get("prompt_tokens"), int):
                r.prompt_tokens = usage["prompt_tokens"]
        elif counted:  # usage only on a text-less final chunk (transformers serve): the total, not a step
            self.final_usage = usage
            return
        elif text:
            n = self.last_n + 1
            r.usage_per_chunk = False
        else:
            return
        last_n = self.last_n
        if n > last_n:
            if last_n == 0:
                r.ttft_s = now - st
                r.first_wall = time.time()
            else:
                gap = (now - self.last_t) / (n - last_n)
                r.itl_s.extend([gap] * (n - last_n))
            self.last_n, self.last_t = n, now

    def finish(self) -> str | None:
        r = self.r
        r.output_tokens = self.last_n
        r.finish_reason = self.finish_reason
        u = self.final_usage
        r.tokens_source = USAGE if self.usage_chunks and r.usage_per_chunk else None
        if isinstance(u, dict):
            r.meta = {"usage": u}
            if isinstance(u.get("prompt_tokens"), int):
                r.prompt_tokens = u["prompt_tokens"]
            if not (self.usage_chunks and r.usage_per_chunk) and isinstance(u.get("completion_tokens"), int):
                r.output_tokens = u["completion_tokens"]
                r.tokens_source = USAGE
        if r.tokens_source is None:
            if self.counter is not None and self.counter.exact and self.parts:
                r.output_tokens = len(self.counter.encode("".join(self.parts)))
                r.tokens_source = TOKENIZER
            else:
                r.tokens_source = ESTIMATE
        if self.finish_reason == "abort":
            return "request aborted by the server (finish_reason abort)"
        if r.error is not None and self.error_code in (429, 500, 503) and self.last_n == 0:
            r_msg, r.error = r.error, None
            return f"request aborted by the server (status {self.error_code}): {r_msg}"
        return None


def parser_for(counter) -> type:
    """The OpenAI parser counting streamed text with `counter` when a server reports no usage (None: no tokenizer)."""
    if counter is None or not getattr(counter, "exact", False):
        return OpenAIParser
    return type("CountingOpenAIParser", (OpenAIParser,), {"counter": counter})


# ---- what the server says about itself --------------------------------------------------------------------------------
async def _get_json(s, url: str) -> tuple[int | None, object]:
    """(status, parsed JSON or None) of GET url; (None, why) when nothing answered."""
    import aiohttp

    try:
        async with s.get(url) as resp:
            raw = await resp.read()
            try:
                return resp.status, json.loads(raw)
            except ValueError:
                return resp.status, None
    except (asyncio.TimeoutError, aiohttp.ClientError) as exc:
        return None, f"{type(exc).__name__}: {exc}"


async def model_cards(base_url: str, timeout: float = 10.0) -> tuple[list[dict], str | None]:
    """The model cards of GET /v1/models as servers answer it (SGLang, vLLM: one card with max_model_len;
    transformers serve: the hub cache's models, maybe none, in any order; HTTP 500 when it has no cache), and why
    there are none (None when the list came)."""
    import aiohttp

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as s:
        status, data = await _get_json(s, base_url + "/v1/models")
    if status != 200:
        return [], (f"GET /v1/models answered HTTP {status}" if status else f"GET /v1/models failed: {data}")
    cards = data.get("data") if isinstance(data, dict) else None
    if not isinstance(cards, list):
        return [], "GET /v1/models answered no `data` list"
    return [c for c in cards if isinstance(c, dict) and isinstance(c.get("id"), str) and c["id"]], None


def choose_model(cards: list[dict], wanted: str | None, kind: str | None) -> tuple[str | None, str | None]:
    """The model name requests carry, and a note when it was not obvious.

    --model wins (a server pinned to a directory lists it nowhere). Otherwise the one listed card; SGLang and vLLM
    list exactly the served model (vLLM refuses any other name). With none or several listed, requests name no model:
    a pinned server (transformers serve MODEL) then uses its own, and the note says to pass --model.
    """
    if wanted:
        return wanted, None
    ids = [c["id"] for c in cards]
    if len(ids) == 1 or (ids and kind in EXTENDED):
        return ids[0], None
    if not ids:
        return None, "GET /v1/models lists no model: requests name none (the server's own); --model names one"
    return None, (f"GET /v1/models lists {len(ids)} models ({', '.join(ids[:4])}{', ...' if len(ids) > 4 else ''}):"
                  " requests name none (the server's own); --model picks one")


async def detect_kind(base_url: str, timeout: float = 10.0) -> tuple[str, str]:
    """Which dialect the server speaks, and what said so: SGLang (a /v1/models card owned_by "sglang", or its
    /server_info), vLLM (owned_by "vllm", or GET /version), else OPENAI (the standard schema only)."""
    import aiohttp

    cards, _ = await model_cards(base_url, timeout)
    owners = {str(c.get("owned_by")).lower() for c in cards}
    for kind in EXTENDED:
        if kind in owners:
            return kind, f"/v1/models owned_by {kind}"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as s:
        for path in ("/server_info", "/get_server_info"):
            status, info = await _get_json(s, base_url + path)
            if status == 200 and isinstance(info, dict) and ("context_length" in info or "version" in info):
                return SGLANG, f"GET {path}"
        status, info = await _get_json(s, base_url + "/version")
        if status == 200 and isinstance(info, dict) and isinstance(info.get("version"), str):
            return VLLM, "GET /version"
    return OPENAI, "neither SGLang nor vLLM answered as such: OpenAI's request schema only"


async def served_model(base_url: str, timeout: float = 10.0) -> str | None:
    """The first model id of GET /v1/models (SGLang: the served model name; vLLM: the same), None if it has none."""
    cards, _ = await model_cards(base_url, timeout)
    return cards[0]["id"] if cards else None


class Probe(NamedTuple):
    """A readiness probe's answer: what happened (None: the server generated), whether waiting cannot change it (a
    permanent 4xx), the HTTP status when one came, and the server's own words (its error body's message, one line)."""

    problem: str | None
    permanent: bool = False
    status: int | None = None
    words: str = ""


def body_words(payload: bytes) -> str:
    """An error body's message as one line (error_message's), at most 200 characters; "" for an empty body."""
    if not payload.strip():
        return ""
    msg, _ = error_message(payload)
    return " ".join(str(msg).split())[:200]


async def probe_completion(base_url: str, model: str | None, timeout: float) -> Probe:
    """Readiness on an OpenAI server: a one-token completion. Probe(None) when it succeeds within `timeout`, else what
    happened, with `permanent` set when waiting cannot help (a permanent 4xx, e.g. a pinned server asked for another
    model).

    /health says only that the HTTP server is up (vLLM answers it before a request could run); one generated token
    proves the engine works, as SGLang's /health_generate does on the native API. The request has only OpenAI-schema
    fields, and names a model only when one is known.
    """
    import aiohttp

    body = {"prompt": "ok", "max_tokens": 1, "temperature": 0.0}
    if model:
        body = {"model": model, **body}
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as s:
            async with s.post(base_url + PATHS[COMPLETIONS], json=body) as resp:
                if resp.status == 200:
                    return Probe(None)
                words = body_words(await resp.read())
                return Probe(f"a one-token completion answered HTTP {resp.status}: {words or '(empty body)'}",
                             resp.status in PERMANENT_4XX, resp.status, words)
    except asyncio.TimeoutError:
        return Probe(f"a one-token completion did not answer in {timeout:g} s")
    except aiohttp.ClientError as exc:
        return Probe(f"a one-token completion failed: {exc}")


async def tiny_completion(base_url: str, model: str | None, timeout: float) -> str | None:
    """probe_completion's message only: None when the server generated a token."""
    return (await probe_completion(base_url, model, timeout)).problem
