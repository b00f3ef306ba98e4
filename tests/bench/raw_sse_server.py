"""A raw-socket SSE server for parser edge cases: awkward byte splits, missing [DONE], empty and aborted streams.

Run: python raw_sse_server.py PORT. The request's "text" names the scenario.
"""

import asyncio
import json
import sys


def chunk(text, n, finish=None, extra=None):
    meta = {"id": "r", "finish_reason": finish, "prompt_tokens": 3, "completion_tokens": n, "cached_tokens": 0}
    meta.update(extra or {})
    return b"data: " + json.dumps({"text": text, "output_ids": [n], "meta_info": meta}).encode() + b"\n\n"


def scenario(name):
    tricky = 'he said "completion_tokens": 999 and left'
    if name == "split":
        body = (chunk(tricky, 1) + chunk(tricky + " x", 3) +
                chunk(tricky + " x y", 4, {"type": "length", "length": 4}, {"spec_verify_ct": 2}) + b"data: [DONE]\n\n")
        cuts = [7, 30, len(chunk(tricky, 1)) + 5, len(chunk(tricky, 1)) + 90]
        parts, last = [], 0
        for c in cuts + [len(body)]:
            parts.append(body[last:c])
            last = c
        return parts
    if name == "nodone":
        return [chunk("a", 1), chunk("a b", 2)]
    if name == "empty":
        return [b"data: [DONE]\n\n"]
    if name == "abort":
        return [chunk("a", 1), chunk("a", 1, {"type": "abort", "message": "out of memory"}), b"data: [DONE]\n\n"]
    return openai_scenario(name) or [b"data: [DONE]\n\n"]


def oa(text=None, finish=None, usage=None):
    """A /v1/completions chunk as transformers serve 5.17 writes it (exclude_none: no finish_reason until the end)."""
    choice = {"index": 0, "text": text if text is not None else ""}
    if finish:
        choice["finish_reason"] = finish
    obj = {"id": "r", "choices": [choice], "created": 1, "model": "m", "object": "text_completion"}
    if usage:
        obj["usage"] = usage
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def openai_scenario(name):
    """OpenAI-compatible streams without [DONE] (transformers serve): complete, cut short, or with an error."""
    u = {"completion_tokens": 4, "prompt_tokens": 3, "total_tokens": 7}
    if name == "oa-final":  # 4 tokens in 3 chunks (a partial UTF-8 character held back), final chunk with usage
        return [oa("a"), oa(" b"), oa(" c\u00e9"), oa("", "length", u)]
    if name == "oa-final-nolf":  # the same, the last event without its blank line before the close
        return [oa("a"), oa(" b"), oa(" c\u00e9"), oa("", "length", u)[:-2]]
    if name == "oa-cut":  # the connection closes after two chunks: no finish_reason, no [DONE]
        return [oa("a"), oa(" b")]
    if name == "oa-error":  # transformers serve's mid-stream error: the text is not escaped, so it is not JSON
        return [oa("a"), b'data: {"error": "CUDA error: "device-side assert" triggered"}\n\n']
    return None


async def handle(reader, writer):
    head = await reader.readuntil(b"\r\n\r\n")
    length = int([h.split(b":")[1] for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")][0])
    body = json.loads(await reader.readexactly(length))
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
    for part in scenario(body.get("text") or body.get("prompt")):
        writer.write(part)
        await writer.drain()
        await asyncio.sleep(0.02)
    writer.close()


async def main(port):
    server = await asyncio.start_server(handle, "127.0.0.1", port)
    print("listening", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
