#!/usr/bin/env python3
"""Differential test: gpudoctor's SGLang rules vs SGLang's own resolution, over the corpora of tests/sglang/.

Set up a throwaway reference venv (outside the repository; SGLang is never a gpudoctor dependency):

    python3.11 -m venv /tmp/sglang-ref
    /tmp/sglang-ref/bin/pip install --no-deps sglang==0.5.23
    /tmp/sglang-ref/bin/pip install torch          # any build; no GPU is used (torchvision pulled 2.14.1 here)
    bash tools/sglang_differential_setup.sh /tmp/sglang-ref   # the modules its import names, transformers 5.19.0

then:

    python tools/sglang_differential.py --python /tmp/sglang-ref/bin/python

For every case it writes the model configs, runs gpudoctor's validate() and, in the reference venv, SGLang's
prepare_server_args -> ServerArgs.resolve_once -> check_server_args -> the draft worker's ModelConfig at the
target's context length, with torch's CUDA queries and nvidia-smi answering as the case's GPU (H200 by default,
RTX PRO 6000); see gpudoctor/sglang/resolver.py. It writes tests/sglang/differential_cache.json (SGLang's verdicts,
which the tests hold our rules to) and docs/sglang-differential.md (the table). Exit 0 when there is no
false-accept and at most the allowed false-rejects, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT))  # tests.*; gpudoctor itself: the installed package

from gpudoctor.errors import InputError  # noqa: E402
from gpudoctor.sglang import differential as D  # noqa: E402
from gpudoctor.sglang.resolver import judge, early_fails, resolve_many  # noqa: E402

CORPUS_DIR = ROOT / "tests/sglang"
CACHE = CORPUS_DIR / "differential_cache.json"
KEEP = ("speculative_algorithm", "speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens",
        "max_running_requests", "mem_fraction_static", "chunked_prefill_size", "page_size", "context_len",
        "attention_backend", "draft_context_len", "attn_dp_size", "cuda_graph_max_bs_decode", "quantization")


def run_sglang(cases: list[dict], dirs: dict[str, str], python: str) -> tuple[dict, float]:
    """SGLang's verdict per case name, one reference process per faked GPU."""
    out, took = {}, 0.0
    by_dev: dict[str, list[dict]] = {}
    for c in cases:
        by_dev.setdefault(c.get("device") or D.DEFAULT_DEVICE, []).append(c)
    for dev, group in by_dev.items():
        jobs = [{"argv": D.argv_of(c, dirs, strip=True), "env": c.get("env") or {}} for c in group]
        t0 = time.monotonic()
        reals = resolve_many(jobs, python=python, timeout=1800, device=dev)
        took += time.monotonic() - t0
        for c, r in zip(group, reals):
            out[c["name"]] = r
    return out, took


def scrub(real: dict, dirs: dict[str, str]) -> dict:
    """Keep what the tests compare; put {model}/{draft}-style names back in place of temp paths."""
    def s(x):
        if isinstance(x, str):
            for name, d in dirs.items():
                x = x.replace(d, "{" + name + "}")
        return x
    r = {k: s(real.get(k)) for k in ("ok", "stage", "error_type", "error", "version")}
    r["seconds"] = round(real.get("seconds") or 0.0, 4)
    if real.get("resolved") is not None:
        r["resolved"] = {k: s(real["resolved"].get(k)) for k in KEEP if k in real["resolved"]}
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", required=True, help="Python of the reference venv where `import sglang` works")
    ap.add_argument("--only", default=None, help="comma-separated case names (debugging; the cache is not written)")
    ap.add_argument("--out", default=str(ROOT / "docs/sglang-differential.md"), help="markdown report")
    a = ap.parse_args()
    models, cases = D.load(CORPUS_DIR)
    if a.only:
        want = set(a.only.split(","))
        cases = [c for c in cases if c["name"] in want]
    with tempfile.TemporaryDirectory(prefix="sglang-diff-") as tmp:
        dirs = D.write_models(models, Path(tmp))
        reals, took = run_sglang(cases, dirs, a.python)
        rows = []
        for c in cases:
            ours = D.run_ours(c, dirs)
            real = scrub(reals[c["name"]], dirs)
            rows.append((c, ours, real))
            if a.only:
                print(c["name"], json.dumps(real, indent=1))
                if not isinstance(ours, InputError):
                    print("  ours:", ours.verdict, [(f.id, f.status.value, f.data.get("stage")) for f in ours.findings
                                                    if f.status.value in ("fail", "warn")],
                          {k: ours.resolved.get(k) for k in KEEP if k in ours.resolved})
                    print("  judge:", judge(ours, real, D.skipped_values(c)))
    if a.only:
        return 0
    version = next((r.get("version") for _, _, r in rows if r.get("version")), None)
    cache = {"schema": "gpudoctor.sglang.differential/1", "sglang_version": version,
             "generated": time.strftime("%Y-%m-%d"), "resolution_seconds": round(took, 1),
             "cases": {c["name"]: dict(key=D.case_key(c, models), **r) for c, _, r in rows}}
    CACHE.write_text(json.dumps(cache, indent=1, sort_keys=True) + "\n")
    text, bad = report(rows, version, took)
    Path(a.out).write_text(text)
    print(text)
    return 1 if bad else 0


def report(rows, version, took) -> tuple[str, bool]:
    """The markdown table and whether the acceptance bound is broken (any false-accept, > 2 false-rejects, or an
    unexplained disagreement)."""
    counts: dict[str, int] = {}
    stages: dict[str, int] = {}
    lines, unexplained = [], []
    for c, ours, real in rows:
        if isinstance(ours, InputError):
            kind, det, verdict, early = "input_error", [str(ours)], "bad input", []
        elif not D.comparable(c):
            kind, det, verdict, early = "n/a", ["fork-only flags: upstream rejects them by design"], ours.verdict, early_fails(ours)
        else:
            kind, det = judge(ours, real, D.skipped_values(c))
            verdict, early = ours.verdict, early_fails(ours)
        counts[kind] = counts.get(kind, 0) + 1
        known = c.get("known") or {}
        if kind not in ("agree", "n/a") and known.get("kind") != kind:
            unexplained.append(c["name"])
        sg = "passes" if real.get("ok") else f"{real.get('stage')}: {real.get('error_type')}: {str(real.get('error'))[:100]}"
        why = known.get("why", "") if kind not in ("agree", "n/a") else ""
        late = [] if isinstance(ours, InputError) else sorted(
            {f.id for f in ours.findings if f.status.value == "fail" and f.id not in early})
        stages[real.get("stage") if real.get("ok") is False else "passes"] = \
            stages.get(real.get("stage") if real.get("ok") is False else "passes", 0) + 1
        lines.append(f"| {c['name']} | {c.get('device') or D.DEFAULT_DEVICE} | {verdict} | {', '.join(early) or '-'} | "
                     f"{', '.join(late) or '-'} | {sg.replace('|', '/')} | {kind}{(': ' + '; '.join(det)) if det and kind != 'agree' else ''}"
                     f"{(' — ' + why) if why else ''} |")
    n = len(rows)
    fa, fr = counts.get("false_accept", 0), counts.get("false_reject", 0)
    bad = bool(fa or fr > 2 or unexplained)
    head = [
        "# Differential: gpudoctor's SGLang rules vs SGLang's own resolution",
        "",
        f"Generated by `tools/sglang_differential.py` against **sglang {version}** (pip `--no-deps` in a throwaway venv, "
        f"transformers 5.19.0, torch 2.14.1 — no GPU: its device queries are faked) on {time.strftime('%Y-%m-%d')}: **{n} cases**, SGLang's stages "
        f"took {took:.0f} s in all.",
        "",
        f"**{counts.get('agree', 0)} agree, {fa} false-accepts, {fr} false-rejects, "
        f"{counts.get('stage', 0)} stage disagreements, {counts.get('values', 0)} value disagreements, "
        f"{counts.get('n/a', 0)} not comparable**" + (f"; unexplained: {', '.join(unexplained)}" if unexplained else "") + ".",
        "",
        f"SGLang's verdicts: {stages.get('passes', 0)} pass every stage run; rejected at parse "
        f"{stages.get('parse', 0)}, resolve {stages.get('resolve', 0)}, check_server_args {stages.get('check', 0)}, "
        f"the draft worker (after the target load) {stages.get('draft', 0)}.",
        "",
        "What runs on SGLang's side (gpudoctor/sglang/resolver.py): `prepare_server_args(argv)` (argparse) -> "
        "`ServerArgs.resolve_once()` (every arg_groups hook) -> `check_server_args()` (what the engine runs next) -> "
        "the draft worker's `ModelConfig.from_server_args(..., is_draft_model=True, context_length=<target context_len>)` "
        "(what fails after the target load). torch's CUDA queries (`is_available`, `get_device_capability`, "
        "`get_device_properties`, ...) and `nvidia-smi` answer as the case's GPU: H200 (SM90, 143771 MiB) unless the "
        "case says rtx_pro_6000 (SM120, 97887 MiB); CUDA kernel packages SGLang imports at module level (sgl_kernel) "
        "are stubs that raise if called (resolution calls none). Not run: weight loading, the attention layers, CUDA graphs.",
        "",
        "Kinds: *agree*; *false_accept* = SGLang stops and our verdict is not invalid; *false_reject* = SGLang passes "
        "every stage it ran and we predict a failure in one of them; *stage* = both reject, we place it later; "
        "*values* = both accept, a resolved value differs (speculative steps/topk/draft tokens, max_running_requests, "
        "mem_fraction_static, chunked_prefill_size, page_size, attention backend, context_len). Our fails at stage load/request (heads that "
        "do not split, --tp-size 0, KV cache too small, ...) are beyond what SGLang's run reaches here and agree when "
        "SGLang passes. Every disagreement carries its explanation (the case's `known` entry in tests/sglang/differential.yaml).",
        "",
        "| case | GPU | our verdict | our fails before the load | our later fails | SGLang 0.5.23 | result |",
        "|---|---|---|---|---|---|---|",
    ]
    return "\n".join(head + lines) + "\n", bad


if __name__ == "__main__":
    raise SystemExit(main())
