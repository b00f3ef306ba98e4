"""Ask SGLang itself: resolve the arguments with its own parser in a subprocess, and compare with our rules.

Runs `prepare_server_args(argv)`, `resolve_once()`, `check_server_args()` (server_args.py, arg_groups/) and the draft
worker's ModelConfig construction in the Python you name, under a deadline.
Kept small on purpose: it only runs where `import sglang` works (the target host, or the differential venv).
"""

from __future__ import annotations

import json
import subprocess
import sys

from gpudoctor.findings import Finding, Status
from gpudoctor.host import childpy
from gpudoctor.host.childpy import child_env

FIELDS = ("speculative_algorithm", "speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens",
          "max_running_requests", "page_size", "tp_size", "context_length", "attention_backend", "mem_fraction_static",
          "chunked_prefill_size", "speculative_draft_model_path", "kv_cache_dtype", "quantization", "attn_dp_size")
# Algorithms whose draft worker builds the draft's ModelConfig at the target's context length.
DRAFT_ALGOS = ("EAGLE", "EAGLE3", "STANDALONE", "FROZEN_KV_MTP", "DFLASH", "DSPARK")
# Device profiles the differential fakes (torch.cuda queries + nvidia-smi): what SGLang reads of the GPU.
DEVICES = {
    "h200": {"name": "NVIDIA H200", "capability": [9, 0], "memory_mib": 143771, "sms": 132, "count": 8},
    "rtx_pro_6000": {"name": "NVIDIA RTX PRO 6000 Blackwell Server Edition", "capability": [12, 0],
                     "memory_mib": 97887, "sms": 188, "count": 8},
    "b200": {"name": "NVIDIA B200", "capability": [10, 0], "memory_mib": 183359, "sms": 148, "count": 8},
}
# CUDA kernel packages a GPU host has and SGLang imports at module level; off-GPU they are stubs (never called).
STUB_PACKAGES = ("sgl_kernel",)
STUB_VERSIONS = {"sgl_kernel": "0.4.2", "flashinfer": "0.6.3"}
for _p in DEVICES.values():
    _p["stub_packages"] = list(STUB_PACKAGES)

_SCRIPT = r"""
import contextlib, io, json, logging, os, sys, time

DEVICE = json.loads(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1] else None

def fake_devices(dev):
    # Answer torch's device queries as the named GPU would (no GPU here); nvidia-smi is faked on PATH by the caller.
    import torch
    cap = tuple(dev["capability"])
    class Props:
        name = dev["name"]; total_memory = int(dev["memory_mib"]) << 20; major, minor = cap
        multi_processor_count = dev.get("sms", 132); uuid = "GPU-fake"; L2_cache_size = 50 << 20
        warp_size = 32; is_integrated = False; regs_per_multiprocessor = 65536
        max_threads_per_multi_processor = 2048; shared_memory_per_block_optin = 232448
    c = torch.cuda
    c.is_available = lambda: True
    c.device_count = lambda: int(dev.get("count", 8))
    c.get_device_capability = lambda d=None: cap
    c.get_device_name = lambda d=None: dev["name"]
    c.get_device_properties = lambda d=None: Props
    c.mem_get_info = lambda d=None: (Props.total_memory, Props.total_memory)
    c.current_device = lambda: 0
    c.is_initialized = lambda: True

class _Stub:
    # Stands in for a CUDA kernel library SGLang imports at module level; resolution never calls a kernel.
    def __init__(self, name): self.__name__ = name
    def __eq__(self, other): return isinstance(other, _Stub) and other.__name__ == self.__name__
    def __hash__(self): return hash(self.__name__)
    def __call__(self, *a, **k): raise RuntimeError(f"{self.__name__}: kernel stub called during resolution")
    def __getattr__(self, k):
        if k.startswith("__"): raise AttributeError(k)
        return _Stub(self.__name__ + "." + k)

def stub_kernel_packages(names):
    import importlib.abc, importlib.machinery, types
    class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, fullname, path, target=None):
            if fullname.split(".")[0] in names:
                return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
            return None
        def create_module(self, spec):
            m = types.ModuleType(spec.name)
            m.__path__ = []
            m.__version__ = STUB_VERSIONS.get(spec.name.split(".")[0], "0.0.0")
            m.__getattr__ = lambda k, n=spec.name: (_ for _ in ()).throw(AttributeError(k)) if k.startswith("__") else _Stub(n + "." + k)
            return m
        def exec_module(self, module):
            pass
    sys.meta_path.insert(0, Finder())

if DEVICE:
    fake_devices(DEVICE)
    stub_kernel_packages(set(DEVICE.get("stub_packages", ())))
    # flashinfer ships with every SGLang install on a GPU host (it is not importable here): say so through SGLang's
    # own override of platform facts, which get_default_attn_backend reads.
    from sglang.srt.runtime_context import override_platform
    override_platform(has_flashinfer=True).install()

def first_line(e):
    s = str(e).strip()
    return s.splitlines()[0] if s else ""

def one(job):
    out = {"stage": "parse"}
    t0 = time.perf_counter()
    try:
        from sglang.srt.server_args import prepare_server_args
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                sa = prepare_server_args(job["argv"])
        except SystemExit as e:
            out.update(ok=False, error_type="SystemExit", error=(err.getvalue().strip().splitlines() or [str(e.code)])[-1])
            return out
        logging.disable(logging.CRITICAL)
        out["stage"] = "resolve"
        sa.resolve_once()
        from sglang.srt.arg_groups.overrides import resolving_view
        v = resolving_view(sa)
        out["resolved"] = {k: getattr(v, k, None) for k in FIELDS}
        try:
            out["resolved"]["cuda_graph_max_bs_decode"] = v.cuda_graph_config.decode.max_bs
        except Exception:
            pass
        if job.get("check", True):
            out["stage"] = "check"
            sa.check_server_args()
        algo = v.speculative_algorithm
        if job.get("draft", True) and algo in DRAFT_ALGOS:
            # What the draft worker builds after the target has loaded (eagle_worker_v2.py, draft_worker_common.py):
            # the draft's ModelConfig at the target's context length.
            out["stage"] = "draft"
            from sglang.srt.arg_groups.model_override_base import model_config_of
            from sglang.srt.configs.model_config import ModelConfig
            target = model_config_of(sa)
            dm = ModelConfig.from_server_args(sa, model_path=v.speculative_draft_model_path,
                                              model_revision=v.speculative_draft_model_revision,
                                              is_draft_model=True, context_length=target.context_len)
            out["resolved"]["draft_context_len"] = dm.context_len
        try:
            from sglang.srt.arg_groups.model_override_base import model_config_of
            out["resolved"]["context_len"] = model_config_of(sa).context_len
        except Exception:
            pass
        out["ok"] = True
    except BaseException as e:
        out.update(ok=False, error_type=type(e).__name__, error=first_line(e))
    finally:
        out["seconds"] = time.perf_counter() - t0
    return out

try:
    import sglang
    VERSION = sglang.__version__
except Exception as e:
    VERSION = None
jobs = json.loads(sys.stdin.read())
for job in jobs:
    saved = dict(os.environ)
    os.environ.update(job.get("env") or {})
    try:
        res = one(job)
        res["version"] = VERSION
        print(json.dumps(res, default=str), flush=True)
    finally:
        os.environ.clear(); os.environ.update(saved)
"""


def resolve_with_sglang(argv: list[str], python: str | None = None, timeout: float = 120.0, env: dict | None = None) -> dict:
    """{"ok": bool, "stage": parse|resolve, "error_type", "error", "resolved": {...}} from the real resolver."""
    return resolve_many([{"argv": argv}], python=python, timeout=timeout, env=env)[0]


def resolve_many(jobs: list[dict], python: str | None = None, timeout: float = 600.0, env: dict | None = None,
                 device: str | None = None) -> list[dict]:
    """Resolve several argument sets ({"argv": [...], "env": {...}}) in one SGLang import.

    Stages: parse (argparse), resolve (ServerArgs.resolve_once), check (check_server_args, which the engine runs
    next), draft (the draft worker's ModelConfig at the target's context length). With `device` (a DEVICES key),
    torch's CUDA queries and nvidia-smi answer as that GPU would, so SGLang's GPU-derived defaults are those of the
    real machine although none is present.
    """
    import os
    import tempfile

    code = f"FIELDS = {FIELDS!r}\nDRAFT_ALGOS = {DRAFT_ALGOS!r}\nSTUB_VERSIONS = {STUB_VERSIONS!r}\n" + _SCRIPT
    extra, tail = {}, []  # the environment is the allow-listed part of `env` (default this process's)
    with tempfile.TemporaryDirectory(prefix="gpudoctor-fakesmi-") as tmp:
        if device is not None:
            prof = DEVICES[device]
            smi = os.path.join(tmp, "nvidia-smi")
            with open(smi, "w") as f:
                f.write("#!/bin/sh\n"
                        f"for i in $(seq 1 {prof['count']}); do echo {prof['memory_mib']}; done\n")
            os.chmod(smi, 0o755)
            extra["PATH"] = tmp + os.pathsep + child_env(env)["PATH"]
            tail.append(json.dumps(prof))
        try:
            cp = childpy.run([python or sys.executable], "-c", code, *tail, base=env, extra=extra,
                             input=json.dumps(jobs), capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return [{"ok": None, "error_type": "Timeout", "error": f"SGLang's resolver did not answer in {timeout:g} s"}] * len(jobs)
        except OSError as exc:
            return [{"ok": None, "error_type": "OSError", "error": str(exc)}] * len(jobs)
    lines = [json.loads(ln) for ln in cp.stdout.splitlines() if ln.startswith("{")]
    if len(lines) < len(jobs):
        tail = (cp.stderr.strip().splitlines() or ["no output"])[-1]
        lines += [{"ok": None, "error_type": "NoResult", "error": f"rc {cp.returncode}: {tail}"}] * (len(jobs) - len(lines))
    return lines


# Our stages that SGLang's run reaches here: argparse, resolve_once, check_server_args ("launch"), the draft worker.
EARLY_STAGES = ("parse", "resolve", "launch", "draft")
# Resolved values compared where both accept (None on our side: not predicted, not compared).
COMPARED = ("speculative_algorithm", "speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens",
            "max_running_requests", "mem_fraction_static", "chunked_prefill_size", "page_size", "context_len",
            "attention_backend")


def predicted_failure(result) -> bool:
    """Do our rules say SGLang stops before the weights load (parse, resolve, check_server_args, draft config)?"""
    return bool(early_fails(result))


def early_fails(result) -> list[str]:
    return sorted({f.id for f in result.findings if f.status == Status.FAIL and f.data.get("stage") in EARLY_STAGES})


def judge(result, real: dict, skip: tuple[str, ...] = ()) -> tuple[str, list[str]]:
    """(kind, details): kind is agree | false_accept | false_reject | stage | values | not_run.

    false_accept: SGLang stops (parse/resolve/check/draft) and our verdict is not invalid; stage: both reject but we
    place the failure later (load/request) than SGLang raises it; false_reject: SGLang passes every stage run and we
    predict a failure in one of them; values: both accept, resolved values differ.
    """
    if real.get("ok") is None or real.get("error_type") in ("ModuleNotFoundError", "ImportError"):
        return "not_run", [str(real.get("error"))]  # the reference environment, not the arguments
    early = early_fails(result)
    if not real["ok"]:
        if early:
            return "agree", []
        if result.verdict == "invalid":
            return "stage", [f"SGLang raises at {real.get('stage')} ({real.get('error_type')}); ours only later"]
        return "false_accept", [f"SGLang fails at {real.get('stage')} ({real.get('error_type')}: {real.get('error')}); "
                                f"our verdict {result.verdict}"]
    if early:
        return "false_reject", [f"SGLang passes; we predict {', '.join(early)}"]
    diffs = []
    got = real.get("resolved") or {}
    for k in COMPARED:
        if k in skip:
            continue
        ours = result.resolved.get(k)
        if ours is not None and k in got and got[k] != ours:
            diffs.append(f"{k}: ours {ours!r}, SGLang {got[k]!r}")
    return ("values" if diffs else "agree"), diffs


def compare(result, real: dict) -> Finding:
    """One finding: SGLang's resolver agrees with our rules, disagrees (and how), or could not run."""
    src = "python/sglang/srt/server_args.py::prepare_server_args + ServerArgs.resolve_once + check_server_args"
    kind, diffs = judge(result, real)
    if kind == "not_run":
        return Finding("sglang.resolver.unavailable", Status.INFO, f"SGLang's own resolver did not run: {real.get('error')}",
                       layer="workload", data={"source": src, "stage": "advice", "real": real})
    if kind != "agree":
        return Finding("sglang.resolver.disagree", Status.WARN, f"SGLang's own resolver disagrees with gpudoctor's rules ({kind})",
                       layer="workload", evidence=diffs, hint="trust SGLang; report the case so the rule is fixed",
                       data={"source": src, "stage": "advice", "real": real})
    what = "resolved the same values" if real["ok"] else f"fails the same way ({real.get('error_type')})"
    return Finding("sglang.resolver.agree", Status.OK, f"SGLang {real.get('version', '')} {what}".replace("  ", " "),
                   layer="workload", data={"source": src, "stage": "advice", "real": real})
