"""Ask SGLang itself: resolve the arguments with its own parser in a subprocess, and compare with our rules.

Runs `prepare_server_args(argv)` then `resolve_once()` (server_args.py) in the Python you name, under a deadline.
Kept small on purpose: it only runs where `import sglang` works (the target host, or the differential venv).
"""

from __future__ import annotations

import json
import subprocess
import sys

from gpudoctor.findings import Finding, Status

FIELDS = ("speculative_algorithm", "speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens",
          "max_running_requests", "page_size", "tp_size", "context_length", "attention_backend", "mem_fraction_static")

_SCRIPT = r"""
import json, os, sys, io, contextlib, logging
def one(argv):
  out = {"stage": "parse"}
  try:
      from sglang.srt.server_args import prepare_server_args
      err = io.StringIO()
      try:
          with contextlib.redirect_stderr(err):
              sa = prepare_server_args(argv)
      except SystemExit as e:
          out.update(ok=False, error_type="SystemExit", error=(err.getvalue().strip().splitlines() or [str(e.code)])[-1])
          return out
      logging.disable(logging.CRITICAL)
      out["stage"] = "resolve"
      sa.resolve_once()
      from sglang.srt.arg_groups.overrides import resolving_view
      v = resolving_view(sa)
      out.update(ok=True, resolved={k: getattr(v, k, None) for k in FIELDS})
  except BaseException as e:
      out.update(ok=False, error_type=type(e).__name__, error=str(e).strip().splitlines()[0] if str(e).strip() else "")
  try:
      import sglang; out["version"] = sglang.__version__
  except Exception:
      pass
  return out

jobs = json.loads(sys.stdin.read())
for job in jobs:
    saved = dict(os.environ)
    os.environ.update(job.get("env") or {})
    try:
        print(json.dumps(one(job["argv"]), default=str), flush=True)
    finally:
        os.environ.clear(); os.environ.update(saved)
"""


def resolve_with_sglang(argv: list[str], python: str | None = None, timeout: float = 120.0, env: dict | None = None) -> dict:
    """{"ok": bool, "stage": parse|resolve, "error_type", "error", "resolved": {...}} from the real resolver."""
    return resolve_many([{"argv": argv}], python=python, timeout=timeout, env=env)[0]


def resolve_many(jobs: list[dict], python: str | None = None, timeout: float = 600.0, env: dict | None = None) -> list[dict]:
    """Resolve several argument sets ({"argv": [...], "env": {...}}) in one SGLang import."""
    code = f"FIELDS = {FIELDS!r}\n" + _SCRIPT
    try:
        cp = subprocess.run([python or sys.executable, "-c", code], input=json.dumps(jobs), capture_output=True,
                            text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return [{"ok": None, "error_type": "Timeout", "error": f"SGLang's resolver did not answer in {timeout:g} s"}] * len(jobs)
    except OSError as exc:
        return [{"ok": None, "error_type": "OSError", "error": str(exc)}] * len(jobs)
    lines = [json.loads(ln) for ln in cp.stdout.splitlines() if ln.startswith("{")]
    if len(lines) < len(jobs):
        tail = (cp.stderr.strip().splitlines() or ["no output"])[-1]
        lines += [{"ok": None, "error_type": "NoResult", "error": f"rc {cp.returncode}: {tail}"}] * (len(jobs) - len(lines))
    return lines


def predicted_failure(result) -> bool:
    """Do our rules say SGLang stops while parsing or resolving (before the model load)?"""
    return any(f.status == Status.FAIL and f.data.get("stage") in ("parse", "resolve") for f in result.findings)


def compare(result, real: dict) -> Finding:
    """One finding: SGLang's resolver agrees with our rules, disagrees (and how), or could not run."""
    src = "python/sglang/srt/server_args.py::prepare_server_args + ServerArgs.resolve_once"
    if real.get("ok") is None:
        return Finding("sglang.resolver.unavailable", Status.INFO, f"SGLang's own resolver did not run: {real.get('error')}",
                       layer="workload", data={"source": src, "real": real})
    ours_fail = predicted_failure(result)
    diffs = []
    if real["ok"] and ours_fail:
        diffs.append("SGLang resolved the arguments, our rules predicted a parse/resolve failure")
    elif not real["ok"] and not ours_fail:
        diffs.append(f"SGLang failed ({real.get('error_type')}: {real.get('error')}), our rules predicted no parse/resolve failure")
    if real.get("ok"):
        for k in ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens", "max_running_requests"):
            if k in result.resolved and result.resolved[k] != real["resolved"].get(k):
                diffs.append(f"{k}: ours {result.resolved[k]!r}, SGLang {real['resolved'].get(k)!r}")
    if diffs:
        return Finding("sglang.resolver.disagree", Status.WARN, "SGLang's own resolver disagrees with gpudoctor's rules",
                       layer="workload", evidence=diffs, hint="trust SGLang; report the case so the rule is fixed",
                       data={"source": src, "real": real})
    what = "resolved the same values" if real["ok"] else f"fails the same way ({real.get('error_type')})"
    return Finding("sglang.resolver.agree", Status.OK, f"SGLang {real.get('version', '')} {what}".replace("  ", " "),
                   layer="workload", data={"source": src, "real": real})
