"""OpenAI-compatible load (SGLang's and vLLM's /v1/completions and /v1/chat/completions): requests, the delta parser,
the served model's name and a readiness probe.

Requests are greedy (temperature 0) with ignore_eos and exactly max_tokens new tokens, and ask for
`stream_options: {"include_usage": true, "continuous_usage_stats": true}`, which both SGLang 0.5.23 and vLLM honour:
every chunk then carries the cumulative completion_tokens, so a chunk that delivers three speculative tokens counts as
three tokens with a third of the gap each, as on the native API. A server that ignores it is measured one token per
content chunk, and the record says so (`itl_source: per-chunk`). SGLang's `return_spec_tokens_details` adds the
request's verify steps (sglext.spec_tokens_details), so accept length is per request on /v1 too; vLLM has no such field.
"""

from __future__ import annotations

import asyncio
import json
import time

from gpudoctor.bench.stream import _DATA, _DONE, RequestResult, error_message

NATIVE, COMPLETIONS, CHAT = "native", "completions", "chat"
APIS = (NATIVE, COMPLETIONS, CHAT)
PATHS = {NATIVE: "/generate", COMPLETIONS: "/v1/completions", CHAT: "/v1/chat/completions"}
STREAM_OPTIONS = {"include_usage": True, "continuous_usage_stats": True}


def request_body(payload: dict, max_tokens: int, api: str, model: str | None) -> bytes:
    """The streamed request for one prompt (`payload`: {"text"} or {"input_ids"}, as Prompt.payload gives)."""
    if api == NATIVE:
        return json.dumps({**payload, "stream": True,
                           "sampling_params": {"temperature": 0.0, "max_new_tokens": max_tokens, "ignore_eos": True}},
                          separators=(",", ":")).encode()
    body: dict = {"model": model} if model else {}
    if api == CHAT:
        if "text" not in payload:
            raise ValueError("chat requests need text prompts (token-id prompts go to /v1/completions)")
        body["messages"] = [{"role": "user", "content": payload["text"]}]
    else:
        body["prompt"] = payload.get("input_ids", payload.get("text"))
    body.update({"max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True, "stream": True,
                 "stream_options": STREAM_OPTIONS, "return_spec_tokens_details": True})
    return json.dumps(body, separators=(",", ":")).encode()


class OpenAIParser:
    """OpenAI chunks: per-chunk usage (cumulative completion_tokens) when present, else one token per content chunk.

    Chat's first chunk carries only the role: it is not the first token. An `{"error": ...}` chunk is the failure
    (SGLang turns an abort with a status code, e.g. 503 queue full, into one); `finish_reason: "abort"` is an abort.
    """

    def __init__(self, r: RequestResult):
        self.r = r
        self.last_n = 0
        self.last_t = 0.0
        self.done = False
        self.finish_reason = None
        self.error_code = None
        self.final_usage = None

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
        r.chunks += 1
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            n = usage["completion_tokens"]
            if isinstance(usage.get("prompt_tokens"), int):
                r.prompt_tokens = usage["prompt_tokens"]
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
        u = self.final_usage
        if isinstance(u, dict):
            r.meta = {"usage": u}
            if isinstance(u.get("prompt_tokens"), int):
                r.prompt_tokens = u["prompt_tokens"]
            if not r.usage_per_chunk and isinstance(u.get("completion_tokens"), int):
                r.output_tokens = u["completion_tokens"]
        if self.finish_reason == "abort":
            return "request aborted by the server (finish_reason abort)"
        if r.error is not None and self.error_code in (429, 500, 503) and self.last_n == 0:
            r_msg, r.error = r.error, None
            return f"request aborted by the server (status {self.error_code}): {r_msg}"
        return None


async def served_model(base_url: str, timeout: float = 10.0) -> str | None:
    """The first model id of GET /v1/models (SGLang: the served model name; vLLM: the same), None if it has none."""
    import aiohttp

    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as s:
            async with s.get(base_url + "/v1/models") as resp:
                if resp.status != 200:
                    return None
                data = (await resp.json(content_type=None)).get("data") or []
    except (asyncio.TimeoutError, aiohttp.ClientError, ValueError, AttributeError):
        return None
    return str(data[0]["id"]) if data and isinstance(data[0], dict) and data[0].get("id") else None


async def tiny_completion(base_url: str, model: str | None, timeout: float) -> str | None:
    """Readiness on an OpenAI server: None when a one-token completion succeeds within `timeout`, else what happened.

    /health says only that the HTTP server is up (vLLM answers it before a request could run); one generated token
    proves the engine works, as SGLang's /health_generate does on the native API.
    """
    import aiohttp

    body = {"prompt": "ok", "max_tokens": 1, "temperature": 0.0}
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as s:
            if model is None:
                model = await served_model(base_url, timeout)
                if model is None:
                    return "GET /v1/models named no model"
            async with s.post(base_url + PATHS[COMPLETIONS], json={"model": model, **body}) as resp:
                if resp.status == 200:
                    return None
                msg, _ = error_message(await resp.read())
                return f"a one-token completion answered HTTP {resp.status}: {msg}"
    except asyncio.TimeoutError:
        return f"a one-token completion did not answer in {timeout:g} s"
    except aiohttp.ClientError as exc:
        return f"a one-token completion failed: {exc}"

