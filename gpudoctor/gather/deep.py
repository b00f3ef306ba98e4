"""Deep tier (`check --deep`): every GPU measured against its physical limit (gather/deep_gpu.py: host and device
copies, GEMM, P2P, with clocks and counters sampled), then NCCL all-reduce bus bandwidth per candidate TP group,
measured with torch.distributed.

Runs only when asked: it occupies the GPUs for seconds. A GPU another process holds is not measured unless
`--deep --force`. NVLink multicast (NVLS) stays off.
"""

from __future__ import annotations

import inspect
import json
import threading

from gpudoctor.gather.context import GatherContext
from gpudoctor.gather.deep_timeline import Timeline, started_ago
from gpudoctor.host import Host
from gpudoctor.host.childpy import python_argv
from gpudoctor.host.replay import not_recorded

# One rank of the probe; the gather starts one per GPU of the group (threads over Host.run), rendezvous by file.
# argv: rank world rendezvous-name device bytes iters; the file lies in $GPUDOCTOR_NCCL_DIR, a private mkdtemp
# directory (#40: never a fixed name in /tmp another user could make first). Every rank's last line holds its phases
# (gather/deep_timeline.py); rank 0's also the measurement.
_PROBE = r"""
T0 = time.monotonic()
PH = {"startup_s": started_ago(), "phases": []}

def phase(name, t):
    PH["phases"].append([name, round(t - T0, 4), round(time.monotonic() - T0, 4)])

rank, world, rdv, dev, nbytes, iters = (int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]),
                                        int(sys.argv[5]), int(sys.argv[6]))
if not os.path.isabs(rdv):
    rdv = os.path.join(os.environ["GPUDOCTOR_NCCL_DIR"], rdv)
t = time.monotonic()
try:
    import torch, torch.distributed as dist
except ImportError as e:
    print(json.dumps({"not_measured": "torch does not import in %s: %s" % (sys.executable, e)}))
    raise SystemExit(0)
phase("import torch", t)
go = os.environ.get("GPUDOCTOR_NCCL_GO")
if go:  # the parent releases the group when the measuring children are done (gather/deep.py NcclGroup)
    t = time.monotonic()
    limit = t + float(os.environ.get("GPUDOCTOR_NCCL_WAIT_S") or 600)
    stop = os.path.join(os.path.dirname(go), "stop")
    while not os.path.exists(go):
        if os.path.exists(stop) or time.monotonic() > limit:
            print(json.dumps({"error": "not released to measure (%s)" % go}))
            raise SystemExit(3)
        time.sleep(0.01)
    phase("waiting for the measuring children", t)
t = time.monotonic()
torch.cuda.set_device(dev)
dist.init_process_group("nccl", init_method="file://" + rdv, rank=rank, world_size=world)
x = torch.ones(nbytes // 4, dtype=torch.float32, device="cuda")
for _ in range(3):
    dist.all_reduce(x)
torch.cuda.synchronize(); dist.barrier()
phase("CUDA context, NCCL init and warm-up", t)
t0 = time.monotonic()
t = time.perf_counter()
for _ in range(iters):
    dist.all_reduce(x)
torch.cuda.synchronize()
dt = (time.perf_counter() - t) / iters
phase("all-reduce", t0)
t = time.monotonic()
dist.destroy_process_group()
phase("NCCL teardown", t)
if rank == 0:
    alg = nbytes / dt / 1e9
    PH.update({"seconds_per_op": dt, "algbw_gbs": alg, "busbw_gbs": alg * 2 * (world - 1) / world,
               "nccl": ".".join(map(str, torch.cuda.nccl.version()))})
print(json.dumps(PH))
sys.stdout.flush()
os._exit(0)  # nothing left that the kernel does not tear down: no Python teardown on the clock
"""
PROBE = "import json, os, sys, time\n" + inspect.getsource(started_ago) + _PROBE


# The probe as snapshots taken before #33 recorded it (its text was part of their transcript key: `python -c PROBE`).
# Today's goes on stdin (`python - ARGS`: the key is the arguments alone, as the measuring child's); a replay that
# does not find it asks for the old one, so those snapshots still replay.
PROBE_BEFORE_33 = r"""
import json, os, sys, time
rank, world, rdv, dev, nbytes, iters = (int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]),
                                        int(sys.argv[5]), int(sys.argv[6]))
import torch, torch.distributed as dist
torch.cuda.set_device(dev)
dist.init_process_group("nccl", init_method="file://" + rdv, rank=rank, world_size=world)
x = torch.ones(nbytes // 4, dtype=torch.float32, device="cuda")
for _ in range(3):
    dist.all_reduce(x)
torch.cuda.synchronize(); dist.barrier()
t = time.perf_counter()
for _ in range(iters):
    dist.all_reduce(x)
torch.cuda.synchronize()
dt = (time.perf_counter() - t) / iters
dist.destroy_process_group()
if rank == 0:
    alg = nbytes / dt / 1e9
    print(json.dumps({"seconds_per_op": dt, "algbw_gbs": alg, "busbw_gbs": alg * 2 * (world - 1) / world,
                      "nccl": ".".join(map(str, torch.cuda.nccl.version()))}))
"""


def gather(host: Host, ctx: GatherContext) -> dict:
    if not ctx.policy.get("deep"):
        return {}
    tl = Timeline()
    tl.add("gpudoctor start-up", 0.0, tl.now())
    begun = tl.now()
    out = _gather(host, ctx, tl)
    tl.add("deep tier", begun, tl.now())
    out["timeline"] = tl.to_json()
    return out


def _gather(host: Host, ctx: GatherContext, tl: Timeline) -> dict:
    from gpudoctor.gather.deep_gpu import measure, survey, to_measure
    from gpudoctor.gather.deep_python import choose, describe
    from gpudoctor.gather.fabric import parse_topo, tp_groups

    # What needs no python (nvidia-smi's topology, GPUs and processes) runs while the search for one does.
    found: dict = {}

    def search():
        try:
            with tl.phase("python search"):
                found["pick"] = choose(host, ctx)
        except BaseException as exc:  # noqa: BLE001 - raised again in the gather's thread
            found["raised"] = exc

    th = threading.Thread(target=search, daemon=True)
    th.start()
    with tl.phase("nvidia-smi topo -m"):
        topo_res = host.run(["nvidia-smi", "topo", "-m"], timeout=ctx.timeout)
    seen = survey(host, ctx, tl)
    th.join()
    if "raised" in found:
        raise found["raised"]
    pick = found["pick"]
    topo = parse_topo(topo_res.stdout) if topo_res.ok else {"gpus": []}
    n = len(topo["gpus"])
    sizes = ctx.policy.get("tp_sizes") or [s for s in (2, 4, 8) if s <= n] or ([1] if n == 1 else [])
    python = pick["python"]
    nbytes = int(ctx.policy.get("allreduce_bytes", 256 << 20))
    refused = {f"GPU{r['index']}" for r in seen.get("gpus") or [] if r.get("refused")}
    plan = []  # (tp, group, finished record or None: to measure)
    for s in sizes:
        for g in tp_groups(topo, s) if s > 1 else [{"gpus": ["GPU0"], "worst_link": "X", "numa_nodes": []}]:
            if pick.get("torch") is None:  # never a traceback as a finding: said, with the candidates tried
                plan.append((s, g, {"tp": s, **g, "not_measured": f"NCCL all-reduce needs torch: {pick['why']} "
                                    "(`--deep-python PATH` names one)"}))
            elif refused & set(g["gpus"]):
                plan.append((s, g, {"tp": s, **g, "error": "not run: another process holds "
                                    f"{', '.join(sorted(refused & set(g['gpus'])))} (--deep --force runs it)"}))
            else:
                plan.append((s, g, None))
    # The NCCL probes start with the measuring children: their ranks import torch meanwhile, and touch the GPU only
    # when released, one group at a time, after every child has exited (NcclGroup).
    budget = float(seen["settings"]["budget_s"]) + 10.0 if seen.get("settings") else 0.0
    wait = budget * len(to_measure(seen))
    groups = []
    try:
        for i, (s, g, done) in enumerate(plan):
            groups.append(done if done is not None else
                          NcclGroup(host, python, s, g, nbytes, ctx, tl, wait_s=wait + i * max(ctx.timeout, 180)))
        per_gpu = measure(host, ctx, python, tl, seen)
        out = {"groups": [], "note": None if n else f"nvidia-smi topo -m: {topo_res.describe()}",
               "python": {**pick, "evidence": describe(pick)}, **per_gpu}
        for grp in groups:
            out["groups"].append(grp.finish() if isinstance(grp, NcclGroup) else grp)
    finally:
        for grp in groups:
            if isinstance(grp, NcclGroup):
                grp.abandon()
    return out


def _measure(host: Host, python: list[str], tp: int, group: dict, nbytes: int, ctx: GatherContext,
             tl: Timeline | None = None) -> dict:
    """One group's probe, started and released at once."""
    grp = NcclGroup(host, python, tp, group, nbytes, ctx, tl)
    try:
        return grp.finish()
    finally:
        grp.abandon()


class NcclGroup:
    """Every rank of one group, started at once (threads over Host.run); each imports torch, then waits for the
    group's release (the file $GPUDOCTOR_NCCL_GO names, in the group's private directory) before it touches a GPU;
    rank 0's last line is the measurement. finish() releases the group and collects it."""

    def __init__(self, host: Host, python: list[str], tp: int, group: dict, nbytes: int, ctx: GatherContext,
                 tl: Timeline | None = None, wait_s: float = 0.0):
        self.host, self.tl, self.done = host, tl or Timeline(), False
        self.devs = devs = [int(x[3:]) for x in group["gpus"]]
        self.started = self.tl.now()
        self.phase = f"NCCL probe TP{tp} {'+'.join(group['gpus'])}"
        # The rendezvous file lies in a private directory made for this group (mktemp -d on the target: 0700, a
        # fresh name); its own name depends only on the GPUs, so the argv is stable and a snapshot of this probe
        # replays.
        rdv = "gpudoctor-nccl-" + "_".join(map(str, devs))
        made = host.run(["mktemp", "-d", "-t", "gpudoctor-nccl.XXXXXXXXXX"], timeout=10)
        self.scratch = scratch = made.stdout.strip() if made.ok and made.stdout.strip().startswith("/") else None
        self.rec = {"tp": tp, **group, "devices": devs, "bytes": nbytes, "iters": 20}
        self.results: dict = {}
        self.threads: list[threading.Thread] = []
        if scratch is None and not not_recorded(made):  # a replay never recorded it; live, no directory: not measured
            self.rec["error"] = f"no private directory for the NCCL rendezvous: {made.describe()}"
            return
        env = {"NCCL_NVLS_ENABLE": "0", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0",
               **({"GPUDOCTOR_NCCL_DIR": scratch, "GPUDOCTOR_NCCL_GO": scratch + "/go",
                   "GPUDOCTOR_NCCL_WAIT_S": f"{wait_s + 60:g}"} if scratch else {})}
        timeout = max(ctx.timeout, 180) + wait_s

        def rank(r):
            args = [str(r), str(len(devs)), rdv, str(devs[r]), str(nbytes), "20"]
            started = self.tl.now()
            res = host.run(python_argv(python, "-", *args), timeout=timeout, input=PROBE.encode(), env=env)
            if not_recorded(res):  # a snapshot from before #33
                res = host.run(python_argv(python, "-c", PROBE_BEFORE_33, *args), timeout=timeout, env=env)
            self.results[r] = res
            _rank_phases(self.tl, started, res, devs[r])

        self.threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(len(devs))]
        for t in self.threads:
            t.start()

    def finish(self) -> dict:
        """Release the ranks, wait for them, and read rank 0's measurement."""
        if self.scratch:
            self.host.run(["touch", "--", self.scratch + "/go"], timeout=10)
        for t in self.threads:
            t.join()
        self.tl.add(self.phase, self.started, self.tl.now())
        self.abandon()
        if "error" in self.rec:
            return self.rec
        return _read(self.rec, self.results)

    def abandon(self) -> None:
        """Tell ranks still waiting to give up (the gather failed before their release) and remove the directory."""
        if self.done:
            return
        self.done = True
        if self.scratch:
            if any(t.is_alive() for t in self.threads):
                self.host.run(["touch", "--", self.scratch + "/stop"], timeout=10)
                for t in self.threads:
                    t.join()
            self.host.run(["rm", "-rf", "--", self.scratch], timeout=10)


def _read(rec: dict, results: dict) -> dict:
    """The group's record from its ranks' answers."""
    failed = [res for res in results.values() if not res.ok]
    gone = next((res for res in failed if "No module named 'torch'" in res.stderr), None)
    if gone is not None:  # recorded before the probe said so itself (#33): torch was missing, nothing failed
        rec["not_measured"] = f"NCCL all-reduce needs torch: {gone.argv[0]} has none (ModuleNotFoundError)"
        return rec
    try:
        said = json.loads(results[0].stdout.strip().splitlines()[-1]) if results[0].ok else {}
    except (ValueError, IndexError):
        said = {}
    if isinstance(said, dict) and said.get("not_measured"):
        rec["not_measured"] = "NCCL all-reduce needs torch: " + said["not_measured"]
        return rec
    if failed:
        res = failed[0]
        rec["error"] = (f"rank probe rc {res.rc}" + (" (timed out)" if res.timed_out else "") + ": "
                        + (res.stderr.strip() or res.stdout.strip())[-400:])
        return rec
    try:
        said = json.loads(results[0].stdout.strip().splitlines()[-1])
        said.pop("phases", None), said.pop("startup_s", None)  # the timeline's (facts["deep"]["timeline"])
        rec.update(said)
    except (ValueError, IndexError, AttributeError):
        rec["error"] = "rank 0 printed no measurement: " + results[0].stdout[-300:]
    return rec


def _rank_phases(tl: Timeline, started: float, res, gpu: int) -> None:
    """One rank's phases on the deep timeline: from its start to its exit, and its own (its last line's)."""
    ended = tl.now()
    try:
        said = json.loads(res.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        said = None
    tl.add("NCCL rank", started, ended, gpu=gpu)
    tl.child(started, said, ended=ended, prefix="NCCL rank: ", gpu=gpu)
