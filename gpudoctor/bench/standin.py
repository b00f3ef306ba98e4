"""A protocol-faithful SGLang stand-in: the native HTTP API with a known decode rate, accept length and TTFT.

Run it as `python -m gpudoctor.bench.standin --port 30000 --decode-tok-s 50 --accept-length 3 --ttft-ms 40`. It speaks
/generate (streaming and not), /health, /health_generate, /ready, /model_info, /server_info, /flush_cache with SGLang's
shapes (docs/bench.md lists the source it follows), logs SGLang-like lines, and can fail on purpose (--fail-mode) so the
benchmark's crash handling is tested against a real process. Unknown SGLang flags are accepted and shown in /server_info,
so the stand-in can replace `python -m sglang.launch_server` in a campaign dry run.

Timing truth, per request: the first step is written TTFT after the request arrives; later steps are written so that the
tokens after the first step arrive at exactly --decode-tok-s tokens/s. With --accept-length A, step k carries
floor(k*A) - floor((k-1)*A) tokens and the final chunk reports spec_verify_ct = number of steps.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import time

READY_LINE = "The server is fired up and ready to roll!"
FAIL_MODES = ("none", "die-mid-level", "hang", "http500", "error-chunk", "never-ready", "die-at-start")
WORDS = ("the", "model", "decodes", "tokens", "while", "drafts", "are", "verified", "in", "one", "step", "and")


def parse_args(argv=None) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(prog="python -m gpudoctor.bench.standin", description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--decode-tok-s", type=float, default=50.0, help="tokens/s per request after the first step; 0 = instant")
    p.add_argument("--accept-length", type=float, default=None, help="tokens per verify step; turns speculation on")
    p.add_argument("--ttft-ms", type=float, default=0.0)
    p.add_argument("--max-running", type=int, default=0, help="requests decoded at once; the rest queue (0 = no limit)")
    p.add_argument("--context-length", type=int, default=131072)
    p.add_argument("--startup-s", type=float, default=0.0, help="seconds of 'model loading' before ready")
    p.add_argument("--health-timeout-s", type=float, default=20.0, help="like SGLANG_HEALTH_CHECK_TIMEOUT")
    p.add_argument("--fail-mode", choices=FAIL_MODES, default="none")
    p.add_argument("--fail-after-requests", type=int, default=0, help="fail when this many /generate requests arrived")
    p.add_argument("--fail-after-s", type=float, default=0.0, help="fail this many seconds after the first request")
    p.add_argument("--death-message", default="CUDA error: an illegal instruction was encountered")
    p.add_argument("--fail-if-exists", default=None, metavar="PATH",
                   help="the fault acts only while PATH exists (a host condition a remedy can clear, e.g. the GPU gone)")
    p.add_argument("--death-log", default=None, metavar="FILE",
                   help="on dying (die-at-start, die-mid-level) write FILE's lines to the log as they are, e.g. a real"
                        " server's traceback, instead of the built-in one")
    p.add_argument("--log-file", default=None, help="append the log here instead of stderr")
    p.add_argument("--model-path", default="standin/model")
    p.add_argument("--tp-size", "--tp", type=int, default=1)
    p.add_argument("--speculative-algorithm", default=None)
    return p.parse_known_args(argv)


class Log:
    """SGLang-like log lines: `[YYYY-mm-dd HH:MM:SS] message`, flushed at once so a crash loses nothing."""

    def __init__(self, path: str | None):
        self.fh = open(path, "a", buffering=1) if path else sys.stderr

    def __call__(self, msg: str) -> None:
        self.raw(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {msg}\n")

    def raw(self, text: str) -> None:
        self.fh.write(text if text.endswith("\n") else text + "\n")
        self.fh.flush()


class StandIn:
    """The server's state: readiness, request counters, fault injection."""

    def __init__(self, args: argparse.Namespace, extra: list[str]):
        self.a, self.extra = args, extra
        self.log = Log(args.log_file)
        self.ready = False
        self.hung = asyncio.Event()
        self.failing = False  # http500 / error-chunk switched on
        self.n_requests = 0
        self.running = 0
        self.sem = asyncio.Semaphore(args.max_running) if args.max_running > 0 else None
        self.accept_sum = 0.0
        self.accept_n = 0
        self.last_gen_throughput = 0.0

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
        self.log("Scheduler hit an exception: Traceback (most recent call last):")
        self.log('  File "sglang/srt/managers/scheduler.py", line 2214, in run_scheduler_process')
        self.log("    scheduler.event_loop_overlap()")
        self.log(f"RuntimeError: {self.a.death_message}")
        self.log("CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below"
                 " might be incorrect.")
        self.log("Received sigquit from a child process. It usually means the child failed.")
        os._exit(1)

    def on_request(self) -> None:
        self.n_requests += 1
        if not self.fault_armed():
            return
        if self.n_requests == 1 and self.a.fail_after_s > 0 and self.a.fail_mode in (
                "die-mid-level", "hang", "http500", "error-chunk"):
            asyncio.get_running_loop().call_later(self.a.fail_after_s, self.trip)
        n = self.a.fail_after_requests
        if self.a.fail_mode in ("die-mid-level", "hang", "http500", "error-chunk") and n and self.n_requests >= n:
            if self.a.fail_mode == "die-mid-level":
                # Die a moment later so streams already running are cut mid-way, as a real crash does.
                asyncio.get_running_loop().call_later(0.05, self.die)
            else:
                self.trip()

    # ---- handlers -----------------------------------------------------------------------------------------------
    async def health(self, request):
        from aiohttp import web

        if not self.ready:
            return web.Response(status=503)
        if self.hung.is_set():
            await asyncio.sleep(self.a.health_timeout_s)
            self.log(f"Health check failed. Server couldn't get a response from detokenizer for last "
                     f"{self.a.health_timeout_s:g} seconds.")
            return web.Response(status=503)
        return web.Response(status=200)

    async def model_info(self, request):
        from aiohttp import web

        return web.json_response({"model_path": self.a.model_path, "tokenizer_path": self.a.model_path,
                                  "is_generation": True, "preferred_sampling_params": None, "weight_version": "default"})

    async def server_info(self, request):
        from aiohttp import web

        a = self.a
        avg = self.accept_sum / self.accept_n if self.accept_n else None
        state = {"last_gen_throughput": self.last_gen_throughput}
        if a.accept_length:
            state["avg_spec_accept_length"] = avg
        return web.json_response({
            "model_path": a.model_path, "tp_size": a.tp_size, "context_length": a.context_length,
            "speculative_algorithm": a.speculative_algorithm or ("EAGLE" if a.accept_length else None),
            "max_running_requests": a.max_running or None, "max_req_input_len": a.context_length - 1,
            "max_total_num_tokens": 500000, "internal_states": [state], "version": "0.0.0+gpudoctor.standin",
            "standin": {"decode_tok_s": a.decode_tok_s, "accept_length": a.accept_length, "ttft_ms": a.ttft_ms,
                        "extra_args": self.extra},
        })

    async def flush_cache(self, request):
        from aiohttp import web

        if self.running:
            return web.Response(status=400, text="Cache not flushed: requests are running.\n")
        self.accept_sum, self.accept_n = 0.0, 0
        return web.Response(text="Cache flushed.\n")

    def _prompt_tokens(self, body: dict) -> int:
        from gpudoctor.bench.tokens import approx_tokens

        if isinstance(body.get("input_ids"), list):
            return len(body["input_ids"])
        return approx_tokens(str(body.get("text") or ""))

    async def generate(self, request):
        from aiohttp import web

        received = getattr(request.protocol, "rx_first", None) or time.time()
        body = await request.json()
        self.on_request()
        if self.failing and self.a.fail_mode == "http500":
            self.log("Exception in ASGI application: Traceback (most recent call last): ... RuntimeError: "
                     "stand-in fault http500")
            return web.Response(status=500, text="Internal Server Error")
        sp = body.get("sampling_params") or {}
        max_new = int(sp.get("max_new_tokens", 128))
        prompt_tokens = self._prompt_tokens(body)
        error = None
        if self.failing:
            error = "stand-in fault: error-chunk"
        elif prompt_tokens >= self.a.context_length:
            error = (f"The input ({prompt_tokens} tokens) is longer than the model's context length "
                     f"({self.a.context_length} tokens).")
        elif prompt_tokens + max_new > self.a.context_length:
            error = (f"Requested token count exceeds the model's maximum context length of {self.a.context_length} "
                     f"tokens. You requested a total of {prompt_tokens + max_new} tokens: {prompt_tokens} tokens from "
                     f"the input messages and {max_new} tokens for the completion.")
        rid = body.get("rid") or f"{os.getpid():x}{self.n_requests:08x}"
        if not body.get("stream"):
            if error:
                return web.json_response({"error": {"message": error}}, status=400)
            last = None
            async for out in self._outputs(rid, prompt_tokens, max_new, received):
                last = out
            return web.json_response(last)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        if error:
            self.log(f"[http_server] Error: {error}")
            await resp.write(b"data: " + json.dumps({"error": {"message": error}}).encode() + b"\n\n")
        else:
            stamps: dict = {}
            try:
                async for out in self._outputs(rid, prompt_tokens, max_new, received, stamps):
                    await resp.write(b"data: " + json.dumps(out, separators=(",", ":")).encode() + b"\n\n")
                    if "first_written" not in stamps:
                        stamps["first_written"] = time.time()
            except (ConnectionResetError, asyncio.CancelledError):
                raise
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def _outputs(self, rid: str, prompt_tokens: int, max_new: int, received: float, stamps: dict | None = None):
        """Yield SGLang-shaped outputs on the known schedule (cumulative text and completion_tokens)."""
        a = self.a
        loop = asyncio.get_running_loop()
        if self.sem is not None:
            await self.sem.acquire()
        self.running += 1
        try:
            t0 = loop.time()
            acc = a.accept_length
            rate = a.decode_tok_s
            pieces: list[str] = []
            done = steps = 0
            first_tokens = None
            first_ts = None
            while done < max_new:
                steps += 1
                n = (math.floor(steps * acc) - math.floor((steps - 1) * acc)) if acc else 1
                n = max(1, min(n, max_new - done))
                if first_tokens is None:
                    first_tokens = n
                due = t0 + a.ttft_ms / 1000.0 + ((done + n - first_tokens) / rate if rate > 0 else 0.0)
                delay = due - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                elif rate <= 0 and a.ttft_ms <= 0:
                    await asyncio.sleep(0)
                if self.hung.is_set():
                    await asyncio.Event().wait()  # stop sending, keep the connection open
                for i in range(done, done + n):
                    pieces.append(" " + WORDS[i % len(WORDS)])
                done += n
                if first_ts is None:
                    first_ts = time.time()
                meta = {"id": rid, "finish_reason": None, "prompt_tokens": prompt_tokens, "weight_version": "default",
                        "total_retractions": 0, "completion_tokens": done, "cached_tokens": 0}
                if done >= max_new:
                    meta["finish_reason"] = {"type": "length", "length": max_new}
                    meta["e2e_latency"] = time.time() - received
                    meta["request_received_ts"] = received
                    # When the first chunk reached the socket (streaming), else when it was produced.
                    meta["prefill_finished_ts"] = (stamps or {}).get("first_written", first_ts)
                    meta["decode_finished_ts"] = time.time()
                    if acc:
                        drafts = steps * max(1, math.ceil(acc) - 1)
                        meta.update({"spec_verify_ct": steps, "spec_accept_length": done / steps,
                                     "spec_accept_rate": min(1.0, (done - steps) / drafts) if drafts else 0.0,
                                     "spec_accept_token_num": done - steps, "spec_draft_token_num": drafts})
                        self.accept_sum += done / steps
                        self.accept_n += 1
                    dt = loop.time() - t0
                    self.last_gen_throughput = done / dt if dt > 0 else 0.0
                yield {"text": "".join(pieces), "output_ids": list(range(done - n, done)), "meta_info": meta}
        finally:
            self.running -= 1
            if self.sem is not None:
                self.sem.release()

    # ---- lifecycle ----------------------------------------------------------------------------------------------
    async def become_ready(self) -> None:
        a = self.a
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


def _stamp_request_arrival() -> None:
    """Make aiohttp note when a request's first bytes were read, so request_received_ts is the arrival, not the
    moment the handler ran (this process serves only the stand-in, so patching its handler class is contained)."""
    from aiohttp import web_protocol, web_server

    class Stamping(web_protocol.RequestHandler):
        rx_first: float | None = None

        def data_received(self, data: bytes) -> None:
            if data[:4] in (b"POST", b"PUT ", b"GET "):  # a request line: no pipelining, so a new request
                self.rx_first = time.time()
            super().data_received(data)

    web_server.RequestHandler = Stamping


def build_app(state: StandIn):
    from aiohttp import web

    app = web.Application()
    app.router.add_get("/health", state.health)
    app.router.add_get("/health_generate", state.health)
    app.router.add_get("/ready", state.health)
    for path in ("/model_info", "/get_model_info"):
        app.router.add_get(path, state.model_info)
    for path in ("/server_info", "/get_server_info"):
        app.router.add_get(path, state.server_info)
    app.router.add_route("GET", "/flush_cache", state.flush_cache)
    app.router.add_route("POST", "/flush_cache", state.flush_cache)
    app.router.add_route("POST", "/generate", state.generate)
    app.router.add_route("PUT", "/generate", state.generate)
    return app


async def serve(args: argparse.Namespace, extra: list[str]) -> None:
    from aiohttp import web

    state = StandIn(args, extra)
    state.log(f"server_args=ServerArgs(model_path='{args.model_path}', tp_size={args.tp_size}, host='{args.host}', "
              f"port={args.port}, speculative_algorithm={args.speculative_algorithm!r}, extra={extra!r})")
    nccl = " ".join(f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith("NCCL_"))
    if nccl:
        state.log(f"NCCL environment: {nccl}")
    if args.fail_mode == "die-at-start" and state.fault_armed() and state.last_words():
        raise SystemExit(1)
    if args.fail_mode == "die-at-start" and state.fault_armed():
        state.log("Traceback (most recent call last):")
        state.log('  File "sglang/srt/server_args.py", line 1021, in __post_init__')
        state.log("AssertionError")
        raise SystemExit(1)
    _stamp_request_arrival()
    runner = web.AppRunner(build_app(state), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port, reuse_address=True)
    await site.start()
    state.log(f"Uvicorn running on http://{args.host}:{args.port} (Press CTRL+C to quit)")
    await state.become_ready()
    await asyncio.Event().wait()


def main(argv=None) -> None:
    import signal

    args, extra = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    try:
        asyncio.run(serve(args, extra))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
