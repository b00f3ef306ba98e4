"""Workload hygiene: who else is on the GPU. Every process holding GPU memory (NVML) or a GPU device node (its open
file descriptors), with PID, user, command line, memory and container; the GPU memory held by others per GPU; what
listens on the serving port; and servers gpudoctor's bench started and left behind.

`check` reports these (information: another process on a GPU is not a fault by itself); the `benchmark` gate
profile blocks on foreign GPU memory above its threshold and on a taken serving port (gpudoctor/gate.py), and the
`workload.bench.orphan` remedy stops only gpudoctor's own orphaned servers.
"""

from __future__ import annotations

from gpudoctor.checkreg import check
from gpudoctor.findings import Finding, Status


def _gib(mib: int | float) -> str:
    return f"{mib / 1024:.1f} GiB" if mib >= 1024 else f"{mib:g} MiB"


def _short(text: str | None, n: int = 120) -> str:
    t = " ".join((text or "").split())
    return t if len(t) <= n else t[: n - 1] + "…"


def _nvml_procs(facts) -> dict[int, list[dict]]:
    """pid → [{gpu, bus_id, used_mib, name, type}] from nvidia-smi -q -x (NVML's process lists)."""
    d = facts.get("driver") or {}
    out: dict[int, list[dict]] = {}
    if d.get("rc") != 0:
        return out
    for i, g in enumerate(d.get("gpus") or []):
        for p in g.get("processes") or []:
            if p.get("pid") is not None:
                out.setdefault(p["pid"], []).append({"gpu": i, "bus_id": g.get("bus_id"), "used_mib": p.get("used_mib"),
                                                     "name": p.get("name"), "type": p.get("type")})
    return out


def _nvml_answered(facts) -> "bool | str":
    """True when NVML's process lists were read (nvidia-smi -q -x answered), else the one line saying why not."""
    d = facts.get("driver")
    if not d:
        return "NVML not asked: no driver facts in this run"
    if d.get("rc") == 0 and not d.get("parse_error"):
        return True
    if d.get("timed_out"):
        return f"NVML not asked: nvidia-smi did not answer in {d.get('timeout_s')} s"
    if d.get("rc") == 127:
        return "NVML not asked: nvidia-smi is not installed"
    return f"NVML not asked: nvidia-smi exited {d.get('rc')}" + (f" ({d['stderr'][:120]})" if d.get("stderr") else "")


def _bench_words(b: dict | None) -> str | None:
    if not b:
        return None
    what = f"gpudoctor bench server" + (f" ({b['label']})" if b.get("label") else "")
    if b.get("owner_alive") is False:
        return what + ", left by a campaign that is gone"
    if b.get("owner_alive") is True:
        return what + ", its campaign is running"
    if b.get("owner"):
        return what + f", campaign on {b['owner'].rsplit(':', 2)[0]}"
    return what + " (remote launcher, no owner recorded)"


def gpu_processes(facts) -> list[dict]:
    """Every process on a GPU: NVML's and the device-node holders', joined by PID (pure; the checks and the
    cleanup remedy share it)."""
    procs = facts.get("procs") or {}
    holders = procs.get("holders") or {}
    unreadable = procs.get("unreadable") or {}
    nv = _nvml_procs(facts)
    out = []
    for pid in sorted({*map(int, holders), *nv}):
        h = holders.get(str(pid)) or {}
        mem = nv.get(pid) or []
        ur = unreadable.get(str(pid))
        seen = bool(h) or ur is not None
        out.append({
            "pid": pid, "uid": h.get("uid", ur[0] if ur else None), "user": h.get("user") or (ur[2] if ur and len(ur) > 2
                                                                                              else None),
            "command": h.get("cmdline") or (mem[0]["name"] if mem else None) or (ur[1] if ur else None),
            "nodes": h.get("nodes") or [], "gpus": sorted({m["gpu"] for m in mem}),
            "used_mib": sum(m.get("used_mib") or 0 for m in mem), "per_gpu": mem,
            "container": h.get("container"), "cgroup": h.get("cgroup"), "other_pid_ns": h.get("other_pid_ns"),
            "visible": seen or not procs, "fds_readable": bool(h), "bench": h.get("bench"), "start": h.get("start"),
        })
    return out


def _describe(p: dict) -> tuple[str, list[str]]:
    who = p["user"] or (f"uid {p['uid']}" if p["uid"] is not None else "user unknown")
    mem = (f"holds {_gib(p['used_mib'])} on GPU {', '.join(map(str, p['gpus']))}" if p["per_gpu"]
           else "holds no GPU memory")
    where = p["container"] or ("another PID namespace" if p["other_pid_ns"] else None)
    summary = f"pid {p['pid']} ({who}) {mem}: {_short(p['command'], 80) or '?'}" + (f" [{where}]" if where else "")
    ev = [f"command line: {_short(p['command'], 300) or '?'}"]
    for m in p["per_gpu"]:
        ev.append(f"NVML: pid {p['pid']} uses {m.get('used_mib')} MiB on GPU {m['gpu']} ({m.get('bus_id')}), "
                  f"type {m.get('type') or '?'}")
    if p["nodes"]:
        ev.append(f"/proc/{p['pid']}/fd: {', '.join(p['nodes'])}")
    if p["cgroup"]:
        ev.append(f"cgroup {p['cgroup']}" + (f" ({p['container']})" if p["container"] else ""))
    if not p["visible"]:
        ev.append(f"/proc/{p['pid']} not visible here: the process runs in another PID namespace (the host or "
                  "another container)")
    elif not p["fds_readable"] and p["per_gpu"]:
        ev.append(f"/proc/{p['pid']}/fd not readable as this user: its device nodes and environment are unknown")
    if b := _bench_words(p["bench"]):
        ev.append(b)
    return summary, ev


@check("workload.gpu.processes", summary="Every process holding GPU memory or a GPU device node: PID, user, command, "
       "memory, container, and whether gpudoctor's bench started it.")
def processes(facts):
    """The seed campaign lost hours to servers that kept their GPU memory: this names them. Information only."""
    if "procs" not in facts and not _nvml_procs(facts):
        return None
    procs = facts.get("procs") or {}
    if procs.get("error"):
        return Finding("workload.gpu.processes", Status.UNKNOWN, "Could not list the processes on the GPUs",
                       evidence=[procs["error"]])
    found = gpu_processes(facts)
    scan = (f"/proc scanned: {procs.get('scanned', 0)} processes"
            + (f", {len(procs.get('unreadable') or {})} not inspectable as uid {procs.get('self_user')}"
               if procs.get("unreadable") else "")) if procs else "no process scan (NVML only)"
    if not found:
        nvml = _nvml_answered(facts)
        if nvml is not True:  # only the device-node scan spoke: GPU memory was not listed by anyone
            return Finding("workload.gpu.processes", Status.OK, "No other process holds a GPU device node "
                           "(GPU memory not listed: NVML was not asked)", evidence=[scan, nvml])
        return Finding("workload.gpu.processes", Status.OK, "No other process holds GPU memory or a GPU device node",
                       evidence=[scan, "NVML: no compute or graphics process listed"])
    out = []
    for p in found:
        summary, ev = _describe(p)
        out.append(Finding("workload.gpu.processes", Status.INFO, summary, subject=f"pid {p['pid']}",
                           evidence=ev + [scan], data={k: v for k, v in p.items() if k != "per_gpu"}))
    return out


def _policy_max_mib(facts) -> int | None:
    pol = ((((facts.get("meta") or {}).get("context") or {}).get("policy") or {}).get("checks") or {})
    v = (pol.get("workload.gpu.foreign_memory") or {}).get("max_mib")
    return int(v) if isinstance(v, (int, float)) or (isinstance(v, str) and v.isdigit()) else None


@check("workload.gpu.foreign_memory", summary="The GPU memory other processes hold on each GPU (a benchmark needs it "
       "free: the gate's benchmark profile blocks above its threshold).", depends_on=("driver.nvml.init",))
def foreign_memory(facts):
    """memory.used of each GPU with the processes NVML attributes it to. With the inventory's
    `checks: workload.gpu.foreign_memory: {max_mib: N}` more than N MiB fails the check itself."""
    d = facts.get("driver") or {}
    if d.get("rc") != 0 or not d.get("gpus"):
        return None
    limit = _policy_max_mib(facts)
    procs = gpu_processes(facts)
    out = []
    for i, g in enumerate(d["gpus"]):
        sub = f"GPU {i} ({g.get('bus_id')})"
        mine = [p for p in procs if i in p["gpus"]]
        listed = sum(m.get("used_mib") or 0 for p in mine for m in p["per_gpu"] if m["gpu"] == i)
        used = g.get("memory_used_mib")
        foreign = max(listed, used or 0)
        ev = [f"nvidia-smi: memory used {used} MiB of {g.get('memory_total_mib')} MiB"]
        for p in mine:
            ev.append(f"pid {p['pid']} ({p['user'] or p['uid']}): "
                      f"{sum(m.get('used_mib') or 0 for m in p['per_gpu'] if m['gpu'] == i)} MiB — "
                      f"{_short(p['command'], 100)}")
        if used is not None and used > listed + 64:
            ev.append(f"{used - listed} MiB not attributed to a process NVML lists here (another container or PID "
                      "namespace, or a process that just exited)")
        data = {"gpu": i, "bus_id": g.get("bus_id"), "foreign_mib": foreign, "pids": [p["pid"] for p in mine],
                "max_mib": limit}
        if foreign == 0:
            out.append(Finding("workload.gpu.foreign_memory", Status.OK, f"No GPU memory held on GPU {i}",
                               subject=sub, evidence=ev, data=data))
            continue
        who = ", ".join(f"pid {p['pid']} {p['user'] or p['uid'] or ''}".strip() for p in mine) or "no visible process"
        summary = f"GPU {i}: {_gib(foreign)} held by {who}"
        status = Status.FAIL if limit is not None and foreign > limit else Status.INFO
        if limit is not None:
            summary += f" ({'above' if status == Status.FAIL else 'within'} the policy's {limit} MiB)"
        out.append(Finding("workload.gpu.foreign_memory", status, summary, subject=sub, evidence=ev, data=data,
                           hint="Stop what holds it before benchmarking (a server left by gpudoctor's bench: "
                                "`gpudoctor fix --only workload.bench.orphan --apply`); never kill a stranger's job "
                                "blindly."))
    return out


@check("workload.port.serving", summary="The serving port (--sglang-url's, the policy's, else SGLang's 30000) is "
       "free, or held by the server being checked.")
def serving_port(facts):
    """A benchmark server must bind its port: something else listening there (a stranger's server, a server left
    by an earlier campaign) makes the campaign measure the wrong thing or fail to start."""
    procs = facts.get("procs") or {}
    if not procs.get("ports") or procs.get("error"):
        return None
    url = (((facts.get("meta") or {}).get("context")) or {}).get("sglang_url")
    out = []
    for port in procs["ports"]:
        ls = (procs.get("listeners") or {}).get(str(port)) or []
        sub = f"port {port}"
        if not ls:
            out.append(Finding("workload.port.serving", Status.OK, f"Port {port} is free", subject=sub,
                               evidence=[f"/proc/net/tcp, tcp6: nothing listens on {port}"], data={"port": port}))
            continue
        ev, names = [], []
        for x in ls:
            if x.get("pid") is None:
                ev.append(f"{x.get('socket')} listens on {port}: its process is not visible to this user")
                names.append("a process this user cannot see")
                continue
            b = _bench_words(x.get("bench"))
            names.append(f"pid {x['pid']} ({x.get('user') or x.get('uid')}) {_short(x.get('cmdline'), 60)}")
            ev.append(f"pid {x['pid']} listens on {port}: {_short(x.get('cmdline'), 200)}" + (f" — {b}" if b else ""))
        expected = bool(url) and f":{port}" in url
        bench = [x for x in ls if x.get("bench")]
        data = {"port": port, "pids": [x.get("pid") for x in ls], "in_use_by_other": not expected,
                "bench": bool(bench)}
        if expected:
            out.append(Finding("workload.port.serving", Status.INFO, f"Port {port}: the server being checked "
                               f"({names[0]})", subject=sub, evidence=ev, data=data))
        else:
            out.append(Finding("workload.port.serving", Status.INFO, f"Port {port} is in use by {'; '.join(names)}",
                               subject=sub, evidence=ev, data=data,
                               hint="A benchmark server cannot bind it: stop that server first (or give the campaign "
                                    "another port)."))
    return out


@check("workload.bench.orphan", summary="No inference server that gpudoctor's bench started is left running after "
       "its campaign is gone.", remedy="workload.bench.orphan")
def bench_orphan(facts):
    """Servers carry GPUDOCTOR_BENCH_RUN/LABEL/OWNER in their environment (gpudoctor/gather/marker.py); an owner on
    this machine that is gone (its PID with that start time) makes the server an orphan."""
    procs = facts.get("procs") or {}
    if "holders" not in procs:
        return None
    servers = {}
    for pid, h in (procs.get("holders") or {}).items():
        if h.get("bench"):
            servers[int(pid)] = h
    for port, ls in (procs.get("listeners") or {}).items():
        for x in ls:
            if x.get("bench") and x.get("pid") is not None:
                servers.setdefault(int(x["pid"]), x)
    if not servers:
        return Finding("workload.bench.orphan", Status.OK, "No server started by gpudoctor's bench is running",
                       evidence=[f"/proc scanned: {procs.get('scanned', 0)} processes; none carries "
                                 "GPUDOCTOR_BENCH_OWNER"])
    mem = {p["pid"]: p["used_mib"] for p in gpu_processes(facts)}
    out = []
    for pid, h in sorted(servers.items()):
        b = h["bench"]
        ev = [f"pid {pid}: {_short(h.get('cmdline'), 200)}", f"GPUDOCTOR_BENCH_RUN={b.get('run')}",
              f"GPUDOCTOR_BENCH_LABEL={b.get('label')}", f"GPUDOCTOR_BENCH_OWNER={b.get('owner')}"]
        data = {"pid": pid, "start": h.get("start"), "owner": b.get("owner"), "run": b.get("run"),
                "label": b.get("label"), "used_mib": mem.get(pid, 0), "uid": h.get("uid")}
        if b.get("owner_alive") is False:
            out.append(Finding("workload.bench.orphan", Status.WARN,
                               f"pid {pid} is a gpudoctor bench server ({b.get('label')}) left running by a campaign "
                               f"that is gone" + (f"; it holds {_gib(mem[pid])}" if mem.get(pid) else ""),
                               subject=f"pid {pid}", evidence=ev + ["its owner process is gone (or its PID was reused)"],
                               hint="gpudoctor fix --only workload.bench.orphan --apply (stops it: SIGTERM, then "
                                    "SIGKILL)", data=data))
        else:
            why = ("its campaign is still running" if b.get("owner_alive") else
                   f"its campaign ran on {b['owner'].rsplit(':', 2)[0]}: cannot tell from here whether it is gone"
                   if b.get("owner") else "started by gpudoctor's remote launcher; no owner recorded")
            out.append(Finding("workload.bench.orphan", Status.INFO, f"pid {pid} is a gpudoctor bench server "
                               f"({b.get('label') or '?'}): {why}", subject=f"pid {pid}", evidence=ev, data=data))
    return out
