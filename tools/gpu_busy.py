#!/usr/bin/env python3
"""Keep a GPU busy with a torch GEMM loop for --seconds (or until killed): the "server's own load" or the
"foreign process" of tools/h200_health_suspect.sh. Without torch or CUDA it sleeps for --seconds instead and says
so, so the script's CPU path runs on a machine without a GPU (and does not take a shared machine's cores).

Usage: python3 tools/gpu_busy.py [--seconds 30] [--size 8192] [--device 0]
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--size", type=int, default=8192)
    ap.add_argument("--device", type=int, default=0)
    a = ap.parse_args()
    try:
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("torch.cuda.is_available() is False")
    except Exception as exc:  # ImportError or no CUDA: the CPU path
        print(f"gpu_busy pid {os.getpid()}: no CUDA ({type(exc).__name__}: {exc}); sleeping instead", flush=True)
        time.sleep(a.seconds)
        return
    dev = torch.device("cuda", a.device)
    x = torch.randn(a.size, a.size, device=dev, dtype=torch.bfloat16)
    y = torch.randn(a.size, a.size, device=dev, dtype=torch.bfloat16)
    print(f"gpu_busy pid {os.getpid()}: GEMM {a.size}x{a.size} bf16 on {torch.cuda.get_device_name(dev)}", flush=True)
    n, end = 0, time.monotonic() + a.seconds  # from now: CUDA's start-up is not part of the busy time
    while time.monotonic() < end:
        for _ in range(20):
            x = (x @ y).clamp_(-1, 1)
        torch.cuda.synchronize(dev)
        n += 20
    print(f"gpu_busy pid {os.getpid()}: {n} GEMMs", flush=True)


if __name__ == "__main__":
    sys.exit(main())
