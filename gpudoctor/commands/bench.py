"""`gpudoctor bench`: the load generator, campaigns and reports. Thin: parse, call gpudoctor.bench, render."""

from __future__ import annotations

import sys

import click

from gpudoctor.conventions import alias
from gpudoctor.errors import EXIT_FAIL, EXIT_OK, EXIT_WARN, CannotJudge, InputError
from gpudoctor.files.inputs import http_url, output_dir
from gpudoctor.options import Count, NumberList, finite, seconds


class Display:
    """Progress on a TTY (rich), one plain line per level otherwise. Only the CLI prints."""

    def __init__(self, json_out: bool = False):
        self.json_out = json_out
        self.tty = sys.stderr.isatty() and not json_out
        self.progress = None
        self.task = None

    def __enter__(self):
        if self.tty:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            from gpudoctor.report import console

            self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                     TimeElapsedColumn(), transient=True, console=console(stderr=True))
            self.progress.start()
        return self

    def __exit__(self, *exc):
        if self.progress is not None:
            self.progress.stop()

    def _line(self, text: str) -> None:
        if self.progress is not None:
            from gpudoctor.report import esc

            self.progress.console.print(esc(text), highlight=False)
        else:
            click.echo(text, err=True)

    def __call__(self, kind: str, **data) -> None:
        if kind == "level_start" and self.progress is not None:
            s = data["spec"]
            if self.task is not None:
                self.progress.remove_task(self.task)
            from gpudoctor.report import esc

            self.task = self.progress.add_task(esc(f"{s.label} {s.workload} c={s.concurrency}"), total=s.num_prompts)
        elif kind == "request" and self.progress is not None and self.task is not None:
            self.progress.advance(self.task)
        elif kind == "level_done":
            self._line(_level_line(data["record"]))
        elif kind == "config":
            self._line(f"== {data['label']}: {data['what']}")
        elif kind == "note":
            self._line(f"   {data['text']}")
        elif kind == "inventory":  # said at the end, and not at all when the run ends in an error line
            from gpudoctor.commands import NOTES

            NOTES.append(f"inventory: {data['path']}")


def _level_line(r: dict) -> str:
    load = f"rate={r['request_rate']:g}/s" if r.get("request_rate") else f"c={r['concurrency']}"
    head = f"{r['label']} {r['workload']} {load}"
    if r["status"] == "ok":
        acc = f" accept {r['accept_length']:.2f}" if r.get("accept_length") else ""
        good = f", goodput {r['goodput_req_per_s']:.2f} req/s" if r.get("goodput_req_per_s") is not None else ""
        target = (f", {r['output_tokens']}/{r['output_tokens_target']} output tokens ({r['output_tokens_source']})"
                  if r.get("output_tokens_target") else "")
        line = (f"{head}: ok {r['output_tok_per_s']:.1f} tok/s, TTFT p50 {r['ttft_ms_p50']:.1f} ms, "
                f"ITL p50 {r['itl_ms_p50'] or 0:.2f} ms{acc}{good}{target}")
        for extra in (r.get("error"), r.get("length_note"), r.get("transport_note")):
            if extra:
                line += f"\n   note: {extra}"
        for s in r.get("suspect") or []:
            line += f"\n   SUSPECT: {s['reason']}"
        return line
    return f"{head}: {r['status'].upper()} {r['error']}"


@click.group()
def bench():
    """The benchmark stage: load generator, campaigns and reports.

    \b
    gpudoctor bench load --server-url http://127.0.0.1:30000 --concurrency 1,4,16 --max-tokens 256 --out runs/a
    gpudoctor bench run campaign.yaml --out runs/c1 [--resume]
    gpudoctor bench report runs/c1
    gpudoctor bench standin --port 30000 --decode-tok-s 60 --accept-length 3   (an SGLang stand-in for dry runs)

    Records go to OUT/results.jsonl, one per (label, workload, concurrency, trial), status ok | crashed | error |
    skipped. A failed level is never recorded as zeros. See docs/bench.md.
    """


@bench.command("load")
@click.option("--server-url", required=True, help="Base URL of a running server: SGLang (http://127.0.0.1:30000), or any OpenAI-compatible one with "
                   "--api completions|chat (vLLM: http://127.0.0.1:8000).")
@click.option("--api", type=click.Choice(["native", "completions", "chat"]), default="native", show_default=True,
              help="SGLang's /generate, or the OpenAI-compatible /v1/completions or /v1/chat/completions "
                   "(SGLang, vLLM, ...).")
@alias("--model-name", "--model", "model", hidden_aliases=["--model"], default=None, metavar="NAME",
       help="OpenAI APIs: the model name requests carry [default: the one /v1/models lists; none when it "
                   "lists none or several, so a pinned server uses its own].")
@click.option("--server-kind", type=click.Choice(["sglang", "vllm", "openai"]), default=None,
              help="OpenAI APIs: the dialect. sglang|vllm add ignore_eos, per-chunk usage and token-id prompts; "
                   "openai sends OpenAI's request schema only [default: detected from the server's answers].")
@click.option("--concurrency", "concurrency", type=NumberList(int, 1, 65536), default=None,
              help="Comma-separated closed-loop levels [default: 1,4,16; with --request-rate: a cap on requests in "
                   "flight, one value].")
@click.option("--request-rate", type=NumberList(float, 0, 1e6, min_open=True), default=None,
              help="Comma-separated open-loop levels in requests/s (e.g. 2,8,32): requests start on schedule "
                   "whatever is in flight.")
@click.option("--arrival", type=click.Choice(["poisson", "constant"]), default="poisson", show_default=True,
              help="Open loop: Poisson (exponential gaps) or constant arrivals.")
@click.option("--max-error-rate", type=finite(0, 1), default=0.0, show_default=True,
              help="Stop a level once more than this fraction of its requests failed (0: at the first failure).")
@click.option("--slo-ttft-ms", type=finite(0, lo_open=True), default=None,
              help="Goodput SLO: time to first token, ms.")
@click.option("--slo-itl-ms", type=finite(0, lo_open=True), default=None,
              help="Goodput SLO: mean inter-token latency (TPOT) per request, ms.")
@click.option("--max-tokens", type=Count(1, 2**24), default=None,
              help="New tokens per request (ignore_eos); required unless --trace.")
@click.option("--prompts", "num_prompts", type=Count(1, 10**6), default=None,
              help="Requests per level [default: max(8, 4 x concurrency); open loop: max(16, 10 x rate)].")
@click.option("--context-len", type=Count(1, 2**24), default=None, help="Prompt length in tokens (long context).")
@click.option("--prompt-set", default="builtin", show_default=True, help="builtin, or a .jsonl/.txt file of prompts.")
@click.option("--tokenizer-dir", default=None, help="Model dir with tokenizer.json for exact token counts.")
@click.option("--context-limit", type=Count(1, 2**24), default=None,
              help="Server context length [default: from /server_info, else /v1/models, else the local model's "
                   "config.json].")
@click.option("--label", default="load", show_default=True, help="Label of these records (e.g. eagle3-tp4).")
@click.option("--server-log", default=None, help="The server's log file: failures quote its telling lines.")
@click.option("--stall-timeout", type=seconds(0.1, 86400), default=120.0, show_default=True,
              help="Seconds without a byte before a request counts as hung.")
@click.option("--ready-timeout", type=seconds(0.1, 86400), default=30.0, show_default=True,
              help="Seconds to wait for the server to generate before the first level (/health_generate; with "
                   "--api completions|chat a one-token completion).")
@click.option("--wait-through-5xx", is_flag=True,
              help="Keep waiting out --ready-timeout while the server answers the readiness probe with HTTP 5xx (a "
                   "server, or a proxy before it, that answers 5xx while it loads). Without it, the same 5xx with a "
                   "body 3 times over 2 s ends the wait with the server's words.")
@click.option("--warmup", type=Count(0, 10**4), default=2, show_default=True, help="Unrecorded warm-up requests.")
@click.option("--turns", type=Count(1, 1000), default=None,
              help="Agentic multi-turn: sessions of this many turns, each re-sending the conversation with the "
                   "server's answers; --concurrency counts concurrent sessions, --prompts sessions per level.")
@click.option("--think-ms", type=finite(0, 3_600_000), default=0.0, show_default=True,
              help="Multi-turn: think time between a session's turns.")
@click.option("--conversations", default=None,
              help="Multi-turn: a JSONL of conversations ({\"system\", \"turns\": [...]} or ShareGPT) [default: built-in].")
@click.option("--trace", "trace_file", default=None,
              help="Replay a Mooncake-format JSONL trace (timestamp ms, input_length, output_length, hash_ids) open "
                   "loop; --max-tokens is then taken from the trace.")
@click.option("--time-scale", type=finite(1e-4, 1e4), default=1.0, show_default=True,
              help="Trace replay: multiply the trace's gaps (0.1: ten times faster).")
@click.option("--block-tokens", type=Count(1, 2**20), default=512, show_default=True,
              help="Trace replay: prompt tokens per hash id (Mooncake: 512).")
@click.option("--cache", "cache_policy", type=click.Choice(["flush", "keep"]), default="flush", show_default=True,
              help="Before each level: record the prefix cache's state and flush it (SGLang /flush_cache, vLLM "
                   "/reset_prefix_cache), or keep it.")
@click.option("--health-interval", type=finite(0.05, 0.5), default=0.5, show_default=True,
              help="Seconds between host-health samples of this host's GPUs (NVML) during each level.")
@click.option("--kernel-log", default="/dev/kmsg", show_default=True,
              help="Where Xid lines are read from during each level ('' for none).")
@click.option("--server-pid", type=Count(1, 2**22), default=None,
              help="The server's process id (on this host): its process tree is the server's for the host-health "
                   "sampler (any other process on the GPUs is foreign) and the record's provenance (NUMA placement).")
@click.option("--out", "out_dir", required=True, help="Directory for results.jsonl.")
@click.option("--json", "json_out", is_flag=True, help="Print the records written as JSON lines on stdout.")
def load(server_url, api, model, server_kind, concurrency, request_rate, arrival, max_error_rate, slo_ttft_ms, slo_itl_ms, max_tokens,
         num_prompts, context_len, prompt_set, tokenizer_dir, context_limit, label, server_log, stall_timeout,
         ready_timeout, wait_through_5xx, warmup, turns, think_ms, conversations, trace_file, time_scale, block_tokens,
         cache_policy, health_interval, kernel_log, server_pid, out_dir, json_out):
    """Drive a running server with streamed requests, one level per concurrency or request rate.

    \b
    Examples:
      gpudoctor bench load --server-url http://127.0.0.1:30000 --concurrency 1,4,16 \\
          --max-tokens 256 --context-len 3000 --label eagle3-tp4 --server-log sglang.log --out runs/a
      gpudoctor bench load --server-url http://127.0.0.1:8000 --api completions --request-rate 4,16,64 \\
          --max-tokens 256 --slo-ttft-ms 500 --slo-itl-ms 50 --max-error-rate 0.01 --out runs/vllm
    Every request is greedy (temperature 0). To SGLang and vLLM it has ignore_eos, so it produces exactly
    --max-tokens tokens, and OpenAI requests ask for per-chunk usage (stream_options.continuous_usage_stats), so
    speculative chunks count right. Any other OpenAI-compatible server (transformers serve, ...) gets OpenAI's
    request schema only: a request may end early; the tokens it produced are counted (usage, else the tokenizer,
    else one per chunk) and the record says how many ended short. Levels already recorded ok in --out are kept; a
    level recorded as failed is measured again.
    Exit codes: 0 every level recorded ok in --out (also when an earlier run had measured them all), 2 a level
    crashed, errored or was skipped, 3 bad input.
    """
    import asyncio
    import json

    from gpudoctor.bench.client.levels import STOP, WAIT, Level, context_limit as find_context_limit, run_levels, workload_name
    from gpudoctor.bench.client.load import LevelSpec
    from gpudoctor.bench.client.prompts import build, load_names, load_source, misfit
    from gpudoctor.bench.records.results import ResultStore
    from gpudoctor.bench.client.tokens import Counter, load_counter

    if max_tokens is None and not trace_file:
        raise InputError("--max-tokens is required (unless --trace gives each request's output length)")
    if turns and trace_file:
        raise InputError("--turns and --trace do not mix: one workload per run")
    if (turns or trace_file) and request_rate:
        raise InputError(f"{'--turns' if turns else '--trace'} does not take --request-rate")
    rates = request_rate or [None]
    if request_rate is None:
        levels_c = concurrency or [1, 4, 16]
    else:
        levels_c = concurrency or [None]
        if len(levels_c) > 1:
            raise InputError("with --request-rate, --concurrency is one cap on requests in flight, not a list")
    base = http_url(server_url, "--server-url").rstrip("/")
    output_dir(out_dir, "--out")
    questions = load_source(prompt_set)
    counter = load_counter(tokenizer_dir)
    set_name = "builtin" if prompt_set == "builtin" else prompt_set.rsplit("/", 1)[-1].rsplit(".", 1)[0]
    if context_limit:
        limit, limit_from = context_limit, "--context-limit"
    else:
        limit, limit_from = asyncio.run(find_context_limit(base, [model, tokenizer_dir]))
    levels = []
    for c in (levels_c if not (turns or trace_file) else []):
        for rate in rates:
            n = num_prompts or (max(8, 4 * c) if rate is None else max(16, int(rate * 10)))
            spec = LevelSpec(label=label, workload=workload_name(set_name, context_len, max_tokens), concurrency=c,
                             max_tokens=max_tokens, num_prompts=n, context_len=context_len, api=api,
                             model=model if api != "native" else None, server_kind=server_kind,
                             counter=counter if api != "native" and counter.exact else None,
                             request_rate=rate, arrival=arrival, max_error_rate=max_error_rate,
                             slo_ttft_ms=slo_ttft_ms, slo_itl_ms=slo_itl_ms)
            # Chat messages are text: token-id prompts only go to /generate and /v1/completions.
            prompts = build(n, questions, counter if api != "chat" else Counter(), context_len,
                            seed=c if rate is None else int(rate * 1000), names=load_names(prompt_set))
            levels.append(Level(spec, prompts, misfit(prompts, max_tokens, limit)))
    if turns or trace_file:
        levels = _agentic_levels(label, api, levels_c, turns, think_ms, conversations, trace_file, time_scale,
                                 block_tokens, max_tokens, num_prompts, counter, limit, max_error_rate,
                                 slo_ttft_ms, slo_itl_ms, model, server_kind)
    from gpudoctor.bench.cell.watch import CellWatch

    import shlex
    import socket

    pids = None
    if server_pid is not None:
        import os

        from gpudoctor.bench.cell.health import process_tree

        if not os.path.exists(f"/proc/{server_pid}"):
            raise InputError(f"--server-pid {server_pid}: no such process on this host")
        pids = lambda: process_tree(server_pid)  # noqa: E731
    from gpudoctor.bench.cell.provenance import command_of

    launched = command_of(server_pid) if server_pid is not None else None
    watch = CellWatch(cache_policy=cache_policy, interval_s=health_interval, kernel_log=kernel_log or None,
                      server_pids=pids,
                      base={"host": {"name": socket.gethostname(), "remote": False},
                            "client": {"command": "gpudoctor bench " + shlex.join(sys.argv[2:])[:1000]},
                            "check": {"status": "not run", "why": "bench load runs no gate (a campaign does)"},
                            **({"server": {"command": launched}} if launched else {})})
    store = ResultStore(out_dir)
    with Display(json_out) as display:
        display("note", text=f"token counts: {counter.source}; "
                             + (f"context limit: {limit} (from {limit_from})" if limit else limit_from))
        from gpudoctor.bench.client.levels import unreachable

        down = asyncio.run(unreachable(base))
        if down:  # say now what the readiness wait would only say at its end (#41)
            display("note", text=f"nothing answers at {base} yet ({down}): waiting up to {ready_timeout:g} s "
                                 f"(--ready-timeout) for a server there")
        written = asyncio.run(run_levels(base, store, levels, stall_s=stall_timeout, warmup=warmup, ready_timeout_s=ready_timeout,
                                         log_path=server_log, on_event=display, watch=watch,
                                         rerun_failed=True, ready_5xx=WAIT if wait_through_5xx else STOP))
        if not written:
            display("note", text=f"nothing measured: all {len(levels)} levels are already recorded ok in "
                                 f"{store.path}; a new --out measures them again")
    if json_out:
        for rec in written:
            click.echo(json.dumps(rec, sort_keys=True))
    # every level recorded ok in --out, now or by an earlier run: 0, as `bench run --resume` of a finished run
    bad = [r for r in written if r["status"] != "ok"]
    raise SystemExit(EXIT_FAIL if bad else EXIT_OK)


def _agentic_levels(label, api, levels_c, turns, think_ms, conversations, trace_file, time_scale, block_tokens,
                    max_tokens, num_prompts, counter, limit, max_error_rate, slo_ttft_ms, slo_itl_ms, model=None,
                    server_kind=None):
    """bench load's multi-turn levels (one per concurrency: that many concurrent sessions) or its trace level, in the
    dialect --server-kind names (else the one run_levels detects), for --model."""
    from gpudoctor.bench.client import multiturn, trace
    from gpudoctor.bench.client.levels import Level
    from gpudoctor.bench.client.load import LevelSpec
    from gpudoctor.bench.client.prompts import misfit
    from gpudoctor.bench.client.tokens import Counter

    common = dict(label=label, api=api, max_error_rate=max_error_rate, slo_ttft_ms=slo_ttft_ms,
                  slo_itl_ms=slo_itl_ms, model=model if api != "native" else None,
                  server_kind=server_kind if api != "native" else None,
                  counter=counter if api != "native" and counter.exact else None)
    if trace_file:
        entries = trace.load_trace(trace_file)
        due = trace.offsets(entries, time_scale)
        if due[-1] <= 0:
            raise InputError("the trace needs at least two requests at different times", path=trace_file)
        name = trace_file.rsplit("/", 1)[-1].rsplit(".", 1)[0]
        spec = LevelSpec(workload=f"{name}:trace:x{time_scale:g}", concurrency=None,
                         max_tokens=max(e.output_length for e in entries), num_prompts=len(entries),
                         request_rate=round((len(entries) - 1) / due[-1], 6), arrival="trace", **common)
        prompts = trace.build_prompts(entries, counter if api != "chat" else Counter(), block_tokens)
        return [Level(spec, prompts, misfit(prompts, spec.max_tokens, limit),
                      send=trace.sender(spec, entries, prompts, time_scale, block_tokens))]
    out = []
    for c in levels_c:
        n = num_prompts or c
        convs = (multiturn.load_conversations(conversations, turns) if conversations
                 else multiturn.builtin(max(n, 8), turns))
        spec = LevelSpec(workload=f"{'builtin' if not conversations else conversations.rsplit('/', 1)[-1].rsplit('.', 1)[0]}"
                                  f":turns{turns}:out{max_tokens}", concurrency=c, max_tokens=max_tokens,
                         num_prompts=n, **common)
        out.append(Level(spec, [], send=multiturn.sender(spec, convs, turns, think_ms / 1000.0)))
    return out


@bench.command("run")
@click.argument("campaign", type=click.Path(dir_okay=False))
@click.option("--out", "out_dir", required=True, help="Directory for results.jsonl, server logs and the campaign copy.")
@click.option("--resume", is_flag=True, help="Continue an interrupted run: skip recorded levels, re-gate, rerun the rest.")
@click.option("--inventory", type=click.Path(dir_okay=False), envvar="GPUDOCTOR_INVENTORY",
              help="Inventory that names the campaign's target host (default: ./inventory.yaml, then "
                   "~/.config/gpudoctor/inventory.yaml).")
@click.option("--accept-new-host-key", is_flag=True,
              help="Trust the target's SSH host key on first use (a changed key is always refused).")
@click.option("--rerun-suspect", is_flag=True,
              help="Measure again only the levels an earlier run into --out recorded as suspect (the host changed "
                   "during them); their old records go to retracted.jsonl.")
@click.option("--json", "json_out", is_flag=True, help="The outcome as JSON on stdout (schema gpudoctor.bench-run/1).")
@click.option("--slurm", is_flag=True,
              help="Run each configuration as a Slurm job on the node it lands on (the campaign's slurm: section); "
                   "--out must be a directory every node shares. See docs/bench.md \"Campaigns on Slurm\".")
@click.option("--no-submit", is_flag=True,
              help="With --slurm: write the job scripts and collect what jobs recorded, submit nothing (the "
                   "sbatch-only recipe of docs/bench.md).")
def run(campaign, out_dir, resume, inventory, accept_new_host_key, rerun_suspect, json_out=False, slurm=False,
        no_submit=False):
    """Run a campaign file: per (method, TP) gate, start the server, run the levels, stop, wait for free GPUs.

    \b
    Example:
      gpudoctor bench run examples/campaign.yaml --out runs/llama70b
      gpudoctor bench run examples/campaign.yaml --out runs/llama70b --resume    # after a crash or reboot
    With `target: ct200` the servers are started on inventory host ct200 over SSH (the gate runs here with
    --host ct200) and the load goes from here to server.client_host:port, so SGLang must listen on an address
    this machine can reach (server.host: 0.0.0.0); or run gpudoctor on ct200 itself with target: local.
    The campaign format is documented in docs/bench.md.
    Exit codes: 0 every level ok, 1 some levels crashed/errored/skipped (recorded with reasons),
    2 the campaign stopped on an infrastructure failure (gate, port, GPU memory, the target lost),
    3 bad campaign file, inventory or flags, or an unknown SSH host key.
    """
    from gpudoctor.campaign.runner import GateRefused, run_campaign
    from gpudoctor.errors import EXIT_WARN

    output_dir(out_dir, "--out")
    if no_submit and not slurm:
        raise InputError("bench run: --no-submit goes with --slurm")
    if slurm and (rerun_suspect or accept_new_host_key):
        raise InputError("bench run --slurm: --rerun-suspect and --accept-new-host-key are for a campaign run "
                         "from here (target: local or an inventory host)")
    with Display() as display:
        if slurm:  # docs/bench.md "Campaigns on Slurm"
            from gpudoctor.campaign.slurm import run_slurm_campaign

            counts = run_slurm_campaign(campaign, out_dir, resume=resume, submit=not no_submit, on_event=display)
        else:
            try:
                counts = run_campaign(campaign, out_dir, resume=resume, inventory=inventory, on_event=display,
                                      host_key_policy="accept-new" if accept_new_host_key else None,
                                      rerun_suspect=rerun_suspect)
            except GateRefused as exc:
                if not json_out:
                    raise
                _echo_run_json(out_dir, exc.counts, exc.exit_code, gate=exc)  # the one document, with the verdict
                raise SystemExit(exc.exit_code) from None
    code = EXIT_OK if counts["ok"] and not (counts["crashed"] + counts["error"] + counts["skipped"]) else EXIT_WARN
    if json_out:
        _echo_run_json(out_dir, counts, code)
    else:
        click.echo(f"{out_dir}/results.jsonl: " + ", ".join(f"{v} {k}" for k, v in counts.items()))
    raise SystemExit(code)


def _echo_run_json(out_dir: str, counts, code: int, gate=None) -> None:
    """`bench run --json`'s one document (gpudoctor.bench-run/1). A campaign the gate stopped says so, with the
    gate's verdict: what was refused (the configuration it stopped before) and why (`gate --json`'s document for
    gpudoctor's own gate; a gate command's argv, exit code and last lines)."""
    import json

    doc = {"schema": "gpudoctor.bench-run/1", "results": f"{out_dir}/results.jsonl",
           "counts": dict(counts) if counts is not None else None, "exit_code": code}
    if gate is not None:
        doc["stopped"] = str(gate)
        doc["gate"] = {"refused": True, "before": gate.before, "said": gate.said, "verdict": gate.verdict}
    click.echo(json.dumps(doc, sort_keys=True))


@bench.command("job", hidden=True)
@click.argument("campaign", type=click.Path(dir_okay=False))
@click.option("--out", "out_dir", required=True,
              help="The campaign's shared output directory (records: OUT/jobs/LABEL/).")
@click.option("--config", "label", required=True, help="The configuration's label, e.g. eagle3-tp2.")
def job(campaign, out_dir, label):
    """One configuration of a campaign on this node, as the job script of `bench run --slurm` runs it (internal).

    Records go to OUT/jobs/LABEL/. Exit codes: as `bench run`, and 4 when the gate refused this node
    (OUT/jobs/LABEL/refused.json says why).
    """
    from gpudoctor.campaign.slurm import run_job
    from gpudoctor.errors import EXIT_WARN

    output_dir(out_dir, "--out")
    with Display() as display:
        counts = run_job(campaign, out_dir, label, on_event=display)
    click.echo(f"{out_dir}/jobs/{label}/results.jsonl: " + ", ".join(f"{v} {k}" for k, v in counts.items()))
    raise SystemExit(EXIT_OK if counts["ok"] and not (counts["crashed"] + counts["error"] + counts["skipped"])
                     else EXIT_WARN)


@bench.command("report")
@click.argument("out_dir", type=click.Path(file_okay=False))
@click.option("--baseline", default=None, help="Method (or label) to compute speedups against [default: the campaign's].")
@click.option("--no-plots", is_flag=True, help="Skip the PNG plots (matplotlib, the `plots` extra, is then not needed).")
@click.option("--json", "json_out", is_flag=True,
              help="The files written as JSON on stdout (schema gpudoctor.bench-report/1).")
@click.option("--by-node", is_flag=True,
              help="Add a table per Slurm node (bench run --slurm): each configuration's levels on the node it ran on.")
def report(out_dir, baseline, no_plots, json_out=False, by_node=False):
    """Write report.md, results.csv and plots/*.png from OUT_DIR/results.jsonl.

    \b
    Example:
      gpudoctor bench report runs/llama70b
    Tables per method x TP: tok/s per workload and concurrency, speedup vs the baseline at the same TP and
    concurrency, accept length. Levels that were not measured are listed with their reason. The plots need
    matplotlib (the `plots` extra); without it report.md and results.csv are written and one line says how to add it.
    Exit codes: 0 written, 3 no results in OUT_DIR.
    """
    from gpudoctor.bench.records.report import write_report

    written = write_report(out_dir, baseline=baseline, plots=not no_plots, by_node=by_node)
    if json_out:
        import json

        click.echo(json.dumps({"schema": "gpudoctor.bench-report/1", "report": written["report"],
                               "csv": written["csv"], "plots": list(written["plots"]),
                               "plots_skipped": written.get("plots_skipped")}, sort_keys=True))
        raise SystemExit(EXIT_OK)
    click.echo(written["report"])
    click.echo(written["csv"])
    for p in written["plots"]:
        click.echo(p)
    if written.get("plots_skipped"):
        click.echo(written["plots_skipped"], err=True)
    raise SystemExit(EXIT_OK)


@bench.command("compare")
@click.argument("a")
@click.argument("b")
@click.option("--fail-if", "fail_if", multiple=True, metavar="EXPR",
              help="Regression gate, repeatable: 'output_tok_per_s < -5%', 'ttft_ms_p99 > +10%'. Exit 1 when a cell's "
                   "change is beyond the threshold and significant.")
@click.option("--effect", type=finite(0.001, 10), default=0.05, show_default=True,
              help="The change (a fraction) that \"how many more trials\" is computed for.")
@click.option("--min-effect", type=finite(0, 10), default=0.01, show_default=True,
              help="A significant change smaller than this fraction is called no difference.")
@click.option("--json", "json_out", is_flag=True, help="The comparison (and the gate's outcome) as JSON on stdout.")
@click.option("--by-node", is_flag=True,
              help="Match cells also on the Slurm node they were measured on (bench run --slurm): A and B compared "
                   "only where they ran on the same node.")
def compare(a, b, fail_if, effect, min_effect, json_out, by_node):
    """Compare two benchmark results cell by cell: is B faster or slower than A, and is it significant?

    \b
    A and B are result directories (holding results.jsonl), or one directory twice with a selector:
      gpudoctor bench compare runs/base runs/new
      gpudoctor bench compare runs/c1:method=autoregressive runs/c1:method=eagle3
      gpudoctor bench compare runs/c1:tp=1 runs/c1:tp=4
      gpudoctor bench compare runs/base runs/new --fail-if "output_tok_per_s < -5%" --fail-if "ttft_ms_p99 > +10%"
    Selector fields: method, label, tp, host. Per cell (workload x concurrency or rate) and metric (tok/s, TTFT
    p50/p99, ITL p50, e2e p50): A, B, the change with its 95 % interval, the test used (Welch t on trials with 2+
    trials per side, else a bootstrap + Mann-Whitney U on per-request values) and a verdict: faster, slower, no
    difference detectable (with how many trials would detect --effect), not enough data, or not compared (suspect or
    failed levels). A warning names anything else that differs between A and B (engine, driver, power limit, ...).
    See docs/bench.md "Comparing results". Records of `bench run --slurm` also select by node (DIR:node=n1).
    Exit codes: 0 compared (and every gate rule passed), 1 a --fail-if rule failed, 3 bad input, or a gate that
    could not judge a cell.
    """
    import json

    from gpudoctor.bench.records import compare as cmp

    rules = [cmp.parse_rule(t) for t in fail_if]
    result = cmp.compare(cmp.load_side(a), cmp.load_side(b), effect=effect, min_effect=min_effect, by_node=by_node)
    verdict = cmp.gate(result, rules) if rules else None
    if json_out:
        click.echo(json.dumps({"schema": "gpudoctor.bench-compare/1", **result, "gate": verdict}, default=str,
                              sort_keys=True))
    else:
        for line in cmp.render_text(result, verdict):
            click.echo(line)
    if verdict is None:
        if not result["cells"]:
            raise InputError("bench compare: A and B have no cell in common (nothing to compare)")
        raise SystemExit(EXIT_OK)
    if verdict["outcome"] == "fail":
        raise SystemExit(EXIT_WARN)
    if verdict["outcome"] == "unknown":
        first = verdict["unjudged"][0]
        raise CannotJudge(f"bench compare: the gate could not judge {len(verdict['unjudged'])} cell(s), first "
                          f"{cmp.cell_text(first['cell'])}: {first['why']}")
    raise SystemExit(EXIT_OK)


@bench.command("standin", context_settings={"ignore_unknown_options": True, "allow_extra_args": True,
                                           "help_option_names": []}, add_help_option=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def standin(args):
    """Serve a protocol-faithful SGLang 0.5.23 (or --flavor vllm) stand-in with a known truth, for dry runs.

    \b
    Example:
      gpudoctor bench standin --port 30000 --decode-tok-s 60 --accept-length 3 --ttft-ms 40
    The options are those of `python3 -m gpudoctor.bench.standin` (`gpudoctor bench standin --help` lists them);
    any other flag is accepted and shown in /server_info, so it can stand in for `python3 -m sglang.launch_server`
    in a campaign's server.command. Runs until SIGTERM or ^C. See docs/bench.md.

    Exit codes: 0 stopped (SIGTERM or ^C: a server's stop signal), 3 bad input.
    """
    from gpudoctor.bench.standin.server import main

    def bad(message: str):
        raise InputError(f"bench standin: {message}")

    main(list(args), prog="gpudoctor bench standin", on_error=bad)
