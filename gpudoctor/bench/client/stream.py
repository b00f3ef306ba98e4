"""One streamed request, measured: SGLang's native /generate or an OpenAI-compatible route. The client's hot path.

SGLang's native chunks carry the cumulative `text` and `output_ids`, so parsing every chunk's JSON costs O(n^2) in the
output length. The native parser reads `completion_tokens` from the raw bytes with one rfind (meta_info is serialized
after text, and an unescaped quote cannot occur inside a JSON string) and parses only the first chunk (its
`response_sent_to_client_ts`) and the final chunk (finish reason, spec_verify_ct) fully. OpenAI chunks carry deltas, so
the OpenAI parser (gpudoctor.bench.client.openai) decodes each one.

Per request the clock starts when the request is on the wire; the connection set-up (when a new one was opened), the
arrival of the response headers and the first token are recorded apart, so a transport artifact (Nagle + delayed ACK:
~40 ms between a server's header write and its first chunk) is not silently reported as server TTFT.
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
_SENT_KEY = b'"response_sent_to_client_ts":'
JSON_HEADERS = {"Content-Type": "application/json"}

# Failure kinds: how a request failed decides whether the level is `crashed` or `error`.
CONNECT, DISCONNECT, STALL, HTTP, STREAM_ERROR, EMPTY, ABORT = (
    "connect", "disconnect", "stall", "http", "stream_error", "empty", "abort")


@dataclass
class RequestResult:
    """What one request did. `error` is None only for a complete, non-empty stream: [DONE]-terminated, or (OpenAI
    servers that never send [DONE]) closed cleanly after a chunk with a finish_reason."""

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
    meta: dict = field(default_factory=dict)  # the final chunk's meta_info (native) or usage/sglext (OpenAI)
    sent_wall: float | None = None  # time.time() when the request went out, and when the first token arrived:
    first_wall: float | None = None  # compared with the server's own timestamps they split latency by side
    connect_s: float | None = None  # TCP connect of a new pooled connection (None: an idle one was reused)
    reused: bool | None = None
    headers_s: float | None = None  # request sent -> response headers parsed
    server_sent_wall: float | None = None  # the server's own stamp of its first write (SGLang: response_sent_to_client_ts)
    usage_per_chunk: bool = True  # OpenAI: token counts came from per-chunk usage (False: one token per chunk assumed)
    sent_perf: float | None = None  # time.perf_counter() when the request was on the wire
    finish_reason: str | None = None  # OpenAI: the final chunk's ("length"; "stop": ended before max_tokens)
    tokens_source: str | None = None  # OpenAI: where output_tokens came from: usage | tokenizer | estimate
    max_tokens: int | None = None  # the output length asked for, where requests differ (a trace); None: the level's


def _fail(r: RequestResult, kind: str, msg: str) -> RequestResult:
    r.ok, r.kind, r.error = False, kind, msg
    return r


def error_message(payload: bytes | str) -> tuple[str, int | None]:
    """The message (and code) of an error body or chunk: SGLang native, SGLang OpenAI (flat), vLLM, FastAPI."""
    try:
        obj = json.loads(payload)
    except ValueError:
        text = payload.decode("utf-8", "replace") if isinstance(payload, bytes) else payload
        return text.strip().replace("\n", " ")[:300], None
    if not isinstance(obj, dict):
        return str(obj)[:300], None
    err = obj.get("error", obj)
    if isinstance(err, dict):
        code = err.get("code")
        msg = err.get("message", err.get("detail", err))
        return str(msg), code if isinstance(code, int) else None
    return str(err), None


def sent_trace():
    """A TraceConfig that stamps when the request went to the socket (the clock start for TTFT and e2e) and how its
    connection was obtained (connect time of a new one, or reuse).

    The stamp is taken when the body has been written (headers alone, for a request without a body): starting the
    clock there, not before `session.post`, keeps the client's own request building, event-loop queueing and any TCP
    connect out of the latency it attributes to the server.
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

    async def on_conn_start(session, ctx, params):
        box = ctx.trace_request_ctx
        if box is not None:
            box["c0"] = time.perf_counter()

    async def on_conn_end(session, ctx, params):
        box = ctx.trace_request_ctx
        if box is not None and "c0" in box:
            box["connect"] = time.perf_counter() - box["c0"]

    async def on_reuse(session, ctx, params):
        box = ctx.trace_request_ctx
        if box is not None:
            box["reused"] = True

    tc = aiohttp.TraceConfig()
    tc.on_request_headers_sent.append(on_headers)
    tc.on_request_chunk_sent.append(on_body)
    tc.on_connection_create_start.append(on_conn_start)
    tc.on_connection_create_end.append(on_conn_end)
    tc.on_connection_reuseconn.append(on_reuse)
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


class NativeParser:
    """SGLang /generate events: cumulative completion_tokens read from the raw bytes (see the module docstring)."""

    def __init__(self, r: RequestResult):
        self.r = r
        self.last_n = 0
        self.last_t = 0.0
        self.last_event: bytes | None = None
        self.done = False

    def feed(self, ev: bytes, now: float, st: float) -> None:
        r = self.r
        if ev[6:7] != b"{":
            if ev.startswith(_DONE):
                self.done = True
            return
        i = ev.rfind(_KEY)
        if i < 0:
            if ev.startswith(_ERR):
                r.error, _ = error_message(ev[len(_DATA):])
            return
        j = i + _KEY_LEN
        k = ev.find(b",", j)
        try:
            n = int(ev[j:k] if k > 0 else ev[j:ev.find(b"}", j)])
        except ValueError:
            m = _NUM.match(ev, j)
            if m is None:
                return
            n = int(m.group(1))
        r.chunks += 1
        self.last_event = ev
        last_n = self.last_n
        if n > last_n:
            if last_n == 0:
                r.ttft_s = now - st
                r.first_wall = time.time()
                s = ev.rfind(_SENT_KEY)
                if s > 0:
                    m = re.match(rb"\s*([0-9.eE+-]+)", ev[s + len(_SENT_KEY):])
                    if m is not None:
                        r.server_sent_wall = float(m.group(1))
            else:
                gap = (now - self.last_t) / (n - last_n)
                if n - last_n == 1:
                    r.itl_s.append(gap)
                else:
                    r.itl_s.extend([gap] * (n - last_n))
            self.last_n, self.last_t = n, now

    def finish(self) -> str | None:
        """Read the final chunk; the abort message when the server aborted the request, else None."""
        r = self.r
        r.output_tokens = self.last_n
        if self.last_event is None:
            return None
        try:
            r.meta = json.loads(self.last_event[len(_DATA):]).get("meta_info") or {}
        except ValueError:
            r.meta = {}
        r.prompt_tokens = r.meta.get("prompt_tokens")
        vc = r.meta.get("spec_verify_ct")
        r.verify_ct = int(vc) if isinstance(vc, (int, float)) and vc > 0 else None
        fr = r.meta.get("finish_reason")
        if isinstance(fr, dict) and fr.get("type") == "abort":
            code = fr.get("status_code")
            return (f"request aborted by the server" + (f" (status {code})" if code else "")
                    + f": {fr.get('message') or 'no message'}")
        return None


async def stream_request(session, url: str, body: bytes, stall_s: float, watchdog: Watchdog | None = None,
                         parser_class=NativeParser) -> RequestResult:
    """POST a streaming request and measure TTFT, inter-token gaps, e2e latency, tokens and verify steps.

    The clock starts when the request was sent (see sent_trace; before the call when the session has no trace).
    A stream without a byte for `stall_s` is a hang: the watchdog cancels it (without one, a socket read timeout does).
    """
    import aiohttp

    r = RequestResult()
    parser = parser_class(r)
    perf = time.perf_counter
    st = perf()
    sent: dict = {}
    try:
        if watchdog is None:
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=min(stall_s, 10.0), sock_read=stall_s)
        else:
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=min(stall_s, 10.0))
            alive = watchdog.track()
        async with session.post(url, data=body, headers=JSON_HEADERS, timeout=timeout, trace_request_ctx=sent) as resp:
            st = sent.get("t", st)
            r.sent_perf = st
            r.headers_s = perf() - st
            r.sent_wall = sent.get("w")
            r.connect_s = sent.get("connect")
            r.reused = bool(sent.get("reused"))
            parser.last_t = st
            if resp.status != 200:
                msg, _ = error_message(await resp.read())
                return _fail(r, HTTP, f"HTTP {resp.status}: {msg or resp.reason}")
            readany = resp.content.readany
            feed = parser.feed
            buf = b""
            while True:
                data = await readany()
                if not data:
                    if buf.strip():  # a last event without its blank line: the server closed right after it
                        ev = buf.strip()
                        if ev.startswith(_DATA):
                            feed(ev, perf(), st)
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
                    feed(ev, now, st)
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
        return _fail(r, DISCONNECT, f"connection lost mid-stream after {parser.last_n} tokens: "
                                    f"{type(exc).__name__}: {exc}")
    finally:
        if watchdog is not None:
            watchdog.untrack()
    r.e2e_s = perf() - st
    aborted = parser.finish()
    if aborted is not None:  # before "empty": an abort before the first token is the common case (queue full)
        return _fail(r, ABORT, aborted)
    if r.error is not None:
        return _fail(r, STREAM_ERROR, f"error in stream: {r.error}")
    if not (parser.done or getattr(parser, "ended", False)):
        return _fail(r, DISCONNECT, f"stream ended without [DONE] after {parser.last_n} tokens (and without a "
                                    f"final chunk with a finish_reason)")
    if r.output_tokens <= 0:
        return _fail(r, EMPTY, "stream finished with zero output tokens")
    r.ok = True
    return r


async def stream_generate(session, url: str, body: bytes, stall_s: float,
                          watchdog: Watchdog | None = None) -> RequestResult:
    """A native SGLang /generate request (stream_request with the native parser)."""
    return await stream_request(session, url, body, stall_s, watchdog)
