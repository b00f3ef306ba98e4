"""The server's prefix cache around a cell: its state recorded before the level and, by default, flushed, so a cell
measures what its own requests share and not what the previous level left (sglang#39651: cache-state provenance).

SGLang: POST /flush_cache (refused while requests run: "Cache not flushed"); its state is read from /server_info
where the server reports it (the stand-in's `standin_prefix_cache_tokens`; SGLang 0.5.23 has no such field, so
"unknown"). vLLM: POST /reset_prefix_cache exists only with VLLM_SERVER_DEV_MODE=1; elsewhere the record says it was
not flushed and why. Every record of a level says which (`cache: {policy, action, before}`).

Where a server reports cached prompt tokens per request: SGLang's native meta_info.cached_tokens, and on /v1
usage.prompt_tokens_details.cached_tokens (SGLang with --enable-cache-report, vLLM with
--enable-prompt-tokens-details); otherwise "unknown".
"""

from __future__ import annotations

import asyncio

FLUSH, KEEP = "flush", "keep"
POLICIES = (FLUSH, KEEP)
NATIVE_SOURCE, USAGE_SOURCE = "meta_info.cached_tokens", "usage.prompt_tokens_details.cached_tokens"


def cached_tokens(meta: dict | None) -> tuple[int | None, str]:
    """(cached prompt tokens, where the number came from) from a request's final meta (RequestResult.meta: native
    meta_info, or {"usage": ...} on /v1); (None, "unknown") when the server did not say."""
    meta = meta or {}
    if isinstance(meta.get("cached_tokens"), int):
        return meta["cached_tokens"], NATIVE_SOURCE
    details = (meta.get("usage") or {}).get("prompt_tokens_details") if isinstance(meta.get("usage"), dict) else None
    if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
        return details["cached_tokens"], USAGE_SOURCE
    return None, "unknown"


async def _post(base_url: str, path: str, timeout: float) -> tuple[int | None, str]:
    import aiohttp

    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as s:
            async with s.post(base_url + path) as resp:
                return resp.status, (await resp.text())[:200].strip()
    except (asyncio.TimeoutError, aiohttp.ClientError) as exc:
        return None, f"{type(exc).__name__}: {exc}"


async def state(base_url: str, timeout: float = 5.0) -> dict | str:
    """What the server says its cache holds, or "unknown"."""
    import aiohttp

    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as s:
            async with s.get(base_url + "/server_info") as resp:
                info = await resp.json(content_type=None) if resp.status == 200 else {}
    except (asyncio.TimeoutError, aiohttp.ClientError, ValueError):
        return "unknown"
    states = info.get("internal_states") if isinstance(info, dict) else None
    st = states[0] if isinstance(states, list) and states and isinstance(states[0], dict) else {}
    if isinstance(st.get("standin_prefix_cache_tokens"), int):
        return {"cached_tokens": st["standin_prefix_cache_tokens"]}
    return "unknown"


async def before_cell(base_url: str, policy: str = FLUSH, timeout: float = 10.0) -> dict:
    """Record the cache state, then flush it (policy flush: SGLang's /flush_cache, else vLLM's /reset_prefix_cache)
    or leave it (keep): the record's `cache` section."""
    out = {"policy": policy, "before": await state(base_url)}
    if policy == KEEP:
        return {**out, "action": "kept (policy keep)"}
    code, text = None, ""
    for _ in range(20):  # SGLang refuses while requests run (a previous level's stragglers): wait for them
        code, text = await _post(base_url, "/flush_cache", timeout)
        if code == 200:
            return {**out, "action": "flushed (POST /flush_cache)"}
        if code != 400:
            break
        await asyncio.sleep(0.1)
    if code in (404, 405):  # not SGLang: vLLM's dev-mode endpoint
        code, text = await _post(base_url, "/reset_prefix_cache", timeout)
        if code == 200:
            return {**out, "action": "flushed (POST /reset_prefix_cache)"}
        return {**out, "action": f"not flushed: no /flush_cache, and POST /reset_prefix_cache answered {code or text}"
                                 " (vLLM serves it only with VLLM_SERVER_DEV_MODE=1)"}
    return {**out, "action": f"not flushed: POST /flush_cache answered {code or ''} {text}".strip()}
