"""Deep tier, per GPU: run the measuring child (gather/deep_child.py) on each GPU in turn, under a deadline.

facts["deep"]["gpus"] = [{"index", "bus_id", "name", "command": {rc, timed_out, timeout_s, duration_s},
  "result": the child's JSON (gpudoctor.deep.gpu/1) or None, "error": why there is no result,
  "refused": {"pids": [...]} when another process holds the GPU and --force was not given}]
facts["deep"]["apps"]: nvidia-smi's compute processes before the run; facts["deep"]["xids"]: Xid lines the kernel
logged while the children ran. The children's argv depends only on the policy and what nvidia-smi listed, so a
snapshot of a deep run replays.
"""

from __future__ import annotations

import json
import math
import threading

from gpudoctor.gather.context import GatherContext
from gpudoctor.gather.deep_timeline import Timeline
from gpudoctor.host import Host
from gpudoctor.host.childpy import python_argv
from gpudoctor.host.replay import not_recorded
from gpudoctor.catalog.xid import norm_pci

QUERY_GPUS = ["nvidia-smi", "--query-gpu=index,pci.bus_id,name", "--format=csv,noheader,nounits"]
QUERY_APPS = ["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory,gpu_bus_id",
              "--format=csv,noheader,nounits"]

# 1 GiB host copies (the H200 figures were taken that way), a few reps each: ~10 s per GPU on an H200.
DEFAULTS = {"bytes": 1 << 30, "p2p_bytes": 256 << 20, "gemm_n": 8192, "budget_s": 30.0, "backend": "auto",
            "reps": {"pinned": 5, "pageable": 3, "d2d": 20, "gemm": 20, "p2p": 5}}


def settings(policy: dict) -> dict:
    """The child's knobs from the policy (deep_bytes, deep_gemm_n, deep_gpu_budget_s, deep_backend)."""
    s = dict(DEFAULTS)
    for key, pol in (("bytes", "deep_bytes"), ("gemm_n", "deep_gemm_n"), ("budget_s", "deep_gpu_budget_s"),
                     ("backend", "deep_backend"), ("p2p_bytes", "deep_p2p_bytes")):
        if policy.get(pol) is not None:
            s[key] = policy[pol]
    return s


def child_args(dev: int, peers: list[int], s: dict) -> str:
    """The child's one JSON argument (sorted keys: the same run is the same argv, so snapshots replay)."""
    return json.dumps({"dev": dev, "peers": peers, "bytes": s["bytes"], "p2p_bytes": s["p2p_bytes"],
                       "gemm_n": s["gemm_n"], "budget_s": s["budget_s"], "backend": s["backend"], "reps": s["reps"]},
                      sort_keys=True, separators=(",", ":"))


def parse_csv(text: str, cols: int) -> list[list[str]]:
    """nvidia-smi --format=csv,noheader rows, each split into `cols` stripped cells (short rows dropped)."""
    rows = []
    for ln in text.splitlines():
        cells = [c.strip() for c in ln.split(",", cols - 1)]
        if len(cells) == cols and cells[0]:
            rows.append(cells)
    return rows


def parse_child(stdout: str) -> dict | None:
    """The child's last complete JSON line (it reprints its record after each measurement)."""
    for ln in reversed(stdout.strip().splitlines()):
        try:
            d = json.loads(ln)
        except ValueError:
            continue
        if isinstance(d, dict) and d.get("schema") == "gpudoctor.deep.gpu/1":
            return d
    return None



def held_by(apps: list[dict], bus_id: str) -> list[dict]:
    return [a for a in apps if norm_pci(a["bus_id"]) == norm_pci(bus_id)]


def list_apps(host: Host, ctx: GatherContext) -> tuple[list[dict], str | None]:
    res = host.run(QUERY_APPS, timeout=ctx.timeout)
    if not res.ok:
        return [], "nvidia-smi --query-compute-apps " + res.describe()
    apps = []
    for ln in res.stdout.splitlines():  # a process name may hold commas: pid first, memory and bus id last
        pid, _, rest = ln.partition(",")
        cells = [c.strip() for c in rest.rsplit(",", 2)]
        if not pid.strip() or len(cells) != 3:
            continue
        pid, (name, mib, bus) = pid.strip(), cells
        apps.append({"pid": int(pid) if pid.isdigit() else pid, "name": name,
                     "used_mib": int(mib) if mib.isdigit() else None, "bus_id": bus})
    return apps, None


# The children's environment: device numbers in PCI order (as nvidia-smi's), and torch loads no out-of-tree device
# backend (its entry-point scan is start-up time, and none is measured).
CHILD_ENV = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}


def survey(host: Host, ctx: GatherContext, tl: Timeline | None = None) -> dict:
    """The GPUs nvidia-smi lists and the processes on them; a GPU another process holds is refused (unless
    --force). Needs no python: it runs while the search for one does (gather/deep.py)."""
    tl = tl or Timeline()
    s = settings(ctx.policy)
    force = bool(ctx.policy.get("deep_force"))
    with tl.phase("nvidia-smi --query-gpu"):
        q = host.run(QUERY_GPUS, timeout=ctx.timeout)
    if not_recorded(q):  # a deep snapshot from before per-GPU measurements: it holds only the NCCL probe
        return {"gpus": None}
    out: dict = {"settings": s, "force": force, "gpus": [], "apps": [], "xids": None}
    if not q.ok:
        out["gpus_error"] = "nvidia-smi --query-gpu " + q.describe()
        return out
    gpus = [{"index": int(i), "bus_id": b, "name": n} for i, b, n in parse_csv(q.stdout, 3) if i.isdigit()]
    with tl.phase("nvidia-smi --query-compute-apps"):
        out["apps"], err = list_apps(host, ctx)
    if err:
        out["apps_error"] = err
    for g in gpus:
        rec = dict(g)
        holders = held_by(out["apps"], g["bus_id"])
        if holders and not force:
            rec["refused"] = {"pids": holders}
        elif err and not force:  # could not tell whether a server holds it: do not measure blind
            rec["refused"] = {"pids": [], "why": err}
        out["gpus"].append(rec)
    return out


def to_measure(seen: dict) -> list[dict]:
    """The GPUs of a survey its children measure, in order."""
    return [r for r in seen.get("gpus") or [] if "refused" not in r]


def measure(host: Host, ctx: GatherContext, python: list[str], tl: Timeline | None = None,
            seen: dict | None = None) -> dict:
    """A measuring child for every GPU the survey did not refuse. Each measures alone (a GPU measured alone has the
    host link to itself, and a peer copy's context on another GPU is gone when its child exits), in index order;
    where there are several, all start at once and each waits for its turn after importing torch, so their start-up
    overlaps (deep_child.wait_turn: the parent makes its file when the child before it has exited)."""
    tl = tl or Timeline()
    out = seen if seen is not None else survey(host, ctx, tl)
    if out.get("gpus") is None:
        return out
    todo = to_measure(out)
    s = out["settings"]
    t = float(s["budget_s"])
    turns = _scratch(host, "gpudoctor-deep") if len(todo) > 1 else None
    from gpudoctor.gather.deep_child import PROGRAM

    def child(k: int, rec: dict) -> None:
        peers = [p["index"] for p in out["gpus"] if p["index"] > rec["index"]]
        env = dict(CHILD_ENV)
        if turns and k:
            env.update(GPUDOCTOR_DEEP_GO=f"{turns}/go-{rec['index']}", GPUDOCTOR_DEEP_WAIT_S=f"{k * (t + 10.0):g}")
        # The program comes on stdin ("python3 -I -Wignore - ARGS": isolated, in /, through host/childpy.py), so a
        # snapshot's key is the arguments alone: a deep snapshot replays through later versions of the child.
        started = tl.now()
        res = host.run(python_argv(python, "-Wignore", "-", child_args(rec["index"], peers, s)),
                       timeout=(k + 1 if turns else 1) * (t + 10.0), input=PROGRAM.encode(), env=env)
        ended = tl.now()
        tl.add("measuring child", started, ended, gpu=rec["index"])
        rec["command"] = {"rc": res.rc, "timed_out": res.timed_out, "timeout_s": res.timeout_s,
                          "duration_s": round(res.duration_s, 3)}
        rec["result"] = parse_child(res.stdout)
        tl.child(started, rec["result"], ended=ended, gpu=rec["index"])
        if rec["result"] is not None:  # the timeline's (facts["deep"]["timeline"]), not the figures'
            rec["result"].pop("phases", None)
        if rec["result"] is None:
            tail = (res.stderr.strip() or res.stdout.strip())[-300:]
            rec["error"] = f"measuring child {res.describe()}: {tail}"
        elif res.timed_out:
            rec["error"] = f"measuring child did not finish in {res.timeout_s:g} s (what it measured is kept)"

    if turns is None:
        for k, rec in enumerate(todo):
            child(k, rec)
    else:
        threads = [threading.Thread(target=child, args=(k, rec), daemon=True) for k, rec in enumerate(todo)]
        try:
            for th in threads:
                th.start()
            for k, th in enumerate(threads):
                th.join()
                if k + 1 < len(todo):
                    host.run(["touch", "--", f"{turns}/go-{todo[k + 1]['index']}"], timeout=10)
        finally:
            host.run(["touch", "--", f"{turns}/stop"], timeout=10)  # a child still waiting gives up now
            for th in threads:
                th.join()
            host.run(["rm", "-rf", "--", turns], timeout=10)
    with tl.phase("kernel log (Xid lines)"):
        out["xids"] = _xids_during(host, ctx, out["gpus"])
    return out


def _scratch(host: Host, prefix: str) -> str | None:
    """A private directory made on the target for this run (mktemp -d: 0700, a fresh name), or None (a replay,
    which never recorded one, or none could be made: the children then run one after another)."""
    made = host.run(["mktemp", "-d", "-t", prefix + ".XXXXXXXXXX"], timeout=10)
    path = made.stdout.strip() if made.ok else ""
    return path if path.startswith("/") else None


def _xids_during(host: Host, ctx: GatherContext, recs: list[dict]) -> dict | None:
    """Xid lines the kernel logged from the first child's start to now (the window comes from the children's own
    uptime readings, so a replay asks for the same window)."""
    ups = [(r["result"].get("uptime_start"), r["result"].get("uptime_end")) for r in recs if r.get("result")]
    ups = [(a, b) for a, b in ups if a is not None and b is not None]
    if not ups:
        return None
    start, end = min(a for a, _ in ups), max(b for _, b in ups)
    from gpudoctor.gather.kernel_log import read_kernel_log

    window = math.ceil(end - start) + 2
    log = read_kernel_log(host, window, min(ctx.timeout, 5.0))
    if log is None:
        return None
    return {"window_s": window, "since_uptime": start, "source": log.get("source"), "errors": log.get("errors"),
            "lines": [x for x in log.get("xids") or [] if x.get("t") is None or x["t"] >= start - 1]}
