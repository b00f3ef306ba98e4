"""Workload facts: /dev/shm as tmpfs and its size; SGLang readiness when a URL is configured."""

from __future__ import annotations

import json

from gpudoctor.gather.context import GatherContext
from gpudoctor.host import Host
from gpudoctor.host.childpy import python_argv


def parse_mounts(text: str) -> list[dict]:
    """/proc/mounts → list of {source, target, fstype, options}; the last mount of a target wins."""
    out = []
    for ln in (text or "").splitlines():
        parts = ln.split()
        if len(parts) >= 4:
            target = parts[1].replace("\\040", " ")
            out.append({"source": parts[0], "target": target, "fstype": parts[2], "options": parts[3]})
    return out


def mount_of(mounts: list[dict], path: str) -> dict | None:
    """The mount that holds `path`: the longest matching target, the last one mounted on it."""
    best = None
    for m in mounts:
        t = m["target"].rstrip("/") or "/"
        if path == t or path.startswith(t + "/") or t == "/":
            if best is None or len(t) >= len(best["target"].rstrip("/") or "/"):
                best = m
    return best


_READY = r"""
import json, sys, time, urllib.request
url = sys.argv[1].rstrip("/")
out = {}
for ep in ("/health", "/model_info"):
    t = time.perf_counter()
    try:
        with urllib.request.urlopen(url + ep, timeout=float(sys.argv[2])) as r:
            body = r.read(65536).decode("utf-8", "replace")
            out[ep] = {"status": r.status, "body": body[:2000], "seconds": round(time.perf_counter() - t, 4)}
    except Exception as e:
        code = getattr(e, "code", None)
        out[ep] = {"status": code, "error": str(e)[:300], "seconds": round(time.perf_counter() - t, 4)}
print(json.dumps(out))
"""


def gather(host: Host, ctx: GatherContext) -> dict:
    t = min(ctx.timeout, 3.0)
    mounts, shm_vfs = host.batch([("read", "/proc/mounts"), ("statvfs", "/dev/shm")], t)
    ml = parse_mounts(mounts.text or "")
    shm = mount_of(ml, "/dev/shm") if mounts.ok else None
    out = {"mounts_error": mounts.error, "shm": {"mount": shm, "statvfs": shm_vfs}}
    if ctx.sglang_url:
        res = host.run(python_argv(host.python, "-c", _READY, ctx.sglang_url, str(min(ctx.timeout, 5.0))),
                       timeout=ctx.timeout)
        try:
            out["sglang"] = {"url": ctx.sglang_url, **json.loads(res.stdout)}
        except ValueError:
            out["sglang"] = {"url": ctx.sglang_url, "error": res.describe()}
    return out
