"""One streamed SGLang /generate request, measured. This is the client's hot path: keep it cheap.

SGLang's chunks carry the cumulative `text`, so parsing every chunk's JSON costs O(n^2) in the output length. We read
`completion_tokens` from the raw bytes with one rfind (meta_info is serialized after text, and an unescaped quote cannot
occur inside a JSON string) and parse only the final chunk fully, for spec_verify_ct and the finish reason.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass, field

_KEY = b'"completion_tokens":'
_KEY_LEN = len(_KEY)
_NUM = re.compile(rb"\s*(\d+)")
_DATA = b"data: "
_DONE = b"data: [DONE]"
_ERR = b'data: {"error"'
JSON_HEADERS = {"Content-Type": "application/json"}

# Failure kinds: how a request failed decides whether the level is `crashed` or `error`.
CONNECT, DISCONNECT, STALL, HTTP, STREAM_ERROR, EMPTY, ABORT = (
    "connect", "disconnect", "stall", "http", "stream_error", "empty", "abort")


@dataclass
class RequestResult:
    """What one request did. `error` is None only for a complete, non-empty, [DONE]-terminated stream."""

    ok: bool = False
    error: str | None = None
    kind: str | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    itl_s: list[float] = field(default_factory=list)  # one entry per token after the first chunk (gap / tokens)
    chunks: int = 0
    output_tokens: int = 0
    prompt_tokens: int | None = None
    verify_ct: int | None = None
    meta: dict = field(default_factory=dict)  # the final chunk's meta_info
    sent_wall: float | None = None  # time.time() when the request went out, and when the first token arrived:
    first_wall: float | None = None  # compared with the server's own timestamps they split latency by side


def _fail(r: RequestResult, kind: str, msg: str) -> RequestResult:
    r.ok, r.kind, r.error = False, kind, msg
    return r


def _error_message(event: bytes) -> str:
    try:
        err = json.loads(event[len(_DATA):]).get("error")
        return str(err.get("message", err) if isinstance(err, dict) else err)
    except ValueError:
        return event[len(_DATA):200].decode("utf-8", "replace")


def sent_trace():
    """A TraceConfig that stamps when the request went to the socket (the clock start for TTFT and e2e).

    The stamp is taken when the body has been written (headers alone, for a request without a body): starting the
    clock there, not before `session.post`, keeps the client's own request building and event-loop queueing out of
    the latency it attributes to the server.
    """
    import aiohttp

    async def on_headers(session, ctx, params):
        box = ctx.trace_request_ctx
        if box is not None and "t" not in box:
            box["t"], box["w"] = time.perf_counter(), time.time()

    async def on_body(session, ctx, params):
        box = ctx.trace_request_ctx
        if box is not None and "body" not in box:
            box["t"], box["w"], box["body"] = time.perf_counter(), time.time(), True

    tc = aiohttp.TraceConfig()
    tc.on_request_headers_sent.append(on_headers)
    tc.on_request_chunk_sent.append(on_body)
    return tc


class Watchdog:
    """Cancels requests that received no byte for `stall_s`: one timer for all streams instead of a read timeout
    rescheduled on every socket read (which costs about 1 us per chunk in aiohttp)."""

    def __init__(self, stall_s: float):
        self.stall_s = stall_s
        self.active: dict[asyncio.Task, list[float]] = {}  # task -> [last byte time]; a list so the hot path can set it
        self.cancelled: set[asyncio.Task] = set()

    def track(self) -> list[float]:
        cell = [time.monotonic()]
        self.active[asyncio.current_task()] = cell
        return cell

    def untrack(self) -> None:
        self.active.pop(asyncio.current_task(), None)

    def stalled(self, task) -> bool:
        return task in self.cancelled

    async def run(self) -> None:
        while True:
            await asyncio.sleep(min(1.0, self.stall_s / 4))
            now = time.monotonic()
            for task, cell in list(self.active.items()):
                if now - cell[0] > self.stall_s and not task.done() and task not in self.cancelled:
                    self.cancelled.add(task)
                    task.cancel()


async def stream_generate(session, url: str, body: bytes, stall_s: float,
                          watchdog: Watchdog | None = None) -> RequestResult:
    """POST a streaming /generate request and measure TTFT, inter-token gaps, e2e latency, tokens and verify steps.

    The clock starts when the request was sent (see sent_trace; before the call when the session has no trace).
    A stream without a byte for `stall_s` is a hang: the watchdog cancels it (without one, a socket read timeout does).
    """
    import aiohttp

    r = RequestResult()
    perf = time.perf_counter
    st = perf()
    sent: dict = {}
    last_n = 0
    last_t = st
    last_event = None
    done = False
    itl = r.itl_s
    try:
        if watchdog is None:
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=min(stall_s, 10.0), sock_read=stall_s)
        else:
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=min(stall_s, 10.0))
            alive = watchdog.track()
        async with session.post(url, data=body, headers=JSON_HEADERS, timeout=timeout, trace_request_ctx=sent) as resp:
            st = sent.get("t", st)
            r.sent_wall = sent.get("w")
            last_t = st
            if resp.status != 200:
                text = (await resp.text()).strip().replace("\n", " ")[:300]
                return _fail(r, HTTP, f"HTTP {resp.status}: {text or resp.reason}")
            readany = resp.content.readany
            buf = b""
            while True:
                data = await readany()
                if not data:
                    break
                now = perf()
                if watchdog is not None:
                    alive[0] = time.monotonic()
                if buf:
                    data = buf + data
                events = data.split(b"\n\n")
                buf = events.pop()
                for ev in events:
                    if ev[:6] != _DATA:
                        ev = ev.strip()
                        if not ev.startswith(_DATA):
                            continue
                    if ev[6:7] != b"{":
                        if ev.startswith(_DONE):
                            done = True
                        continue
                    i = ev.rfind(_KEY)
                    if i < 0:
                        if ev.startswith(_ERR):
                            r.error = _error_message(ev)
                        continue
                    j = i + _KEY_LEN
                    k = ev.find(b",", j)
                    try:
                        n = int(ev[j:k] if k > 0 else ev[j:ev.find(b"}", j)])
                    except ValueError:
                        m = _NUM.match(ev, j)
                        if m is None:
                            continue
                        n = int(m.group(1))
                    r.chunks += 1
                    last_event = ev
                    if n > last_n:
                        if last_n == 0:
                            r.ttft_s = now - st
                            r.first_wall = time.time()
                        else:
                            k = n - last_n
                            gap = (now - last_t) / k
                            if k == 1:
                                itl.append(gap)
                            else:
                                itl.extend([gap] * k)
                        last_n, last_t = n, now
    except asyncio.TimeoutError:
        return _fail(r, STALL, f"no bytes for {stall_s:g} s: the server stopped sending (hang)")
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if watchdog is None or not watchdog.stalled(task):
            raise
        if hasattr(task, "uncancel"):  # Python >= 3.11: this cancellation is handled here
            task.uncancel()
        return _fail(r, STALL, f"no bytes for {stall_s:g} s: the server stopped sending (hang)")
    except aiohttp.ClientConnectorError as exc:
        return _fail(r, CONNECT, f"cannot connect: {exc.os_error or exc}")
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError, aiohttp.ClientOSError) as exc:
        return _fail(r, DISCONNECT, f"connection lost mid-stream after {last_n} tokens: {type(exc).__name__}: {exc}")
    finally:
        if watchdog is not None:
            watchdog.untrack()
    r.e2e_s = perf() - st
    r.output_tokens = last_n
    if last_event is not None:
        try:
            r.meta = json.loads(last_event[len(_DATA):]).get("meta_info") or {}
        except ValueError:
            r.meta = {}
        r.prompt_tokens = r.meta.get("prompt_tokens")
        vc = r.meta.get("spec_verify_ct")
        r.verify_ct = int(vc) if isinstance(vc, (int, float)) and vc > 0 else None
    if r.error is not None:
        return _fail(r, STREAM_ERROR, f"error in stream: {r.error}")
    if not done:
        return _fail(r, DISCONNECT, f"stream ended without [DONE] after {last_n} tokens")
    if last_n <= 0:
        return _fail(r, EMPTY, "stream finished with zero output tokens")
    fr = r.meta.get("finish_reason")
    if isinstance(fr, dict) and fr.get("type") == "abort":
        return _fail(r, ABORT, f"request aborted by the server: {fr.get('message', fr)}")
    r.ok = True
    return r
