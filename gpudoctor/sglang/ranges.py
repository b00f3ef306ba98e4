"""Input-time sanity of SGLang arguments: every number in its range, every local path present.

SGLang's argparse takes `--tp-size 0`, `--context-length -1` or `--mem-fraction-static nan` without a word and fails
later (a division by zero at load, every request rejected, a NaN memory plan). A local `--model-path` that does not
exist is taken for a Hugging Face repo id and fails after the download attempt. These findings say so before launch.
"""

from __future__ import annotations

import math
import os

from gpudoctor.findings import Finding
from gpudoctor.sglang.argparser import ParsedArgs

SOURCE = "python/sglang/srt/server_args.py::ServerArgs"

# dest -> (lo, hi, lo excluded, what); None = unbounded. -1 is SGLang's "off" for chunked_prefill_size only.
RANGES = {
    "tp_size": (1, 4096, False, "tensor parallel size"),
    "pp_size": (1, 4096, False, "pipeline parallel size"),
    "dp_size": (1, 4096, False, "data parallel size"),
    "ep_size": (1, 4096, False, "expert parallel size"),
    "nnodes": (1, 4096, False, "number of nodes"),
    "node_rank": (0, 4095, False, "node rank"),
    "context_length": (1, None, False, "context length"),
    "max_running_requests": (1, None, False, "max running requests"),
    "max_total_tokens": (1, None, False, "max total tokens"),
    "max_prefill_tokens": (1, None, False, "max prefill tokens"),
    "page_size": (1, None, False, "page size"),
    "port": (1, 65535, False, "port"),
    "stream_interval": (1, None, False, "stream interval"),
    "cuda_graph_max_bs": (1, None, False, "CUDA graph max batch size"),
    "mem_fraction_static": (0, 1, True, "static memory fraction"),
    "dist_timeout": (0, None, True, "distributed timeout"),
    "watchdog_timeout": (0, None, True, "watchdog timeout"),
}
PATHS = {"model_path": "model", "tokenizer_path": "tokenizer", "speculative_draft_model_path": "draft model"}


def _bad(value, lo, hi, lo_open) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False  # not converted: argparse's own problem, reported by parse_findings
    if isinstance(value, float) and not math.isfinite(value):
        return True
    if lo is not None and (value <= lo if lo_open else value < lo):
        return True
    return hi is not None and value > hi


def range_findings(a: ParsedArgs) -> list[Finding]:
    """A fail per out-of-range number or missing local path given on the command line."""
    from gpudoctor.files.inputs import brief
    from gpudoctor.sglang.rules import F

    out: list[Finding] = []
    for dest, (lo, hi, lo_open, what) in RANGES.items():
        if not a.is_set(dest):
            continue
        v = a.values[dest]
        if _bad(v, lo, hi, lo_open):
            flag = a.given.get(dest, "--" + dest.replace("_", "-"))
            want = (f"> {lo}" if lo_open else f">= {lo}") + (f" and <= {hi}" if hi is not None else "")
            out.append(F("sglang.args.range", "fail", f"{flag} {brief(v, 40)}: the {what} must be {want}",
                         source=SOURCE, stage="load", subject=flag, evidence=[f"{flag} {v!r}"],
                         fix=f"give {flag} a value {want}"))
    if a.is_set("chunked_prefill_size"):
        v = a.values["chunked_prefill_size"]
        if isinstance(v, int) and not isinstance(v, bool) and (v == 0 or v < -1):
            flag = a.given.get("chunked_prefill_size", "--chunked-prefill-size")
            out.append(F("sglang.args.range", "fail", f"{flag} {v}: must be -1 (off) or a positive number of tokens",
                         source=SOURCE, stage="load", subject=flag, fix=f"use {flag} -1 or a size like 8192"))
    for dest, what in PATHS.items():
        p = a.values.get(dest) if a.is_set(dest) else None
        if not isinstance(p, str) or not p:
            continue
        if p.startswith(("/", "./", "../", "~")) and not os.path.exists(os.path.expanduser(p)):
            from gpudoctor.sglang.conflicts import MODEL_PATHS, repo_id_problem

            if dest in MODEL_PATHS and repo_id_problem(p):
                continue  # not a repo id either: SGLang refuses it at resolve (conflicts.model_path_findings)
            flag = a.given.get(dest, "--" + dest.replace("_", "-"))
            # a warning: arguments are often validated on another machine than the server's
            out.append(F("sglang.args.path_missing", "warn", f"{flag} {brief(p, 80)}: the {what} path does not exist "
                                                             f"on this machine",
                         source="python/sglang/srt/hf_transformers_utils.py (a missing local path is tried as a "
                                "Hugging Face repo id)", stage="load", subject=flag,
                         evidence=[f"stat({p}) → ENOENT"], fix=f"point {flag} at the {what} directory"))
    return out
