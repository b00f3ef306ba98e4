"""A contention process for the deep tier's proof (issue #27): bf16 GEMMs and device copies on one GPU, in a loop,
until killed or SECONDS pass. Prints its PID first, so the caller can hold the diagnosis to it and end it by PID.

  python3 tools/deep_contend.py [GPU] [SECONDS]
"""

import os
import sys
import time


def main() -> int:
    print(os.getpid(), flush=True)
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 3
    dev = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    end = time.monotonic() + (float(sys.argv[2]) if len(sys.argv) > 2 else 300)
    torch.cuda.set_device(dev)
    x = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    h = torch.empty(256 << 20, dtype=torch.uint8, pin_memory=True)
    while time.monotonic() < end:
        for _ in range(8):
            torch.matmul(x, x)
        b.copy_(a)
        a[: h.numel()].copy_(h, non_blocking=True)
        torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
