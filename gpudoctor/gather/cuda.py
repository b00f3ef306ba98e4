"""CUDA layer facts: raw cuInit / cuDeviceGetCount / cuDriverGetVersion through ctypes, in a fresh process with a deadline."""

from __future__ import annotations

import json

from gpudoctor.gather.context import GatherContext
from gpudoctor.host import Host

from gpudoctor.cuda_probe import PROBE  # the probe text, shared with gpudoctor/entry.py
from gpudoctor.host.childpy import python_argv


def gather(host: Host, ctx: GatherContext) -> dict:
    res = host.run(python_argv(host.python, "-c", PROBE, site=False), timeout=ctx.timeout)
    out = {"command": "python3 -c <cuInit probe>", "rc": res.rc, "timed_out": res.timed_out, "timeout_s": res.timeout_s,
           "duration_s": round(res.duration_s, 4)}
    if res.timed_out:
        return out
    try:
        out.update(json.loads(res.stdout.strip().splitlines()[-1]))
    except (ValueError, IndexError):
        out["probe_error"] = (res.stderr.strip() or res.stdout.strip())[-500:] or f"rc {res.rc}, no output"
    return out
