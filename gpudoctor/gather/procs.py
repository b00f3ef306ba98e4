"""Workload facts: every process holding a GPU device node (its open file descriptors), who it is, where it runs,
whether gpudoctor's bench started it (and whether its campaign is gone), and what listens on the serving port(s).

One program on the target scans /proc (bounded: MAX_PIDS processes, the deadline). gpudoctor's own probes (the
programs of this very gather: siblings and children of the probe's parent) are left out. The memory each process
holds comes from NVML (the driver facts' processes); the checks join the two by PID.

facts["procs"] = {
  "self_user": 0, "hostname": "...", "scanned": 312, "truncated": false,
  "unreadable": {"4242": [1000, "python3"]},   # processes whose fds this user may not read (uid, comm)
  "holders": {"4242": {"uid": 0, "user": "root", "comm": "python3", "cmdline": "...", "ppid": 1, "start": 123,
                       "nodes": ["/dev/nvidia0", ...], "cgroup": "/docker/…", "container": "docker 3f2a1b…",
                       "other_pid_ns": false, "bench": {"run": ..., "label": ..., "owner": ..., "orphan": true}}},
  "listeners": {"30000": [{"pid": 4242, "uid": 0, "user": "root", "comm": "python3", "cmdline": "...", "bench": ...}]},
  "ports": [30000],
}
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from urllib.parse import urlparse

from gpudoctor.gather.marker import PREFIX
from gpudoctor.gather.context import GatherContext
from gpudoctor.host import Host, environ
from gpudoctor.host.childpy import python_argv
from gpudoctor.host.environ import redact_cmdline
from gpudoctor.host.replay import not_recorded

MAX_PIDS = 20000
DEFAULT_PORT = 30000  # SGLang's default serving port

# argv: deadline seconds, node prefix (/dev/nvidia, under a test root), max pids, marker prefix, ports...
_PY_HEAD = r"""
import json, os, pwd, socket, sys, time
"""
# Its first line stays the first: a snapshot from before finds this probe by it (host/replay.py). host/environ.py's
# text follows (redact_argv: the one rule for secret-looking names), so a command line is redacted where it is read.
_PY_BODY = r"""
dl, prefix, maxp, mark = float(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
ports = [int(p) for p in sys.argv[5:]]
end = time.monotonic() + dl
me, parent = os.getpid(), os.getppid()
host = socket.gethostname()
def rd(path, n=65536):
    with open(path, "rb") as f:
        return f.read(n)
def stat(pid):
    try:
        s = rd("/proc/%s/stat" % pid).decode("ascii", "replace")
        f = s.rsplit(")", 1)[1].split()
        return int(f[1]), int(f[19]), s[s.index("(") + 1:s.rindex(")")]
    except (OSError, ValueError, IndexError):
        return None
def uid_of(pid):
    try:
        for ln in rd("/proc/%s/status" % pid).decode("ascii", "replace").splitlines():
            if ln.startswith("Uid:"):
                return int(ln.split()[2])
    except (OSError, ValueError, IndexError):
        pass
    return None
def user(uid):
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, TypeError):
        return None
try:
    myns = os.readlink("/proc/self/ns/pid")
except OSError:
    myns = None
socks = {}
for port in ports:
    for tbl in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = rd(tbl, 4 << 20).decode("ascii", "replace").splitlines()[1:]
        except OSError:
            continue
        for ln in lines:
            f = ln.split()
            if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
                socks["socket:[%s]" % f[9]] = port
out = {"self_user": os.geteuid(), "hostname": host, "scanned": 0, "truncated": False, "unreadable": {}, "holders": {},
       "listeners": {str(p): [] for p in ports}, "ports": ports}
found_socks = set()
info = {}
for name in os.listdir("/proc"):
    if not name.isdigit():
        continue
    if out["scanned"] >= maxp or time.monotonic() > end:
        out["truncated"] = True
        break
    out["scanned"] += 1
    pid = int(name)
    if pid == me:
        continue
    try:
        fds = os.listdir("/proc/%d/fd" % pid)
    except PermissionError:
        if len(out["unreadable"]) < 5000:
            st = stat(pid)
            u = uid_of(pid)
            out["unreadable"][name] = [u, st[2] if st else None, user(u)]
        continue
    except OSError:
        continue
    nodes, lports = set(), set()
    for fd in fds:
        try:
            t = os.readlink("/proc/%d/fd/%s" % (pid, fd))
        except OSError:
            continue
        if t.startswith(prefix):
            nodes.add("/dev/nvidia" + t[len(prefix):])
        elif t in socks:
            lports.add(socks[t])
            found_socks.add(t)
    if nodes or lports:
        info[pid] = (sorted(nodes), sorted(lports))
def ancestry(pid):
    seen = []
    while pid > 1 and len(seen) < 64:
        st = stat(pid)
        if not st:
            break
        seen.append(pid)
        pid = st[0]
    return seen
for pid, (nodes, lports) in info.items():
    chain = ancestry(pid)
    if parent in chain:
        if not lports:
            continue  # this gather's own probes (cuInit, nvidia-smi) or the process that runs them
        nodes = []  # a server it started still listens: kept as a listener (release asks whose it is)
    st = stat(pid)
    d = {"uid": uid_of(pid), "comm": st[2] if st else None, "ppid": st[0] if st else None,
         "start": st[1] if st else None, "nodes": nodes}
    d["user"] = user(d["uid"])
    try:
        args = [a.decode("utf-8", "replace") for a in rd("/proc/%d/cmdline" % pid, 4096).split(b"\0")]
        d["cmdline"] = " ".join(redact_argv(args)).strip()[:1000]
    except OSError:
        d["cmdline"] = None
    try:
        cg = rd("/proc/%d/cgroup" % pid).decode("utf-8", "replace").splitlines()
        d["cgroup"] = next((c.split(":", 2)[2] for c in cg if c.startswith("0::")), cg[0].split(":", 2)[2] if cg else None)
    except (OSError, IndexError):
        d["cgroup"] = None
    try:
        d["other_pid_ns"] = myns is not None and os.readlink("/proc/%d/ns/pid" % pid) != myns
    except OSError:
        d["other_pid_ns"] = None
    try:
        env = rd("/proc/%d/environ" % pid, 1 << 20).split(b"\0")
        d["marker"] = dict(e.decode("utf-8", "replace").split("=", 1) for e in env if e.startswith(mark.encode()) and b"=" in e)
    except OSError:
        d["marker"] = None
    parent_cmd = None
    if d["ppid"]:
        try:
            parent_cmd = rd("/proc/%d/cmdline" % d["ppid"], 4096).split(b"\0")
        except OSError:
            pass
    d["bench_wrapper"] = bool(parent_cmd and b"gpudoctor-bench-server" in parent_cmd[:4])
    owner = (d["marker"] or {}).get(mark + "OWNER")
    if owner:
        h, _, rest = owner.rpartition(":")
        h, _, opid = h.rpartition(":")
        if h == host and opid.isdigit():
            ost = stat(int(opid))
            d["owner_alive"] = bool(ost and str(ost[1]) == rest)
        else:
            d["owner_alive"] = None
    if nodes:
        out["holders"][str(pid)] = d
    for p in lports:
        out["listeners"][str(p)].append(dict(d, pid=pid))
for s, p in socks.items():
    if s not in found_socks:
        out["listeners"][str(p)].append({"pid": None, "socket": s})
print(json.dumps(out))
"""



def _code_only(path: str) -> str:
    """A module's code without its docstrings and comments (they name the secrets it redacts, and a snapshot keeps
    the probe's text)."""
    tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    for node in [tree, *ast.walk(tree)]:
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
    return ast.unparse(tree) + "\n"


_PY_PROCS = _PY_HEAD + _code_only(environ.__file__) + _PY_BODY

_CONTAINER = [(re.compile(r"docker[-/]([0-9a-f]{12,64})"), "docker"), (re.compile(r"libpod-([0-9a-f]{12,64})"), "podman"),
              (re.compile(r"cri-containerd-([0-9a-f]{12,64})"), "containerd"), (re.compile(r"crio-([0-9a-f]{12,64})"), "cri-o"),
              (re.compile(r"lxc\.payload\.([^/]+)"), "lxc"), (re.compile(r"^/lxc/([^/]+)"), "lxc"),
              (re.compile(r"(kubepods[^/]*)"), "kubernetes")]


def container_of(cgroup: str | None) -> str | None:
    """What a process's cgroup path says about its container: "docker 3f2a1b4c5d6e", "lxc 200", ... or None."""
    for rx, kind in _CONTAINER:
        m = rx.search(cgroup or "")
        if m:
            v = m.group(1)
            return f"{kind} {v[:12] if kind != 'lxc' and kind != 'kubernetes' else v}"
    return None


def serving_ports(ctx: GatherContext) -> list[int]:
    """The ports a server for this host is expected on: --sglang-url's, the policy's, else SGLang's default."""
    pol = ((ctx.policy or {}).get("checks") or {}).get("workload.port.serving") or {}
    ports = [int(p) for p in (pol.get("ports") or ([pol["port"]] if pol.get("port") else [])) if str(p).isdigit()]
    if ctx.sglang_url:
        u = urlparse(ctx.sglang_url)
        try:
            ports.append(u.port or (443 if u.scheme == "https" else 80))
        except ValueError:
            pass
    return sorted(set(ports)) or [DEFAULT_PORT]


def probe_argv(python: list[str], ctx: GatherContext, root: str = "") -> list[str]:
    """The process scan's command line (gather/prestart.py starts the same one at CLI entry)."""
    return python_argv(python, "-c", _PY_PROCS, str(min(ctx.timeout, 5.0)), root + "/dev/nvidia", str(MAX_PIDS), PREFIX,
            *map(str, serving_ports(ctx)), site=False)


def gather(host: Host, ctx: GatherContext) -> dict | None:
    t = min(ctx.timeout, 5.0)
    res = host.run(probe_argv(host.python, ctx, getattr(host, "root", "") or ""), timeout=t + 2.0)
    if not_recorded(res):
        return None  # a snapshot from a gpudoctor that did not list processes
    try:
        out = json.loads(res.stdout) if res.ok else None
    except ValueError:
        out = None
    if out is None:
        return {"error": "process scan " + res.describe()}
    for d in [*out["holders"].values(), *(x for v in out["listeners"].values() for x in v)]:
        if d.get("pid", 0) is not None:
            d["container"] = container_of(d.get("cgroup"))
            d["cmdline"] = redact_cmdline(d.get("cmdline"))  # a snapshot from before #47 recorded it whole
            m = d.pop("marker", None)
            d["bench"] = None if not (m or d.get("bench_wrapper")) else {
                "run": (m or {}).get("GPUDOCTOR_BENCH_RUN"), "label": (m or {}).get("GPUDOCTOR_BENCH_LABEL"),
                "owner": (m or {}).get("GPUDOCTOR_BENCH_OWNER"), "owner_alive": d.pop("owner_alive", None),
                "wrapper": d.get("bench_wrapper", False)}
            d.pop("owner_alive", None)
    return out
