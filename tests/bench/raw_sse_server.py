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
    return [b"data: [DONE]\n\n"]


async def handle(reader, writer):
    head = await reader.readuntil(b"\r\n\r\n")
    length = int([h.split(b":")[1] for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")][0])
    body = json.loads(await reader.readexactly(length))
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
    for part in scenario(body.get("text")):
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
