#!/usr/bin/env python3
"""Differential test: gpudoctor's SGLang rules vs SGLang's own resolver, over the verdict corpus.

    python3 -m venv /tmp/sgl523 && /tmp/sgl523/bin/pip install --no-deps sglang==0.5.23 && \
        /tmp/sgl523/bin/pip install torch==2.13.0 numpy ...   # see docs/sglang-differential.md
    python tools/sglang_differential.py --python /tmp/sgl523/bin/python --out docs/sglang-differential.md

For each case of tests/sglang/corpus.yaml it writes the model configs, runs gpudoctor's validate() and SGLang's
prepare_server_args + resolve_once (one import, in the given Python), and records whether both agree:
- SGLang fails at parse/resolve  <->  we report a fail whose stage is parse/resolve;
- SGLang resolves                <->  we report no parse/resolve fail (a load/request-stage fail is ours alone:
                                      SGLang would meet it only after the model load or at the first request);
- the resolved speculative values and max_running_requests are equal.
Off-GPU, `--device cuda` is appended (SGLang needs an accelerator or an explicit device to resolve).
Exit 0 when every case agrees, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT))  # tests.*; gpudoctor itself: the installed package

from gpudoctor.errors import InputError  # noqa: E402
from gpudoctor.findings import Status  # noqa: E402
from gpudoctor.sglang import validate  # noqa: E402
from gpudoctor.sglang.resolver import resolve_many  # noqa: E402

SPEC_KEYS = ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens", "max_running_requests")


def _opts(options: list) -> dict:
    from gpudoctor.sglang.argparser import human_readable_int

    o, it = {}, iter(str(x) for x in options)
    for k in it:
        v = next(it)
        if k == "--input-len":
            o["input_len"] = human_readable_int(v)
        elif k == "--output-len":
            o["output_len"] = human_readable_int(v)
        elif k == "--gpu-mem-gib":
            o["gpu_mem_gib"] = float(v)
        elif k == "--fork-algorithms":
            o["fork_algorithms"] = v.split(",")
    return o


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", required=True, help="Python of a venv where `import sglang` works")
    ap.add_argument("--corpus", default=str(ROOT / "tests/sglang/corpus.yaml"))
    ap.add_argument("--out", default=None, help="write the markdown report here")
    a = ap.parse_args()
    corpus = yaml.safe_load(Path(a.corpus).read_text())
    tmp = Path(tempfile.mkdtemp(prefix="sglang-diff-"))
    dirs = {}
    for name, cfg in corpus["models"].items():
        (tmp / name).mkdir()
        (tmp / name / "config.json").write_text(json.dumps(cfg))
        dirs[name] = str(tmp / name)
    rows, jobs = [], []
    for case in corpus["cases"]:
        sub = {"{model}": dirs.get(case.get("model"), ""), "{draft}": dirs.get(case.get("draft"), "")}
        argv = [sub.get(str(x), str(x)) for x in case["args"]]
        try:
            ours = validate(argv, dirs.get(case.get("model")), dirs.get(case.get("draft")),
                            env=dict(case.get("env") or {}), **_opts(case.get("options", [])))
        except InputError as exc:
            ours = exc
        real_argv = list(ours.argv if not isinstance(ours, Exception) else argv)
        if "--device" not in real_argv:
            real_argv += ["--device", "cuda"]
        jobs.append({"argv": real_argv, "env": case.get("env") or {}})
        rows.append((case, ours))
    t0 = time.monotonic()
    reals = resolve_many(jobs, python=a.python, timeout=1200)
    took = time.monotonic() - t0
    lines, disagree, na, version = [], 0, 0, None
    for (case, ours), real in zip(rows, reals):
        version = version or real.get("version")
        early = sorted({f.id for f in ours.findings if f.status == Status.FAIL and f.data.get("stage") in ("parse", "resolve")})
        late = sorted({f.id for f in ours.findings if f.status == Status.FAIL and f.data.get("stage") not in ("parse", "resolve")})
        offgpu = "requires platform support" in str(real.get("error")) or "requires Hopper" in str(real.get("error"))
        if real.get("ok") is None:
            verdict = "not run"
        elif case.get("options") and "--fork-algorithms" in case["options"]:
            verdict = "n/a (fork-only flags; upstream rejects them, as the ddtree_* cases above show)"
        elif offgpu and not early:
            verdict = "n/a off-GPU (SGLang's CPU platform check fires before the rule under test)"
        elif real["ok"]:
            diffs = [f"{k} ours={ours.resolved.get(k)} sglang={real['resolved'].get(k)}" for k in SPEC_KEYS
                     if k in ours.resolved and ours.resolved.get(k) is not None
                     and ours.resolved.get(k) != real["resolved"].get(k)]
            verdict = "agree" if not early and not diffs else "DISAGREE " + "; ".join(
                (["we predict " + ", ".join(early)] if early else []) + diffs)
        else:
            verdict = "agree" if early else "DISAGREE (SGLang fails, we predict no early failure)"
        disagree += verdict.startswith("DISAGREE")
        na += verdict.startswith("n/a")
        sg = "resolves" if real.get("ok") else f"{real.get('error_type')}: {str(real.get('error'))[:110]}"
        if real.get("ok"):
            r = real["resolved"]
            sg += f" (steps {r.get('speculative_num_steps')}, topk {r.get('speculative_eagle_topk')}, draft {r.get('speculative_num_draft_tokens')}, max_running {r.get('max_running_requests')})"
        lines.append(f"| {case['name']} | {ours.verdict} | {', '.join(early) or '-'} | {', '.join(late) or '-'} | {sg.replace('|', '/')} | {verdict} |")
    head = [
        "# Differential: gpudoctor's SGLang rules vs SGLang's own resolver",
        "",
        f"Generated by `tools/sglang_differential.py` against sglang {version} (pip, `--no-deps`, torch 2.13.0 CPU) "
        f"on {time.strftime('%Y-%m-%d')}; {len(rows)} corpus cases resolved in {took:.0f} s; **{len(rows) - disagree - na} agree, {disagree} disagree, {na} not comparable here**.",
        "",
        "SGLang resolves with `prepare_server_args(argv)` + `ServerArgs.resolve_once()`, `--device cuda` appended (no GPU here).",
        "\"early\" = our fails that SGLang raises at parse/resolve time; \"late\" = our fails that SGLang meets only at model",
        "load or at the first request (its resolver passes them; that is the point of validating first).",
        "",
        "| case | our verdict | our early fails | our late fails | SGLang 0.5.23 | result |",
        "|---|---|---|---|---|---|",
    ]
    text = "\n".join(head + lines) + "\n"
    if a.out:
        Path(a.out).write_text(text)
    print(text)
    return 1 if disagree else 0


if __name__ == "__main__":
    raise SystemExit(main())
