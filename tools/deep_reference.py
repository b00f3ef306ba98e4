"""Plain torch measurements to hold `gpudoctor check --deep` against (issue #27): on one GPU, 1 GiB host copies from
pinned (torch's own pinned allocator) and pageable memory, a device copy counted read+write, a bf16 8192^3 GEMM.
Prints one JSON object. Nothing on the card is changed. With --nccl also a one-rank NCCL all-reduce of 256 MiB
(20 ops, as the deep tier's TP1 probe: its algorithm bandwidth, `nccl_algbw`); tools/deep_speed_proof.sh runs it
interleaved with `gpudoctor check --deep` (#51).

  python3 tools/deep_reference.py [GPU] [--nccl]
"""

import json
import sys
import time


def main() -> int:
    try:
        import torch
    except ImportError as exc:
        print(json.dumps({"error": f"torch does not import: {exc}"}))
        return 3
    if not torch.cuda.is_available():
        print(json.dumps({"error": f"torch {torch.__version__} sees no CUDA device"}))
        return 3
    args = [a for a in sys.argv[1:] if a != "--nccl"]
    dev = int(args[0]) if args else 0
    torch.cuda.set_device(dev)
    n = 1 << 30

    def med(fn, reps):
        fn()
        torch.cuda.synchronize()
        ts = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b) / 1e3)
        return sorted(ts)[len(ts) // 2]

    d = torch.empty(n, dtype=torch.uint8, device="cuda")
    pinned = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    pageable = torch.empty(n, dtype=torch.uint8)
    pageable.fill_(1)
    out = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(dev), "bytes": n}
    out["h2d"] = n / med(lambda: d.copy_(pinned, non_blocking=True), 5) / 1e9
    out["d2h"] = n / med(lambda: pinned.copy_(d, non_blocking=True), 5) / 1e9
    out["h2d_pageable"] = n / med(lambda: d.copy_(pageable), 3) / 1e9
    out["d2h_pageable"] = n / med(lambda: pageable.copy_(d), 3) / 1e9
    d2 = torch.empty_like(d)
    out["d2d"] = 2 * n / med(lambda: d2.copy_(d), 20) / 1e9
    del d, d2, pinned, pageable
    torch.cuda.empty_cache()
    m = 8192
    x = torch.randn(m, m, dtype=torch.bfloat16, device="cuda")
    y = torch.randn(m, m, dtype=torch.bfloat16, device="cuda")
    out["gemm"] = 2 * m ** 3 / med(lambda: torch.matmul(x, y), 20) / 1e12
    del x, y
    torch.cuda.empty_cache()
    if "--nccl" in sys.argv:
        out["nccl_algbw"] = _nccl(torch, 256 << 20, 20)
    out["at"] = time.time()
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in out.items()}))
    return 0


def _nccl(torch, nbytes, iters):
    import os
    import tempfile

    import torch.distributed as dist

    with tempfile.TemporaryDirectory() as d:
        dist.init_process_group("nccl", init_method="file://" + os.path.join(d, "rdv"), rank=0, world_size=1)
        x = torch.ones(nbytes // 4, dtype=torch.float32, device="cuda")
        for _ in range(3):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        dt = (time.perf_counter() - t) / iters
        dist.destroy_process_group()
    return nbytes / dt / 1e9


if __name__ == "__main__":
    raise SystemExit(main())
