"""Deep tier (`check --deep`): every GPU measured against its physical limit (gather/deep_gpu.py: host and device
copies, GEMM, P2P, with clocks and counters sampled), then NCCL all-reduce bus bandwidth per candidate TP group,
measured with torch.distributed.

Runs only when asked: it occupies the GPUs for seconds. A GPU another process holds is not measured unless
`--deep --force`. NVLink multicast (NVLS) stays off.
"""

from __future__ import annotations

import json

from gpudoctor.gather.context import GatherContext
from gpudoctor.host import Host

# One rank of the probe; the gather starts one per GPU of the group (threads over Host.run), rendezvous by file.
# argv: rank world rendezvous-file device bytes iters
PROBE = r"""
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
    from gpudoctor.gather.fabric import parse_topo, tp_groups

    topo_res = host.run(["nvidia-smi", "topo", "-m"], timeout=ctx.timeout)
    topo = parse_topo(topo_res.stdout) if topo_res.ok else {"gpus": []}
    n = len(topo["gpus"])
    sizes = ctx.policy.get("tp_sizes") or [s for s in (2, 4, 8) if s <= n] or ([1] if n == 1 else [])
    python = ctx.policy.get("torch_python") or host.python
    python = [python] if isinstance(python, str) else list(python)
    nbytes = int(ctx.policy.get("allreduce_bytes", 256 << 20))
    from gpudoctor.gather.deep_gpu import measure

    per_gpu = measure(host, ctx, python)
    refused = {f"GPU{r['index']}" for r in per_gpu["gpus"] or [] if r.get("refused")}
    out = {"groups": [], "note": None if n else f"nvidia-smi topo -m: {topo_res.describe()}", **per_gpu}
    for s in sizes:
        groups = tp_groups(topo, s) if s > 1 else [{"gpus": ["GPU0"], "worst_link": "X", "numa_nodes": []}]
        for g in groups:
            if refused & set(g["gpus"]):
                out["groups"].append({"tp": s, **g, "error": "not run: another process holds "
                                      f"{', '.join(sorted(refused & set(g['gpus'])))} (--deep --force runs it)"})
                continue
            out["groups"].append(_measure(host, python, s, g, nbytes, ctx))
    return out


def _measure(host: Host, python: list[str], tp: int, group: dict, nbytes: int, ctx: GatherContext) -> dict:
    """Run every rank of one group at once; rank 0's line is the measurement."""
    import threading

    devs = [int(x[3:]) for x in group["gpus"]]
    # A stable name keeps the argv stable, so a snapshot of this probe replays; a stale file is removed first.
    rdv = "/tmp/.gpudoctor-nccl-" + "_".join(map(str, devs))
    host.run(["rm", "-f", rdv], timeout=5)
    results: dict = {}

    def rank(r):
        results[r] = host.run([*python, "-c", PROBE, str(r), str(len(devs)), rdv, str(devs[r]), str(nbytes), "20"],
                              timeout=max(ctx.timeout, 180), env={"NCCL_NVLS_ENABLE": "0"})

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(len(devs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    host.run(["rm", "-f", rdv], timeout=5)
    rec = {"tp": tp, **group, "devices": devs, "bytes": nbytes, "iters": 20}
    failed = [res for res in results.values() if not res.ok]
    if failed:
        res = failed[0]
        rec["error"] = (f"rank probe rc {res.rc}" + (" (timed out)" if res.timed_out else "") + ": "
                        + (res.stderr.strip() or res.stdout.strip())[-400:])
        return rec
    try:
        rec.update(json.loads(results[0].stdout.strip().splitlines()[-1]))
    except (ValueError, IndexError):
        rec["error"] = "rank 0 printed no measurement: " + results[0].stdout[-300:]
    return rec
