"""Which Python the deep tier measures with (#33): one that has torch, found the way the user's serving stack runs.

In order: `--deep-python PATH` (policy `torch_python`), the interpreter of a running SGLang, vLLM or transformers
server (its argv[0], or its script's `#!` line), the inventory's `policy: checks: fabric.deep.figure: {python: PATH}`
(policy `deep_python`), `python3` on PATH, the target's own python (gpudoctor's, as installed: usually no torch). The
first with torch is used; where none has it the target's own python runs the CUDA driver API through ctypes (copies)
and the rest is marked not measured, with the candidates tried as the reason.

One probe on the target (stdlib, `python -I -S`) does the search and asks each candidate whether torch is installed
(importlib's find_spec and the distribution's version: torch is never imported for that), isolated (`-I`, a minimal
environment, cwd /). An interpreter found through another process (#40) is asked only when root may trust it
(files/trust.py: it, every directory above it and every link on the way owned by root or by this user and writable by
no one else); otherwise it is not run at all, and its candidate says why — running it as its owner would still
measure with code that user controls, and the deep figures decide whether a host goes back to service. Its answer is
in a snapshot's transcript, so a replay picks the interpreter the recording picked.
"""

from __future__ import annotations

import json
from pathlib import Path

from gpudoctor.gather.context import GatherContext
from gpudoctor.host import Host
from gpudoctor.host.childpy import python_argv
from gpudoctor.host.replay import not_recorded

# argv: deadline_s, then the candidates to try before and after the serving processes as JSON
# {"first": [[python, source], ...], "then": [[python, source], ...], "servers": whether to look for them}.
# After files/trust.py's and host/childpy.py's text: the same trust test and child python as everywhere.
_SEARCH = r"""
import json, os, shutil, subprocess, sys, time
dl = time.monotonic() + float(sys.argv[1])
spec = json.loads(sys.argv[2])
ASK = ("import importlib.util as u, importlib.metadata as m\n"
       "s = u.find_spec('torch')\n"
       "print(m.version('torch') if s else '')")

def rd(path, n=65536):
    try:
        with open(path, "rb") as f:
            return f.read(n)
    except OSError:
        return None

def is_py(p):
    return os.path.basename(p or "").startswith("python")

def shebang(path):
    head = rd(path, 256) or b""
    if not head.startswith(b"#!"):
        return None
    words = head[2:].split(b"\n", 1)[0].decode("utf-8", "replace").split()
    if words and os.path.basename(words[0]) == "env" and len(words) > 1:
        return shutil.which(words[1])
    return words[0] if words and is_py(words[0]) else None

def role(args):
    text = " ".join(args)
    names = [os.path.basename(a) for a in args[:3]]
    if "sglang.launch_server" in text or "sglang.srt" in text or ("sglang" in names and "serve" in args):
        return "SGLang"
    if "vllm.entrypoints" in text or ("vllm" in names and "serve" in args):
        return "vLLM"
    if ("transformers" in names or "transformers-cli" in names or "transformers.cli" in text) and "serve" in args:
        return "transformers serve"
    return None

def servers():
    found = []
    me = os.getpid()
    for d in sorted(os.listdir("/proc"), key=lambda x: int(x) if x.isdigit() else 0):
        if not d.isdigit() or int(d) in (me, os.getppid()):
            continue
        raw = rd("/proc/%s/cmdline" % d)
        if not raw:
            continue
        args = [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]
        what = role(args)
        if not what:
            continue
        py = None
        if is_py(args[0]) and os.path.isabs(args[0]):
            py = args[0]
        elif os.path.isabs(args[0]):
            py = shebang(args[0])
        if py is None:
            try:
                exe = os.readlink("/proc/%s/exe" % d)
            except OSError:
                exe = None
            py = exe if is_py(exe) else None
        if py:  # another user's process names it: used only where root may trust it
            found.append([py, "the %s server's interpreter (pid %s)" % (what, d), untrusted(py)])
    return found

cands = list(spec.get("first") or []) + (servers() if spec.get("servers", True) else []) + list(spec.get("then") or [])
out, seen = [], set()
for py, source, *why in cands:
    if py in seen:
        continue
    seen.add(py)
    rec = {"python": py, "source": source, "torch": None}
    full = py if os.path.isabs(py) else shutil.which(py)
    left = dl - time.monotonic()
    if full is not None and os.access(full, os.X_OK):
        rec["path"] = full
    if why and why[0]:
        rec["error"] = ("not run: %s; not trusted as root (--deep-python or the inventory's policy names a python "
                        "to trust)" % why[0])
    elif full is None or not os.access(full, os.X_OK):
        rec["error"] = "not found"
    elif left < 0.5:
        rec["error"] = "not asked: the search ran out of time"
    else:
        try:
            r = run([full], "-c", ASK, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    timeout=min(left, 15.0))
            if r.returncode == 0:
                rec["torch"] = r.stdout.decode("utf-8", "replace").strip() or None
                if not rec["torch"]:
                    rec["error"] = "no torch installed"
            else:
                rec["error"] = "rc %d: %s" % (r.returncode, r.stderr.decode("utf-8", "replace").strip()[-200:])
        except (OSError, subprocess.TimeoutExpired) as e:
            rec["error"] = type(e).__name__
    out.append(rec)
    if rec["torch"]:
        break
print(json.dumps({"candidates": out}))
"""
PROBE = "\n".join(Path(__file__).parent.parent.joinpath(f).read_text() for f in ("files/trust.py", "host/childpy.py")) \
    + _SEARCH


def _as_list(python) -> list[str]:
    return [python] if isinstance(python, str) else list(python)


def choose(host: Host, ctx: GatherContext) -> dict:
    """{"python": argv prefix, "source": why this one, "torch": version or None ("unknown" where a snapshot from
    before #33 holds no search), "candidates": what was tried}."""
    pol = ctx.policy
    explicit = pol.get("torch_python")
    own = list(host.python)
    first = [[p, "--deep-python"] for p in _as_list(explicit)[:1]] if explicit else []
    then = ([[str(pol["deep_python"]), "the inventory's policy"]] if pol.get("deep_python") else []) + \
        [["python3", "python3 on PATH"]]
    # An explicit --deep-python is used as given (its answer says whether it has torch); otherwise the search.
    spec = json.dumps({"first": first, "then": [], "servers": False} if explicit else {"first": [], "then": then},
                      sort_keys=True, separators=(",", ":"))
    res = host.run(python_argv(own, "-c", PROBE, "20", spec, site=False), timeout=max(ctx.timeout, 25.0))
    if not_recorded(res):  # a snapshot from before #33: the interpreter it ran is the one its policy named
        return {"python": _as_list(explicit) if explicit else own, "source": "--deep-python" if explicit else
                "the target's own", "torch": "unknown", "candidates": []}
    try:
        cands = json.loads(res.stdout.strip().splitlines()[-1])["candidates"]
    except (ValueError, IndexError, KeyError, TypeError):
        cands = []
        said = (res.stderr.strip() or res.stdout.strip()).splitlines()[-1:] or ["no output"]
        why = (f"the search for a python with torch did not answer (rc {res.rc}"
               + (", timed out" if res.timed_out else "") + f"): {said[0][:200]}")
    else:
        why = None
    hit = next((c for c in cands if c.get("torch")), None)
    if explicit:
        return {"python": _as_list(explicit), "source": "--deep-python", "torch": hit and hit["torch"],
                "candidates": cands, **({} if hit else {"why": why or f"--deep-python {_as_list(explicit)[0]}: "
                                         f"{(cands[0].get('error') if cands else None) or 'no torch'}"})}
    if hit is not None:  # the interpreter as found (python3 on PATH: the file it resolved to)
        return {"python": [hit.get("path") or hit["python"]], "source": hit["source"], "torch": hit["torch"],
                "candidates": cands}
    tried = "; ".join(f"{c['python']} ({c['source']}): {c.get('error') or 'no torch'}" for c in cands)
    return {"python": own, "source": "gpudoctor's own python (no python with torch found)", "torch": None,
            "candidates": cands, "why": why or f"no python with torch: tried {tried or 'nothing'}"}


def describe(pick: dict) -> str:
    """One evidence line: which python measured, and why that one."""
    py = " ".join(pick["python"])
    t = pick.get("torch")
    if t == "unknown":  # replayed from a snapshot taken before the search: its transcript names the interpreter
        return f"python: {pick['source']}, as the snapshot recorded it (taken before gpudoctor searched for torch)"
    has = f"torch {t}" if t and t != "unknown" else ("torch not checked" if t == "unknown" else "no torch")
    # An interpreter another process named but root may not trust is said, so nobody wonders why it was not used.
    refused = [c for c in pick.get("candidates") or [] if "not trusted as root" in (c.get("error") or "")]
    skipped = "".join(f"; {c['python']} ({c['source']}) {c['error'].split('; not trusted as root')[0]}: "
                      "not trusted as root" for c in refused[:2])
    return f"python {py} ({pick['source']}; {has}){skipped}"
