"""`gpudoctor sglang validate` checks launch arguments before a long model load; `sglang explain` reads a failed log."""

from __future__ import annotations

import json

import click

from gpudoctor.errors import InputError
from gpudoctor.exitcodes import EXIT_OK, EXIT_WARN
from gpudoctor.options import Count, Finite


@click.group("sglang")
def sglang():
    """SGLang helpers: validate launch arguments before a 10-minute model load; explain why a server failed."""


@sglang.command("validate", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--model-config", "model_config", metavar="PATH",
              help="The model's config.json or model directory (default: --model-path when it is a local directory).")
@click.option("--draft-config", "draft_config", metavar="PATH",
              help="The draft model's config.json or directory (default: a local --speculative-draft-model-path).")
@click.option("--gpu-mem-gib", type=Finite(1, 65536), default=None, metavar="GIB",
              help="Memory of one GPU (H200: 141) [default: this machine's GPU; with none, and no --gpu, the memory "
                   "plan is not judged].")
@click.option("--gpu", "gpu", default=None, metavar="NAME",
              help="The GPU model (h200, h100, b200, rtx_pro_6000, a100_80g, l40s): its nvidia-smi memory replaces "
                   "--gpu-mem-gib and its SM decides which KV cache dtypes SGLang allows [default: this machine's, "
                   "read through NVML, unless --gpu-mem-gib is given].")
@click.option("--gpus", type=Count(1, 1 << 16), default=None, metavar="N", help="GPUs on the host (checks tp x pp x dp).")
@click.option("--input-len", type=Count(0, human=True), default=None, metavar="TOKENS", help="Longest prompt you will send (30000, 30k).")
@click.option("--output-len", type=Count(0, human=True), default=None, metavar="TOKENS", help="max_new_tokens you will ask for.")
@click.option("--fork-algorithms", default="", metavar="A,B",
              help="Speculative algorithms your SGLang build adds (e.g. DDTREE on a fork).")
@click.option("--sglang-version", default="0.5.23", show_default=True, help="Which SGLang's flags and rules to use.")
@click.option("--resolver-python", default=None, metavar="PYTHON",
              help="A Python where `import sglang` works (e.g. the server's venv): also run SGLang's own parser, "
                   "resolve_once, check_server_args and draft config on the arguments and compare (seconds, not ms).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def validate_cmd(model_config, draft_config, gpu_mem_gib, gpu, gpus, input_len, output_len, fork_algorithms, sglang_version,
                 resolver_python, as_json, args):
    """Validate sglang.launch_server ARGS (after --) without loading the model.

    \b
    Examples:
      gpudoctor sglang validate -- --model-path /dev/shm/K2.6 --tp 8 \\
          --speculative-algorithm EAGLE3 --speculative-draft-model-path /data/eagle3 \\
          --speculative-num-steps 1 --speculative-num-draft-tokens 3 --speculative-eagle-topk 1
      gpudoctor sglang validate --model-config /models/qwen/config.json \\
          --input-len 30000 --output-len 256 -- --model-path qwen --tp-size 8
      gpudoctor sglang validate --json -- python -m sglang.launch_server --model-path /m

    \b
    Checks: argparse (abbreviations, ambiguous prefixes, unknown flags), speculative
    steps/topk/draft-token combinations, page size vs attention backend, DFlash block
    size and window, draft path and the draft's context length (which SGLang checks only
    after the target has loaded), rejection sampling, block verification, speculation x
    attention DP, algorithm names, TP vs attention/KV/linear heads, attention-DP layout,
    page size vs chunked prefill, quantization vs the checkpoint and the CUDA registry,
    KV cache dtype vs the GPU's SM, all of check_server_args, context length (read as
    transformers rewrites the config), input + output vs context, and a memory plan
    (SGLang's mem_fraction_static default, weights, KV cache, max_running_requests).
    Every finding names the SGLang source file and function that enforces it, and the fix.

    \b
    Without --gpu or --gpu-mem-gib the GPU is this machine's (NVML); with none found the
    memory plan is not judged: a warning (exit 1), never "valid" on an assumed GPU.

    \b
    Exit codes: 0 valid, 1 warnings, 2 invalid (SGLang would fail), 3 bad input.
    """
    from gpudoctor.sglang import validate

    if not args:
        raise InputError("no SGLang arguments: put them after --, e.g. gpudoctor sglang validate -- --model-path M")
    local = None
    if gpu is None and gpu_mem_gib is None:
        from gpudoctor.sglang.localgpu import this_machine

        gpu, local = this_machine()  # none found: gpu_mem_gib stays None and validate does not judge the memory
    result = validate(
        list(args), model_config, draft_config,
        gpu_mem_gib=gpu_mem_gib, gpus=gpus, input_len=input_len, output_len=output_len,
        fork_algorithms=[x.strip() for x in fork_algorithms.split(",") if x.strip()], sglang_version=sglang_version,
        gpu=gpu)
    if local is not None:
        result.findings.insert(0, local)
    comparison = None
    if resolver_python is not None:  # opt-in: importing SGLang and torch alone takes 6-13 s, validate takes ms
        from gpudoctor.sglang.resolver import compare, resolve_with_sglang

        real = resolve_with_sglang(result.argv, python=resolver_python)
        comparison = compare(result, real)
        result.findings.append(comparison)
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=2, default=str))
    else:
        _render(result)
    raise SystemExit(result.exit_code)


_MARK = {"fail": "FAIL", "warn": "WARN", "ok": "ok  ", "info": "info", "unknown": "????"}


def _render(result) -> None:
    order = {"fail": 0, "warn": 1, "ok": 2, "info": 3, "unknown": 1}
    for f in sorted(result.findings, key=lambda f: order[f.status.value]):
        click.echo(f"{_MARK[f.status.value]} {f.id}: {f.summary}")
        if f.status.value in ("fail", "warn"):
            if f.data.get("sglang_error"):
                click.echo(f"       SGLang says: {f.data['sglang_error']}")
            for e in f.evidence:
                click.echo(f"       evidence: {e}")
            if f.hint:
                click.echo(f"       fix: {f.hint}")
            click.echo(f"       source: {f.data.get('source')} (stage: {f.data.get('stage')})")
    r = result.resolved
    if r.get("speculative_algorithm"):
        click.echo(f"resolved: {r['speculative_algorithm']} steps={r.get('speculative_num_steps')} "
                   f"topk={r.get('speculative_eagle_topk')} draft_tokens={r.get('speculative_num_draft_tokens')} "
                   f"max_running_requests={r.get('max_running_requests')}")
    if result.memory and "max_total_num_tokens" in result.memory:
        m = result.memory
        click.echo(f"memory: {m['weights_per_gpu_gib']:.1f} GiB weights/GPU, {m['max_total_num_tokens']} KV tokens, "
                   f"max_running_requests {m['max_running_requests']} (mem_fraction_static {m['mem_fraction_static']})")
    click.echo(f"verdict: {result.verdict} (exit {result.exit_code})")


@sglang.command("explain")
@click.argument("log", metavar="LOG")
@click.option("--engine", type=click.Choice(["sglang", "vllm", "any"]), default="any", show_default=True,
              help="Whose messages to look for.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def explain_cmd(log, engine, as_json):
    """Name why a server failed, from its log: the cause, the fix, and the lines that matter.

    LOG is a server log file (`journalctl -u sglang > sglang.log`, the launch log a campaign keeps in its --out
    directory) or - for standard input. Only its last 8 MiB are read.

    \b
    Knows SGLang 0.5.23's failures and those of the libraries under it: max_running_request
    is zero (and the hybrid-model state-cache trap), Not enough memory / CUDA OOM, illegal
    instruction / illegal memory access (kernel bugs, not measurements), CUDA unknown error
    999 (-> gpudoctor check), NCCL timeouts and errors, the speculative-argument assert and
    TypeError, a draft model shorter than the target's context, mismatched dependencies,
    the port in use, a model or tokenizer path that does not exist.

    \b
    Exit codes (an explanation is this command's job, docs/cli.md): 0 explained, a known
    failure named (or nothing in the log looks like a failure; --json's failure is then
    null), 1 a failure no known pattern explains (its lines are shown: read them),
    3 the log cannot be read.
    """
    from gpudoctor.bench.server import logscan
    from gpudoctor.errors import _printable

    text = logscan.read_log(log)
    found = logscan.diagnose(text, None if engine == "any" else engine)
    code = EXIT_OK if found is None or found.known else EXIT_WARN
    if as_json:
        click.echo(json.dumps({"schema": "gpudoctor.sglang-explain/1", "log": log, "exit_code": code,
                               "explained": found is None or found.known,
                               "failure": found.to_json() if found else None}, indent=2))
        raise SystemExit(code)
    if found is None:
        click.echo(f"{_printable(log)}: no failure found ({len(text.splitlines())} lines read)")
        raise SystemExit(EXIT_OK)
    click.echo(f"{_printable(log)}:{found.line_no}: {_printable(found.line)}")
    if found.known:
        click.echo(f"cause: {found.cause}")
        click.echo(f"fix:   {found.fix}")
        click.echo(f"       (known failure {found.id}; raised in {found.source})")
    else:
        click.echo("cause: not a known failure — the lines below are the ones that matter")
    click.echo("lines that matter:")
    width = len(str(found.lines[-1][0])) if found.lines else 1
    for no, line in found.lines:
        click.echo(f"  {no:>{width}}: {_printable(line)}")
    raise SystemExit(code)
