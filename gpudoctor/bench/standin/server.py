"""A protocol-faithful stand-in for SGLang 0.5.23 (or, with --flavor vllm, vLLM's OpenAI server) with a known truth.

Run it as `gpudoctor bench standin --port 30000 --decode-tok-s 50 --accept-length 3 --ttft-ms 40` (or
`python3 -m gpudoctor.bench.standin ...` with the interpreter gpudoctor is installed in). SGLang
flavor: /generate (streamed and not), /v1/completions, /v1/chat/completions, /v1/models, /health, /health_generate,
/ready, /model_info, /server_info, /flush_cache with 0.5.23's fields and behaviour (gpudoctor/bench/client/apispec.py cites
where each comes from): cumulative output_ids, abort chunks (HTTP 200) when --max-queued-requests is exceeded, timing
fields only with --enable-metrics, health checks that take >= 1 s, idle keep-alive connections closed after 5 s.
vLLM flavor: /v1/* and an instant /health only, vLLM's chunk and error shapes and log lines. It logs like the real
server, can fail on purpose (--fail-mode) or because of the host it runs on (--require-model: the model's config.json
must be there; --require-device PATH: the node must open, as CUDA's init needs it), and accepts (and shows in /server_info) any other flag, so it can replace
`python3 -m sglang.launch_server` or `vllm serve` in a campaign dry run.

Timing truth, per request: the first step is written --ttft-ms after the request arrives; later steps are written so
that the tokens after the first step arrive at exactly --decode-tok-s tokens/s. With --accept-length A, step k carries
floor(k*A) - floor((k-1)*A) tokens and the final chunk reports spec_verify_ct = number of steps.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import socket
import sys
import time

from gpudoctor.bench.client import apispec
from gpudoctor.bench.standin import wire
READY_LINE = "The server is fired up and ready to roll!"
VLLM_READY_LINE = "Application startup complete."
FAIL_MODES = ("none", "die-mid-level", "hang", "http500", "error-chunk", "never-ready", "die-at-start")
_TRIGGERED = ("die-mid-level", "hang", "http500", "error-chunk")


PROG = "python3 -m gpudoctor.bench.standin"


def parse_args(argv=None, prog: str = PROG, on_error=None) -> tuple[argparse.Namespace, list[str]]:
    """The stand-in's options; `on_error(message)` replaces argparse's usage-and-exit-2 (the gpudoctor command's
    one line, exit 3)."""
    p = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0],
                                epilog="Any other flag is accepted and shown in /server_info, so it stands in for "
                                       "sglang.launch_server in a campaign's server.command. Exit codes: 0 stopped "
                                       "(SIGTERM or ^C), 3 bad input (gpudoctor bench standin; argparse's 2 when run "
                                       "as python3 -m gpudoctor.bench.standin).")
    if on_error is not None:
        p.error = on_error
    p.add_argument("model", nargs="?", default=None, help="vLLM flavor: `vllm serve MODEL`'s positional model")
    p.add_argument("--flavor", choices=("sglang", "vllm", "openai"), default="sglang",
                   help="openai: a strict OpenAI-schema server as transformers serve 5.17 is (requests validated "
                        "against the `openai` package's types, no [DONE], no per-chunk usage, unescaped error text, "
                        "pinned to its model)")
    p.add_argument("--hub-models", default="", help="openai flavor: the ids GET /v1/models lists (comma-separated; "
                                                     "default none: a server pinned to a directory lists nothing)")
    p.add_argument("--eos-after", type=int, default=0,
                   help="openai flavor: the model emits its end of text after this many tokens (finish_reason stop; "
                        "there is no ignore_eos); 0 = never")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on, as SGLang's --host (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="default 30000 (sglang), 8000 (vllm)")
    p.add_argument("--decode-tok-s", type=float, default=50.0, help="tokens/s per request after the first step; 0 = instant")
    p.add_argument("--accept-length", type=float, default=None, help="tokens per verify step; turns speculation on")
    p.add_argument("--speculative-num-draft-tokens", type=int, default=None,
                   help="SGLang's flag: draft tokens per verify step (reported in /server_info; default: none)")
    p.add_argument("--ttft-ms", type=float, default=0.0, help="time to the first token, ms (default 0)")
    p.add_argument("--max-running", "--max-running-requests", dest="max_running", type=int, default=0,
                   help="requests decoded at once; the rest queue (0 = no limit)")
    p.add_argument("--max-queued-requests", type=int, default=None,
                   help="SGLang's limit: a request that would queue beyond it is aborted (HTTP 200, abort chunk)")
    p.add_argument("--enable-metrics", action="store_true", help="SGLang: add the timing fields to meta_info")
    p.add_argument("--incremental-streaming-output", action="store_true", help="SGLang: per-chunk text/output_ids")
    p.add_argument("--no-tcp-nodelay", action="store_true",
                   help="not SGLang: a server without TCP_NODELAY that writes headers and the first chunk apart "
                        "(Nagle + delayed ACK add ~40 ms)")
    p.add_argument("--context-length", "--max-model-len", dest="context_length", type=int, default=131072,
                   help="the context length /server_info and /v1/models report; longer prompts are refused as SGLang "
                        "does (default 131072)")
    p.add_argument("--startup-s", type=float, default=0.0, help="seconds of 'model loading' before ready")
    p.add_argument("--health-timeout-s", type=float, default=None,
                   help="like SGLANG_HEALTH_CHECK_TIMEOUT (default: that variable, else 20)")
    p.add_argument("--fail-mode", choices=FAIL_MODES, default="none",
                   help="how the server fails (after --fail-after-requests/-s): die mid-level, hang, answer HTTP "
                        "500, send an error chunk, never become ready, die at start; default none")
    p.add_argument("--fail-after-requests", type=int, default=0, help="fail when this many requests arrived")
    p.add_argument("--fail-after-s", type=float, default=0.0, help="fail this many seconds after the first request")
    p.add_argument("--death-message", default="CUDA error: an illegal instruction was encountered",
                   help="the error line a dying server logs (default: CUDA's illegal instruction)")
    p.add_argument("--fail-if-exists", default=None, metavar="PATH",
                   help="the fault acts only while PATH exists (a host condition a remedy can clear, e.g. the GPU gone)")
    p.add_argument("--death-log", default=None, metavar="FILE",
                   help="on dying (die-at-start, die-mid-level) write FILE's lines to the log as they are, e.g. a real"
                        " server's traceback, instead of the built-in one")
    p.add_argument("--require-model", action="store_true",
                   help="die at start, as SGLang does loading the model's config, when --model-path has no config.json")
    p.add_argument("--require-device", action="append", default=[], metavar="PATH",
                   help="open PATH (O_RDWR) at start, as CUDA's init opens the GPU nodes, and die with torch's 'CUDA "
                        "unknown error' when the kernel refuses it (repeatable; e.g. /dev/nvidia-uvm)")
    p.add_argument("--log-file", default=None, metavar="FILE", help="append the log here instead of stderr")
    p.add_argument("--timing-log", default=None, metavar="FILE",
                   help="stand-in only: append one JSON line per finished request (rid, received, first_sent, "
                        "finished, tokens; wall-clock seconds): the server-side truth for any client")
    p.add_argument("--prefix-cache", action="store_true",
                   help="stand-in only: a prefix cache with SGLang's cached_tokens semantics (the longest cached prefix "
                        "of the prompt, at most prompt - 1 tokens; prompt and output cached after each request); "
                        "TTFT = --ttft-ms x uncached share")
    p.add_argument("--prefix-cache-tokens", type=int, default=4_000_000, help="its capacity (LRU), tokens")
    p.add_argument("--enable-cache-report", "--enable-prompt-tokens-details", dest="cache_report",
                   action="store_true", help="SGLang / vLLM: /v1 usage carries prompt_tokens_details.cached_tokens")
    p.add_argument("--xid-log", default=None, metavar="FILE",
                   help="stand-in only, 'the host changed': append an NVRM Xid kernel log line to FILE once "
                        "--xid-after-requests requests arrived (while --xid-if-exists exists, when given)")
    p.add_argument("--xid-after-requests", type=int, default=1, help="--xid-log: requests before the Xid line (1)")
    p.add_argument("--xid-if-exists", default=None, metavar="PATH", help="--xid-log: only while PATH exists")
    p.add_argument("--xid-code", type=int, default=79, help="--xid-log: the Xid number (default 79, fallen off the bus)")
    p.add_argument("--model-path", default=None, help="SGLang's flag: the model path reported (default standin/model)")
    p.add_argument("--served-model-name", default=None, help="the model name served (default: --model-path)")
    p.add_argument("--tp-size", "--tp", "--tensor-parallel-size", dest="tp_size", type=int, default=1,
                   help="SGLang's/vLLM's tensor parallelism, reported in /server_info (default 1)")
    p.add_argument("--speculative-algorithm", default=None,
                   help="SGLang's flag, reported in /server_info; --accept-length turns speculation on")
    args, extra = p.parse_known_args(argv)
    args.model_path = args.model_path or args.model or "standin/model"
    args.served_model_name = args.served_model_name or args.model_path
    if args.port is None:
        args.port = 8000 if args.flavor in ("vllm", "openai") else 30000
    if args.health_timeout_s is None:
        args.health_timeout_s = float(os.environ.get("SGLANG_HEALTH_CHECK_TIMEOUT", apispec.HEALTH_TIMEOUT_S))
    return args, extra


class Log:
    """Log lines in the server's own format, flushed at once so a crash loses nothing."""

    def __init__(self, path: str | None, flavor: str):
        self.fh = open(path, "a", buffering=1) if path else sys.stderr
        self.flavor = flavor

    def __call__(self, msg: str, level: str = "INFO", where: str = "api_server.py:1") -> None:
        if self.flavor == "vllm":
            line = f"{level} {time.strftime('%m-%d %H:%M:%S')} [{where}] {msg}"
        else:
            line = f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {msg}"
        self.fh.write(line + "\n")
        self.fh.flush()

    def raw(self, text: str) -> None:
        self.fh.write(text if text.endswith("\n") else text + "\n")
        self.fh.flush()


class PrefixCache:
    """The prompts (text, or token-id tuples) whose prefixes are cached, LRU by tokens. A text prompt's tokens are
    its 4-character chunks (gpudoctor.bench.client.tokens' estimate, which the stand-in counts prompts with), so a shared
    prefix of c characters is c // 4 cached tokens."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.entries: dict = {}  # key -> tokens, oldest first
        self.tokens = 0

    def match(self, key) -> int:
        best = 0
        for k in self.entries:
            if type(k) is type(key) and k[:1] == key[:1]:
                best = max(best, _common(k, key))
        return best if isinstance(key, tuple) else best // 4

    def insert(self, key, tokens: int) -> None:
        if key in self.entries:
            self.tokens -= self.entries.pop(key)
        self.entries[key] = tokens
        self.tokens += tokens
        while self.tokens > self.capacity and len(self.entries) > 1:
            self.tokens -= self.entries.pop(next(iter(self.entries)))

    def clear(self) -> None:
        self.entries.clear()
        self.tokens = 0


def _common(a, b) -> int:
    """Length of the common prefix of two strings or tuples (a binary search over slice comparisons)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _chat_key(messages) -> str | None:
    """A chat prompt as the cache sees it: the messages in a template of the stand-in's own."""
    if not isinstance(messages, list):
        return None
    return "".join(f"<|{m.get('role')}|>{m.get('content') or ''}" for m in messages if isinstance(m, dict))


def _output_key(st: wire.ReqState):
    """What the request's output adds to its cached sequence: the answer's text (chat: as the next assistant
    message in the template), or its token ids."""
    if isinstance(st.cache_key, tuple):
        return tuple(st.output_ids())
    return ("<|assistant|>" if st.cache_key.startswith("<|") else "") + st.text()


class StandIn:
    """The server's state: readiness, the scheduler's queue, counters, fault injection."""

    def __init__(self, args: argparse.Namespace, extra: list[str]):
        self.a, self.extra = args, extra
        self.flavor = args.flavor
        self.log = Log(args.log_file, args.flavor)
        self.ready = False
        self.hung = asyncio.Event()
        self.failing = False  # http500 / error-chunk switched on
        self.n_requests = 0
        self.running = 0
        self.waiting = 0
        self.sem = asyncio.Semaphore(args.max_running) if args.max_running > 0 else None
        acc = args.accept_length
        self.spec = wire.Spec(acc, args.speculative_num_draft_tokens or max(2, math.ceil(acc))) if acc else None
        self.accept_sum = 0.0
        self.accept_n = 0
        self.last_gen_throughput = 0.0
        self.last_output = time.time()  # the detokenizer's last_receive_tstamp
        self.timing = open(args.timing_log, "a", buffering=1) if args.timing_log else None
        self.cache = PrefixCache(args.prefix_cache_tokens) if args.prefix_cache else None
        self.xid_done = False
        # /metrics: the counters SGLang and vLLM expose (gpudoctor.bench.cell.counters names them), since start
        self.prompt_tokens_total = 0
        self.cached_tokens_total = 0
        self.generation_tokens_total = 0
        self.preemptions_total = 0

    # ---- faults -------------------------------------------------------------------------------------------------
    def trip(self) -> None:
        """Switch the configured fault on (once)."""
        mode = self.a.fail_mode
        if mode == "die-mid-level":
            self.die()
        elif mode == "hang":
            if not self.hung.is_set():
                self.log("Scheduler stopped producing tokens (stand-in fault: hang)")
                self.hung.set()
        elif mode in ("http500", "error-chunk"):
            self.failing = True

    def answers_500(self) -> bool:
        """http500 switched on, and still armed (--fail-if-exists: a condition that, once cleared, ends the fault)."""
        return self.failing and self.a.fail_mode == "http500" and self.fault_armed()

    def fault_armed(self) -> bool:
        return self.a.fail_if_exists is None or os.path.exists(self.a.fail_if_exists)

    def last_words(self) -> bool:
        """--death-log's lines, raw (a real traceback is printed without the logger's prefix); False without one."""
        if not self.a.death_log:
            return False
        with open(self.a.death_log, encoding="utf-8", errors="replace") as fh:
            self.log.raw(fh.read())
        return True

    def die(self) -> None:
        if self.last_words():
            os._exit(1)
        msg = self.a.death_message
        if self.flavor == "vllm":
            self.log("EngineCore encountered a fatal error.", "ERROR", "core.py:718")
            self.log.raw("Traceback (most recent call last):")
            self.log.raw('  File "vllm/v1/engine/core.py", line 709, in run_engine_core')
            self.log.raw(f"RuntimeError: {msg}")
            self.log("AsyncLLM output_handler failed.", "ERROR", "async_llm.py:480")
            self.log.raw("vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack "
                         "trace (above) for the root cause.")
        else:
            self.log("Scheduler hit an exception: Traceback (most recent call last):")
            self.log('  File "sglang/srt/managers/scheduler.py", line 2214, in run_scheduler_process')
            self.log("    scheduler.event_loop_overlap()")
            self.log(f"RuntimeError: {msg}")
            self.log("CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace "
                     "below might be incorrect.")
            self.log("Received sigquit from a child process. It usually means the child failed.")
        os._exit(1)

    def load_checks(self) -> bool:
        """--require-model, --require-device: what the real server needs at start, checked for real (the model's
        config.json read, the device node opened); False after logging what SGLang logs when it is not there."""
        a = self.a
        if a.require_model and not os.path.isfile(os.path.join(a.model_path, "config.json")):
            self.log.raw("Traceback (most recent call last):")
            self.log.raw('  File "/usr/local/lib/python3.12/dist-packages/transformers/configuration_utils.py", '
                         "line 721, in _get_config_dict")
            self.log.raw("    resolved_config_file = cached_file(")
            self.log.raw(f"OSError: Can't load the configuration of '{a.model_path}'. If you were trying to load it "
                         "from 'https://huggingface.co/models', make sure you don't have a local directory with the "
                         f"same name. Otherwise, make sure '{a.model_path}' is the correct path to a directory "
                         "containing a config.json file")
            return False
        for path in a.require_device:
            try:
                os.close(os.open(path, os.O_RDWR | os.O_CLOEXEC))
                continue
            except OSError as exc:
                self.log(f"stand-in: open({path}) failed: {exc.strerror} (what cuInit meets: 999 CUDA_ERROR_UNKNOWN)")
            msg = ("CUDA unknown error - this may be due to an incorrectly set up environment, e.g. changing env "
                   "variable CUDA_VISIBLE_DEVICES after program start. Setting the available devices to be zero.")
            self.log.raw(f"Failed to get device capability: {msg}")
            self.log.raw("Traceback (most recent call last):")
            self.log.raw('  File "/usr/local/lib/python3.12/dist-packages/torch/cuda/__init__.py", line 372, in '
                         "_lazy_init")
            self.log.raw("    torch._C._cuda_init()")
            self.log.raw(f"RuntimeError: {msg}")
            return False
        return True

    def lookup(self, st: wire.ReqState, prompt) -> None:
        """--prefix-cache: how much of this prompt is cached (SGLang matches at most prompt - 1 tokens, so one is
        always computed), and the TTFT that leaves: --ttft-ms x the uncached share."""
        if self.cache is None or prompt is None:
            return
        key = tuple(prompt) if isinstance(prompt, list) else str(prompt)
        st.cache_key = key
        st.cached = min(self.cache.match(key), max(0, st.prompt_tokens - 1))
        st.ttft_ms = self.a.ttft_ms * (st.prompt_tokens - st.cached) / max(1, st.prompt_tokens)

    def maybe_xid(self) -> None:
        """--xid-log: the host changes under the server (a kernel log line as the NVIDIA driver writes it)."""
        a = self.a
        if not a.xid_log or self.xid_done or self.n_requests < a.xid_after_requests:
            return
        if a.xid_if_exists is not None and not os.path.exists(a.xid_if_exists):
            return
        self.xid_done = True
        with open(a.xid_log, "a", encoding="utf-8") as fh:
            fh.write(f"[{time.monotonic():12.6f}] NVRM: Xid (PCI:0000:00:06): {a.xid_code}, pid={os.getpid()}, "
                     "name=python3, GPU has fallen off the bus.\n")
        self.log(f"stand-in: wrote Xid {a.xid_code} to {a.xid_log}")

    def on_request(self) -> None:
        self.n_requests += 1
        self.maybe_xid()
        if not self.fault_armed():
            return
        mode = self.a.fail_mode
        if self.n_requests == 1 and self.a.fail_after_s > 0 and mode in _TRIGGERED:
            asyncio.get_running_loop().call_later(self.a.fail_after_s, self.trip)
        n = self.a.fail_after_requests
        if mode in _TRIGGERED and n and self.n_requests >= n:
            if mode == "die-mid-level":
                # Die a moment later so streams already running are cut mid-way, as a real crash does.
                asyncio.get_running_loop().call_later(0.05, self.die)
            else:
                self.trip()

    # ---- the scheduler --------------------------------------------------------------------------------------------
    def new_state(self, request, prompt_tokens: int, max_new: int, rid: str | None) -> wire.ReqState:
        received = getattr(request.protocol, "rx_first", None) or time.time()
        return wire.ReqState(rid=rid or f"{os.getpid():x}{self.n_requests:08x}", prompt_tokens=prompt_tokens,
                             max_new=max_new, received=received)

    def queue_full(self) -> bool:
        """Scheduler._abort_on_queued_limit: would this request wait in a queue already at its limit?"""
        q = self.a.max_queued_requests
        return q is not None and self.sem is not None and self.sem.locked() and self.waiting + 1 > q

    async def steps(self, st: wire.ReqState):
        """Advance `st` on the known schedule, yielding after each step (the first after TTFT)."""
        a = self.a
        loop = asyncio.get_running_loop()
        if self.sem is not None:
            self.waiting += 1
            try:
                await self.sem.acquire()
            finally:
                self.waiting -= 1
        self.running += 1
        st.forward_entry = time.time()
        try:
            t0 = loop.time()
            acc, rate = a.accept_length, a.decode_tok_s
            first = None
            while st.done < st.max_new:
                k = st.steps + 1
                n = (math.floor(k * acc) - math.floor((k - 1) * acc)) if acc else 1
                n = max(1, min(n, st.max_new - st.done))
                first = n if first is None else first
                ttft = a.ttft_ms if st.ttft_ms is None else st.ttft_ms
                due = t0 + ttft / 1000.0 + ((st.done + n - first) / rate if rate > 0 else 0.0)
                delay = due - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                elif rate <= 0 and a.ttft_ms <= 0:
                    await asyncio.sleep(0)
                if self.hung.is_set():
                    await asyncio.Event().wait()  # stop sending, keep the connection open
                st.advance(n)
                if st.rid != "HEALTH_CHECK":
                    self.generation_tokens_total += n
                    if st.steps == 1:  # prefilled: the prompt was queried against the prefix cache
                        self.prompt_tokens_total += st.prompt_tokens
                        self.cached_tokens_total += getattr(st, "cached", 0) or 0
                if self.cache is not None and st.cache_key is not None:
                    if st.steps == 1:  # prefilled: the prompt is in the tree (cache_unfinished_req)
                        self.cache.insert(st.cache_key, st.prompt_tokens)
                    if st.finished is not None:  # cache_finished_req: prompt and output
                        self.cache.insert(st.cache_key + _output_key(st), st.prompt_tokens + st.done)
                self.last_output = time.time()
                if st.finished is not None and self.timing is not None and st.rid != "HEALTH_CHECK":
                    asyncio.get_running_loop().call_soon(self._log_timing, st)
                if st.finished is not None:
                    if self.spec is not None and st.rid != "HEALTH_CHECK":
                        self.accept_sum += st.done / st.steps
                        self.accept_n += 1
                    dt = loop.time() - t0
                    self.last_gen_throughput = st.done / dt if dt > 0 else 0.0
                yield st
        finally:
            self.running -= 1
            if self.sem is not None:
                self.sem.release()

    def _log_timing(self, st: wire.ReqState) -> None:
        """After the final chunk was handed to the socket (call_soon runs once the handler has written it)."""
        self.timing.write(wire.dumps({"rid": st.rid, "received": st.received, "first_sent": st.sent_first,
                                      "finished": st.finished, "tokens": st.done, "prompt_tokens": st.prompt_tokens,
                                      "cached_tokens": st.cached}).decode() + "\n")

    def check(self, prompt_tokens: int, max_new: int) -> str | None:
        """Why the tokenizer manager would refuse this request (a ValueError in SGLang), or None."""
        if self.failing and self.a.fail_mode == "error-chunk":
            return "stand-in fault: error-chunk"
        ctx = self.a.context_length
        if prompt_tokens >= ctx:
            return f"The input ({prompt_tokens} tokens) is longer than the model's context length ({ctx} tokens)."
        if prompt_tokens + max_new > ctx:
            return (f"Requested token count exceeds the model's maximum context length of {ctx} tokens. You "
                    f"requested a total of {prompt_tokens + max_new} tokens: {prompt_tokens} tokens from the input "
                    f"messages and {max_new} tokens for the completion.")
        return None

    # ---- HTTP plumbing ---------------------------------------------------------------------------------------------
    async def open_stream(self, request):
        from aiohttp import web

        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        if self.a.no_tcp_nodelay:
            await resp.write(b"")  # headers leave as their own segment; the first chunk must wait for their ACK
        return resp

    def _json(self, obj, status: int = 200):
        from aiohttp import web

        return web.Response(body=wire.dumps(obj), status=status, content_type="application/json")

    def http500(self):
        from aiohttp import web

        self.log("Exception in ASGI application: Traceback (most recent call last): ... RuntimeError: "
                 "stand-in fault http500")
        return web.Response(status=500, text="Internal Server Error")

    # ---- native endpoints -----------------------------------------------------------------------------------------
    async def health(self, request):
        """http_server.py health_generate: 503 while starting; else a one-token generation polled once a second."""
        from aiohttp import web

        if not self.ready:
            return web.Response(status=503)
        if self.flavor == "openai":
            return web.json_response({"status": "ok"})
        if self.flavor == "vllm" or request.path == "/ready":
            return web.Response(status=200)
        if request.path == "/health" and os.environ.get(
                "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", "true").lower() in ("0", "false", "no"):
            return web.Response(status=200)
        tic = time.time()
        probe = asyncio.ensure_future(self._health_generation())
        try:
            while time.time() < tic + self.a.health_timeout_s:
                await asyncio.sleep(apispec.HEALTH_POLL_S)
                if self.last_output > tic:
                    return web.Response(status=200)
        finally:
            probe.cancel()
        self.log(f"Health check failed. Server couldn't get a response from detokenizer for last "
                 f"{self.a.health_timeout_s:g} seconds.")
        return web.Response(status=503)

    async def _health_generation(self) -> None:
        st = wire.ReqState(rid="HEALTH_CHECK", prompt_tokens=1, max_new=1, received=time.time())
        async for _ in self.steps(st):
            pass

    async def model_info(self, request):
        return self._json({"model_path": self.a.model_path, "tokenizer_path": self.a.model_path,
                           "is_generation": True, "preferred_sampling_params": None, "weight_version": "default"})

    async def server_info(self, request):
        a = self.a
        avg = self.accept_sum / self.accept_n if self.accept_n else None
        state = {"last_gen_throughput": self.last_gen_throughput}
        if self.cache is not None:
            state["standin_prefix_cache_tokens"] = self.cache.tokens
        if a.accept_length:
            state["avg_spec_accept_length"] = avg
        return self._json({
            "model_path": a.model_path, "served_model_name": a.served_model_name, "tp_size": a.tp_size,
            "context_length": a.context_length, "enable_metrics": a.enable_metrics,
            "speculative_algorithm": a.speculative_algorithm or ("EAGLE" if a.accept_length else None),
            "speculative_num_draft_tokens": self.spec.num_draft_tokens if self.spec else None,
            "max_running_requests": a.max_running or None, "max_queued_requests": a.max_queued_requests,
            "max_req_input_len": a.context_length - 1, "max_total_num_tokens": 500000, "internal_states": [state],
            "version": f"{apispec.SGLANG_VERSION}+gpudoctor.standin",
            "standin": {"decode_tok_s": a.decode_tok_s, "accept_length": a.accept_length, "ttft_ms": a.ttft_ms,
                        "extra_args": self.extra},
        })

    async def metrics(self, request):
        """Prometheus text with SGLang's and vLLM's names for the same counters (their sources: SGLang
        srt/metrics/collector.py, vLLM v1/metrics/loggers.py), so a test reads either engine's from one server."""
        from aiohttp import web

        model = (self.a.served_model_name or self.a.model_path or self.a.model or "standin").replace('"', "")
        cap = self.a.max_running or 64
        sg = f'model_name="{model}",tp_rank="0",dp_rank="0"'
        vl = f'model_name="{model}",engine="0"'
        lines = []
        for name, kind, labels, value in (
                ("sglang:prompt_tokens_total", "counter", sg, self.prompt_tokens_total),
                ("sglang:cached_tokens_total", "counter", sg, self.cached_tokens_total),
                ("sglang:generation_tokens_total", "counter", sg, self.generation_tokens_total),
                ("sglang:num_retracted_requests_total", "counter", sg, self.preemptions_total),
                ("sglang:token_usage", "gauge", sg, self.running / cap),
                ("sglang:num_queue_reqs", "gauge", sg, self.waiting),
                ("sglang:num_running_reqs", "gauge", sg, self.running),
                ("vllm:prefix_cache_queries_total", "counter", vl, self.prompt_tokens_total),
                ("vllm:prefix_cache_hits_total", "counter", vl, self.cached_tokens_total),
                ("vllm:prompt_tokens_total", "counter", vl, self.prompt_tokens_total),
                ("vllm:generation_tokens_total", "counter", vl, self.generation_tokens_total),
                ("vllm:num_preemptions_total", "counter", vl, self.preemptions_total),
                ("vllm:kv_cache_usage_perc", "gauge", vl, self.running / cap),
                ("vllm:num_requests_waiting", "gauge", vl, self.waiting),
                ("vllm:num_requests_running", "gauge", vl, self.running)):
            base = name[:-6] if kind == "counter" else name
            lines += [f"# HELP {base} stand-in", f"# TYPE {base} {kind}", f"{name}{{{labels}}} {float(value)}"]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def flush_cache(self, request):
        from aiohttp import web

        if self.running:
            return web.Response(status=400, text="Cache not flushed: requests are running.\n")
        self.accept_sum, self.accept_n = 0.0, 0
        if self.cache is not None:
            self.cache.clear()
        return web.Response(text="Cache flushed.\n")

    def _prompt_tokens(self, body: dict, key: str = "text") -> int:
        from gpudoctor.bench.client.tokens import approx_tokens

        value = body.get("input_ids") if key == "text" else body.get(key)
        if isinstance(value, list) and all(isinstance(x, int) for x in value):
            return len(value)
        if key == "messages" and isinstance(value, list):
            return sum(approx_tokens(str(m.get("content") or "")) for m in value if isinstance(m, dict)) + 3
        return approx_tokens(str(body.get(key) or ""))

    async def generate(self, request):
        body = await request.json()
        self.on_request()
        if self.answers_500():
            return self.http500()
        sp = body.get("sampling_params") or {}
        max_new = int(sp.get("max_new_tokens", 128))
        prompt_tokens = self._prompt_tokens(body)
        error = self.check(prompt_tokens, max_new)
        st = self.new_state(request, prompt_tokens, max_new, body.get("rid"))
        self.lookup(st, body.get("input_ids") if body.get("input_ids") is not None else body.get("text"))
        a = self.a
        opts = {"metrics": a.enable_metrics, "spec": self.spec, "incremental": a.incremental_streaming_output}
        if not body.get("stream"):
            if error:
                self.log(f"[http_server] Error: {error}")
                return self._json({"error": {"message": error}}, status=400)
            if self.queue_full():
                return self._json({"detail": apispec.QUEUE_FULL_MESSAGE}, status=apispec.QUEUE_FULL_STATUS)
            async for _ in self.steps(st):
                pass
            return self._json(wire.native_chunk(st, stream=False, **opts))
        resp = await self.open_stream(request)
        if error:
            self.log(f"[http_server] Error: {error}")
            await resp.write(wire.sse(wire.native_stream_error(error)))
        elif self.queue_full():
            await resp.write(wire.sse(wire.native_abort(st, apispec.QUEUE_FULL_MESSAGE, apispec.QUEUE_FULL_STATUS)))
        else:
            async for _ in self.steps(st):
                await resp.write(wire.sse(wire.native_chunk(st, stream=True, **opts)))
        await resp.write(wire.DONE)
        await resp.write_eof()
        return resp

    # ---- OpenAI-compatible endpoints --------------------------------------------------------------------------------
    async def models(self, request):
        if self.flavor == "openai":
            return self._json(wire.strict_model_list([m for m in self.a.hub_models.split(",") if m]))
        return self._json(wire.model_list(self.a.served_model_name, self.a.context_length, self.flavor))

    async def completions(self, request):
        return await self._openai(request, chat=False)

    async def chat(self, request):
        return await self._openai(request, chat=True)

    def _bad_request(self, message: str, status: int = 400):
        err_type = "BadRequestError" if status == 400 else "NotFoundError"
        return self._json(wire.openai_error(message, err_type, status, self.flavor), status=status)

    async def _openai(self, request, chat: bool):
        if self.flavor == "openai":
            return await self._strict(request, chat)
        try:
            body = await request.json()
        except ValueError:
            return self._bad_request("Invalid JSON body")
        self.on_request()
        if self.answers_500():
            return self.http500()
        fl = self.flavor
        req = wire.read_openai(body, chat, fl)
        req.model = req.model or self.a.served_model_name
        if req.model and req.model != self.a.served_model_name:
            return self._bad_request(f"The model `{req.model}` does not exist.", 404)
        max_new = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
        prompt_tokens = self._prompt_tokens(body, "messages" if chat else "prompt")
        if not chat and not body.get("prompt"):
            return self._bad_request("Prompt cannot be empty")
        st = self.new_state(request, prompt_tokens, max_new, body.get("rid"))
        self.lookup(st, _chat_key(body.get("messages")) if chat else body.get("prompt"))
        error = self.check(prompt_tokens, max_new)
        if error and not (self.failing and fl == "sglang"):
            self.log(f"Error in request: {error}", "ERROR", "serving_engine.py:1")
            return self._bad_request(error)
        if not body.get("stream"):
            async for _ in self.steps(st):
                pass
            return self._json(self._openai_full(st, req))
        gen = self._openai_chunks(st, req, error)
        resp = None
        if fl == "vllm":  # vLLM's StreamingResponse starts at once; SGLang kick-starts the generator first
            resp = await self.open_stream(request)
        async for chunk in gen:
            if resp is None:
                resp = await self.open_stream(request)
            await resp.write(chunk)
        await resp.write_eof()
        return resp

    async def _openai_chunks(self, st: wire.ReqState, req: wire.OpenAIReq, error: str | None):
        fl = self.flavor
        if error:  # only the error-chunk fault gets here: an error after the stream started
            yield wire.sse(wire.openai_stream_error(error, "BadRequestError", 400, fl))
        elif fl == "sglang" and self.queue_full():
            yield wire.sse(wire.openai_stream_error(apispec.QUEUE_FULL_MESSAGE, "SERVICE_UNAVAILABLE",
                                                    apispec.QUEUE_FULL_STATUS, fl))
        else:
            async for _ in self.steps(st):
                if st.sent_first is None:  # _wait_one_response stamps the first output it hands on, /v1 too
                    st.sent_first = time.time()
                if req.chat and st.steps == 1:
                    yield wire.sse(wire.openai_role_chunk(st, req, fl))
                yield wire.sse(wire.openai_chunk(st, req, fl))
        for tail in wire.openai_tail(st, req, fl, self.spec):
            if self.a.cache_report and isinstance(tail.get("usage"), dict):
                tail["usage"]["prompt_tokens_details"] = {"cached_tokens": st.cached}
            yield wire.sse(tail)
        yield wire.DONE

    # ---- the strict OpenAI flavor (transformers serve 5.17) -----------------------------------------------------------
    def _detail(self, status: int, detail: str):
        self.log.raw(f'INFO:     127.0.0.1 - "POST /v1/... HTTP/1.1" {status}')
        return self._json({"detail": detail}, status=status)

    async def _strict(self, request, chat: bool):
        """BaseHandler._validate_request, _resolve_model (pinned), CompletionHandler's string-only prompt, then a
        stream without [DONE]: content chunks without usage, a final chunk with finish_reason and usage."""
        try:
            body = await request.json()
        except ValueError:
            return self._detail(422, "JSON decode error")
        if not isinstance(body, dict):
            return self._detail(422, "Input should be a valid dictionary")
        self.on_request()
        if self.answers_500():
            return self.http500()
        unexpected = wire.strict_unexpected(body, chat)
        if unexpected:
            return self._detail(422, unexpected)
        if not chat and not isinstance(body.get("prompt", ""), str):
            return self._detail(400, "prompt must be a string.")
        pinned = self.a.served_model_name
        if body.get("model") is not None and body["model"] != pinned:
            return self._detail(400, f"Server is pinned to '{pinned}'; requested '{body['model']}'.")
        req = wire.OpenAIReq(chat=chat, model=pinned, include_usage=False, continuous=False, spec_details=False)
        max_tokens = int(body.get("max_tokens") or 1024)  # max_completion_tokens is ignored (UNUSED fields)
        eos = self.a.eos_after
        produce = min(max_tokens, eos) if eos > 0 else max_tokens
        prompt_tokens = self._prompt_tokens(body, "messages" if chat else "prompt")
        st = self.new_state(request, prompt_tokens, produce, None)
        finish = "length" if produce >= max_tokens else "stop"
        if not body.get("stream"):
            async for _ in self.steps(st):
                pass
            choice = {"index": 0, "finish_reason": finish}
            choice.update({"message": {"role": "assistant", "content": st.text()}} if chat else {"text": st.text()})
            return self._json({"id": st.rid, "choices": [choice], "created": req.created, "model": pinned,
                               "object": "chat.completion" if chat else "text_completion",
                               "usage": wire.strict_usage(prompt_tokens, st.done)})
        resp = await self.open_stream(request)
        if chat:
            await resp.write(wire.sse(wire.strict_chunk(st, req, role=True)))
        if self.failing and self.a.fail_mode == "error-chunk":
            await resp.write(wire.strict_stream_error('stand-in fault: "error-chunk" (unescaped, as transformers '
                                                      'serve writes it)'))
            await resp.write_eof()
            return resp
        async for _ in self.steps(st):
            if st.sent_first is None:
                st.sent_first = time.time()
            await resp.write(wire.sse(wire.strict_chunk(st, req, st.text(delta=True))))
        await resp.write(wire.sse(wire.strict_chunk(st, req, "", finish, wire.strict_usage(prompt_tokens, st.done))))
        await resp.write_eof()
        return resp

    def _openai_full(self, st: wire.ReqState, req: wire.OpenAIReq) -> dict:
        choice = {"index": 0, "logprobs": None, "finish_reason": "length"}
        if req.chat:
            choice["message"] = {"role": "assistant", "content": st.text()}
        else:
            choice["text"] = st.text()
        out = {"id": st.rid, "object": "chat.completion" if req.chat else "text_completion", "created": req.created,
               "model": req.model or self.a.served_model_name, "choices": [choice],
               "usage": wire.usage(st.prompt_tokens, st.done, self.flavor, final=True)}
        if req.spec_details and self.spec is not None:
            out["sglext"] = {"spec_tokens_details": self.spec.meta(st)}
        return out

    # ---- lifecycle ----------------------------------------------------------------------------------------------
    async def become_ready(self) -> None:
        a = self.a
        if self.flavor == "vllm":
            self.log("vLLM API server version 0.0.0+gpudoctor.standin", where="api_server.py:1839")
            self.log(f"non-default args: {{'model': '{a.model_path}', 'tensor_parallel_size': {a.tp_size}}}",
                     where="utils.py:233")
            if a.fail_mode == "never-ready":
                return
            await asyncio.sleep(a.startup_s)
            self.log("Model loading took 39.27 GiB and 10.0 seconds", where="gpu_model_runner.py:1892")
            self.log("GPU KV cache size: 500,000 tokens", where="kv_cache_utils.py:1013")
            self.log(f"Maximum concurrency for {a.context_length} tokens per request: 3.81x",
                     where="kv_cache_utils.py:1017")
            self.log(f"Starting vLLM API server 0 on http://{a.host}:{a.port}", where="api_server.py:1880")
            self.ready = True
            self.log.raw("INFO:     Waiting for application startup.")
            self.log.raw(f"INFO:     {VLLM_READY_LINE}")
            return
        self.log("Load weight begin. avail mem=139.27 GB")
        if a.fail_mode == "never-ready":
            return
        await asyncio.sleep(a.startup_s)
        self.log("Load weight end. type=StandIn, dtype=torch.bfloat16, avail mem=100.00 GB, mem usage=39.27 GB.")
        self.log("KV Cache is allocated. #tokens: 500000, K size: 30.00 GB, V size: 30.00 GB")
        self.log(f"max_total_num_tokens=500000, chunked_prefill_size=8192, max_prefill_tokens=16384, "
                 f"max_running_requests={a.max_running or 4096}, context_len={a.context_length}, "
                 f"available_gpu_mem=10.00 GB")
        self.ready = True
        self.log(READY_LINE)


def _patch_protocol(nodelay: bool) -> None:
    """Make aiohttp note when a request's first bytes were read (request_received_ts is the arrival, not the moment
    the handler ran) and, with --no-tcp-nodelay, turn Nagle's algorithm back on. This process serves only the
    stand-in, so patching its handler class is contained."""
    from aiohttp import web_protocol, web_server

    class Stamping(web_protocol.RequestHandler):
        rx_first: float | None = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            if not nodelay:
                sock = transport.get_extra_info("socket")
                if sock is not None:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 0)

        def data_received(self, data: bytes) -> None:
            if data[:4] in (b"POST", b"PUT ", b"GET "):  # a request line: no pipelining, so a new request
                self.rx_first = time.time()
            super().data_received(data)

    web_server.RequestHandler = Stamping


def build_app(state: StandIn):
    from aiohttp import web

    app = web.Application()
    r = app.router
    r.add_get("/health", state.health)
    r.add_get("/v1/models", state.models)
    r.add_post("/v1/completions", state.completions)
    r.add_post("/v1/chat/completions", state.chat)
    if state.flavor != "openai":  # transformers serve has no /metrics
        r.add_get("/metrics", state.metrics)
    if state.flavor in ("vllm", "openai"):
        return app
    r.add_get("/health_generate", state.health)
    r.add_get("/ready", state.health)
    for path in ("/model_info", "/get_model_info"):
        r.add_get(path, state.model_info)
    for path in ("/server_info", "/get_server_info"):
        r.add_get(path, state.server_info)
    r.add_route("GET", "/flush_cache", state.flush_cache)
    r.add_route("POST", "/flush_cache", state.flush_cache)
    r.add_route("POST", "/generate", state.generate)
    r.add_route("PUT", "/generate", state.generate)
    return app


async def serve(args: argparse.Namespace, extra: list[str]) -> None:
    from aiohttp import web

    state = StandIn(args, extra)
    if args.flavor == "openai":
        try:
            wire.openai_schema_keys(False)
        except ImportError:
            state.log.raw("stand-in: --flavor openai validates requests against the `openai` package's types: "
                          "pip install openai")
            raise SystemExit(1)
    if args.flavor == "sglang":
        state.log(f"server_args=ServerArgs(model_path='{args.model_path}', tp_size={args.tp_size}, "
                  f"host='{args.host}', port={args.port}, speculative_algorithm={args.speculative_algorithm!r}, "
                  f"enable_metrics={args.enable_metrics}, extra={extra!r})")
    nccl = " ".join(f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith("NCCL_"))
    if nccl:
        state.log(f"NCCL environment: {nccl}")
    if not state.load_checks():
        raise SystemExit(1)
    if args.fail_mode == "die-at-start" and state.fault_armed() and state.last_words():
        raise SystemExit(1)
    if args.fail_mode == "die-at-start" and state.fault_armed():
        if args.flavor == "vllm":
            state.log.raw("Traceback (most recent call last):")
            state.log.raw('  File "vllm/engine/arg_utils.py", line 1100, in create_engine_config')
            state.log.raw("ValueError: Total number of attention heads (6) must be divisible by tensor parallel "
                          "size (4).")
        else:
            state.log("Traceback (most recent call last):")
            state.log('  File "sglang/srt/server_args.py", line 1021, in __post_init__')
            state.log("AssertionError")
        raise SystemExit(1)
    _patch_protocol(nodelay=not args.no_tcp_nodelay)
    keep_alive = float(os.environ.get("SGLANG_TIMEOUT_KEEP_ALIVE", apispec.KEEP_ALIVE_S))
    runner = web.AppRunner(build_app(state), access_log=None, handle_signals=False, keepalive_timeout=keep_alive)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port, reuse_address=True)
    await site.start()
    if args.flavor == "vllm":
        state.log.raw(f"INFO:     Started server process [{os.getpid()}]")
    else:
        state.log(f"Uvicorn running on http://{args.host}:{args.port} (Press CTRL+C to quit)")
    if args.flavor == "openai":
        state.log.raw("INFO:     Application startup complete.")
        await asyncio.sleep(args.startup_s)
        state.ready = args.fail_mode != "never-ready"
    else:
        await state.become_ready()
    await asyncio.Event().wait()


def main(argv=None, prog: str = PROG, on_error=None) -> None:
    """Serve until SIGTERM or ^C (`gpudoctor bench standin` and `python3 -m gpudoctor.bench.standin`)."""
    import signal

    args, extra = parse_args(argv, prog, on_error)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    try:
        asyncio.run(serve(args, extra))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
