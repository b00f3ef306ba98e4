"""Deep tier (`check --deep`): NCCL all-reduce bus bandwidth per candidate TP group, measured with torch.distributed.

Runs only when asked: it occupies the GPUs for seconds. NVLink multicast (NVLS) stays off.
"""

from __future__ import annotations

import json

from gpudoctor.gather.context import GatherContext
from gpudoctor.host import Host

# Runs on the target with a python that has torch. argv: devices(csv) bytes iters
PROBE = r"""
import json, os, sys, time
devs = [int(x) for x in sys.argv[1].split(",")]
nbytes, iters = int(sys.argv[2]), int(sys.argv[3])
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
import torch, torch.distributed as dist, torch.multiprocessing as mp

def worker(rank, world, port, q):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(devs[rank])
    dist.init_process_group("nccl", rank=rank, world_size=world)
    x = torch.ones(nbytes // 4, dtype=torch.float32, device="cuda")
    for _ in range(3):
        dist.all_reduce(x)
    torch.cuda.synchronize(); dist.barrier()
    t = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t) / iters
    if rank == 0:
        q.put(dt)
    dist.destroy_process_group()

if __name__ == "__main__":
    import socket
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    ctx = mp.get_context("spawn"); q = ctx.Queue(); n = len(devs)
    mp.start_processes(worker, args=(n, port, q), nprocs=n, start_method="spawn", join=True)
    dt = q.get()
    alg = nbytes / dt / 1e9
    print(json.dumps({"devices": devs, "bytes": nbytes, "iters": iters, "seconds_per_op": dt,
                      "algbw_gbs": alg, "busbw_gbs": alg * 2 * (n - 1) / n, "nccl": ".".join(map(str, torch.cuda.nccl.version()))}))
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
    out = {"groups": []}
    for s in sizes:
        groups = tp_groups(topo, s) if s > 1 else [{"gpus": ["GPU0"], "worst_link": "X", "numa_nodes": []}]
        for g in groups:
            devs = ",".join(x[3:] for x in g["gpus"])
            res = host.run([*python, "-c", PROBE, devs, str(nbytes), "20"], timeout=max(ctx.timeout, 180),
                           env={"NCCL_NVLS_ENABLE": "0"})
            rec = {"tp": s, **g}
            if res.ok:
                try:
                    rec.update(json.loads(res.stdout.strip().splitlines()[-1]))
                except (ValueError, IndexError):
                    rec["error"] = res.describe()
            else:
                rec["error"] = res.describe() + " " + res.stderr.strip()[-300:]
            out["groups"].append(rec)
    return out
