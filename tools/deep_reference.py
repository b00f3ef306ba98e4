"""Plain torch measurements to hold `gpudoctor check --deep` against (issue #27): on one GPU, 1 GiB host copies from
pinned (torch's own pinned allocator) and pageable memory, a device copy counted read+write, a bf16 8192^3 GEMM.
Prints one JSON object. Nothing on the card is changed.

  python3 tools/deep_reference.py [GPU]
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
    dev = int(sys.argv[1]) if len(sys.argv) > 1 else 0
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
    out["at"] = time.time()
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in out.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
