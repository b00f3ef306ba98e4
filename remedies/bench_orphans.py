"""Remedy workload.bench.orphan: stop the inference servers gpudoctor's bench started and left behind (their campaign
is gone), so their GPU memory and port are free again — and never anything else.

Guards, each checked again on the target at the moment of the signal (a PID can be reused between plan and apply):
the process still has the start time it had when planned; its environment still carries the same
GPUDOCTOR_BENCH_OWNER; that owner (PID + start time, on this machine) is still gone. A process without the marker —
a stranger's job, however much memory it holds — is refused by name. The signal goes to the server's process group
(the bench starts each server in its own session) only when every member of the group carries the marker or is the
bench's own wrapper; otherwise to the process alone. SIGTERM, then SIGKILL after `stop_s` (default 10 s). Verify
re-lists the processes: the PID must be gone. There is nothing to roll back (a stopped process is not restarted).
"""

from __future__ import annotations

import json

from gpudoctor.gather.marker import ENV_OWNER
from gpudoctor.errors import RemedyError
from gpudoctor.findings import Finding, Status
from gpudoctor.host.childpy import python_argv
from gpudoctor.remedy import Change, Remedy, RemedyContext

from .common import target_name

ID = "workload.bench.orphan"

# argv: stop seconds, then triples pid start owner. Prints {"pid": {"stopped": bool, "why": str, "group": bool}}.
_PY_STOP = r"""
import json, os, signal, sys, time
stop_s = float(sys.argv[1])
args = sys.argv[2:]
OWNER = "GPUDOCTOR_BENCH_OWNER"
def stat(pid):
    try:
        s = open("/proc/%d/stat" % pid, "rb").read().decode("ascii", "replace")
        f = s.rsplit(")", 1)[1].split()
        return f[0], int(f[2]), int(f[19])
    except (OSError, ValueError, IndexError):
        return None
def marker(pid):
    try:
        env = open("/proc/%d/environ" % pid, "rb").read().split(b"\0")
    except OSError:
        return None
    for e in env:
        if e.startswith(OWNER.encode() + b"="):
            return e.split(b"=", 1)[1].decode("utf-8", "replace")
    return None
def alive(pid, start):
    st = stat(pid)
    return bool(st and st[2] == start and st[0] not in ("Z", "X"))
def wrapper(pid):
    try:
        return b"gpudoctor-bench-server" in open("/proc/%d/cmdline" % pid, "rb").read().split(b"\0")[:4]
    except OSError:
        return False
out = {}
for i in range(0, len(args), 3):
    pid, start, owner = int(args[i]), int(args[i + 1]), args[i + 2]
    st = stat(pid)
    if not st or st[2] != start:
        out[str(pid)] = {"stopped": False, "gone": True, "why": "already gone (or its PID now belongs to another process)"}
        continue
    if marker(pid) != owner:
        out[str(pid)] = {"stopped": False, "why": "its environment no longer carries the campaign's marker: not ours"}
        continue
    h, _, ostart = owner.rpartition(":")
    h, _, opid = h.rpartition(":")
    if opid.isdigit() and ostart.isdigit() and alive(int(opid), int(ostart)):
        out[str(pid)] = {"stopped": False, "why": "its campaign (pid %s) is running again" % opid}
        continue
    pgid = st[1]
    members = []
    for n in os.listdir("/proc"):
        if n.isdigit():
            s2 = stat(int(n))
            if s2 and s2[1] == pgid and s2[0] not in ("Z", "X"):
                members.append(int(n))
    group = all(marker(m) == owner or wrapper(m) for m in members)
    def dead():
        if group:
            return not any(stat(m) and stat(m)[0] not in ("Z", "X") for m in members)
        return not alive(pid, start)
    how = None
    for sig, wait in ((signal.SIGTERM, stop_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig) if group else os.kill(pid, sig)
        except ProcessLookupError:
            break
        except PermissionError as e:
            how = "not permitted to signal it (%s)" % e.strerror
            break
        end = time.monotonic() + wait
        while time.monotonic() < end and not dead():
            time.sleep(0.05)
        if dead():
            how = "SIGTERM" if sig == signal.SIGTERM else "SIGKILL"
            break
    out[str(pid)] = {"stopped": dead(), "why": how or "still running after SIGKILL", "group": group,
                     "members": members}
print(json.dumps(out))
"""


class StopOrphanServers(Remedy):
    id = ID
    fixes = ("workload.bench.orphan",)
    summary = "stop inference servers gpudoctor's bench left running after their campaign ended"

    def plan(self, facts: dict, ctx: RemedyContext) -> Change | None:
        from gpudoctor.checks.workload_hygiene import bench_orphan, gpu_processes

        from .common import run_check

        orphans = [f for f in run_check(bench_orphan, facts) if f.status == Status.WARN and f.data.get("pid")]
        ours = {f.data["pid"] for f in orphans}
        strangers = [p for p in gpu_processes(facts) if p["pid"] not in ours and not p.get("bench")]
        if not orphans:
            if strangers:
                names = "; ".join(f"pid {p['pid']} ({p['user'] or p['uid']}) {(p['command'] or '?')[:60]}"
                                  for p in strangers[:5])
                return self.refuse(f"not stopping {names}: not a server gpudoctor's bench started (no "
                                   f"{ENV_OWNER} in its environment); stop it yourself if you own it")
            return None
        rows = [f"pid {f.data['pid']}  {f.data.get('label')}  run {f.data.get('run')}  "
                f"{f.data.get('used_mib') or 0} MiB  owner {f.data.get('owner')}" for f in orphans]
        diff = ("--- processes (before)\n+++ processes (after)\n" + "".join(f"-{r}\n" for r in rows)
                + (f"  (left alone, not ours: {', '.join(str(p['pid']) for p in strangers)})\n" if strangers else ""))
        stop_s = float(ctx.options.get("stop_s", 10.0))
        return Change(ID, target_name(facts), f"stop {len(orphans)} server(s) left by an ended gpudoctor bench "
                      f"campaign: pid {', '.join(str(f.data['pid']) for f in orphans)}", diff=diff,
                      commands=[f"kill -TERM -- -PGID (pid {f.data['pid']}'s group), SIGKILL after {stop_s:g} s"
                                for f in orphans], risk="medium", fixes=[f.key for f in orphans],
                      data={"servers": [{"pid": f.data["pid"], "start": f.data.get("start"),
                                         "owner": f.data.get("owner")} for f in orphans], "stop_s": stop_s})

    def apply(self, host, change: Change, ctx: RemedyContext) -> dict:
        servers = [s for s in change.data["servers"] if s.get("start") is not None and s.get("owner")]
        if not servers:
            raise RemedyError("no server with a recorded start time and owner to stop")
        argv = python_argv(host.python, "-c", _PY_STOP, str(change.data.get("stop_s", 10.0)))
        for s in servers:
            argv += [str(s["pid"]), str(s["start"]), s["owner"]]
        res = host.run(argv, timeout=float(change.data.get("stop_s", 10.0)) * len(servers) + 15.0)
        try:
            got = json.loads(res.stdout) if res.ok else None
        except ValueError:
            got = None
        if got is None:
            raise RemedyError("stopping the servers failed: " + res.describe())
        return {"changed": any(v.get("stopped") for v in got.values()), "result": got}

    def verify(self, host, change: Change, ctx: RemedyContext) -> Finding:
        from gpudoctor.gather import procs as gprocs
        from gpudoctor.gather.context import GatherContext

        facts = gprocs.gather(host, GatherContext(timeout=ctx.timeout)) or {}
        if facts.get("error"):
            return Finding(ID, Status.UNKNOWN, f"could not list the processes after the change: {facts['error']}")
        left = [s["pid"] for s in change.data["servers"]
                if (facts.get("holders") or {}).get(str(s["pid"]), {}).get("start") == s.get("start")
                or any(x.get("pid") == s["pid"] and x.get("start") == s.get("start")
                       for ls in (facts.get("listeners") or {}).values() for x in ls)]
        if left:
            return Finding(ID, Status.FAIL, f"still running: pid {', '.join(map(str, left))}")
        return Finding(ID, Status.OK, f"stopped: pid {', '.join(str(s['pid']) for s in change.data['servers'])}")

    def rollback(self, host, change: Change, ctx: RemedyContext, applied: dict) -> dict:
        return {"changed": False, "note": "a stopped server is not restarted"}
