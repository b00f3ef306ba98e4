#!/usr/bin/env python3
"""What sampling the host's GPUs costs the client: the host-health sampler (gpudoctor.bench.cell.health.Sampler) run for
--seconds at --hz, its thread's CPU time as a share of one core. Target: < 1 % of a core at 2 Hz.

With a driver (an H200 host) it reads the real NVML (pynvml); without one (this CI machine: NVMLError_LibraryNotFound)
it reads the fake NVML built from an H200's nvidia-smi -q -x (tests/bench/fakenvml.py) with --gpus copies, which
measures the sampler's own Python work but not the driver's ioctls — the script says which it used.

Usage: python bench/health_cost.py [--seconds 20] [--hz 2] [--gpus 8]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--hz", type=float, default=2.0)
    ap.add_argument("--gpus", type=int, default=8, help="fake NVML only: how many copies of the captured H200")
    a = ap.parse_args()
    from gpudoctor.bench.cell.health import Sampler

    nvml, source = None, "pynvml (the real driver)"
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
    except Exception as exc:  # no driver here
        from tests.bench.fakenvml import FakeNVML

        nvml, source = FakeNVML(copies=a.gpus), f"fake NVML from an H200 capture x {a.gpus} ({type(exc).__name__})"
    wall0, cpu0 = time.perf_counter(), time.process_time()
    s = Sampler(nvml, interval_s=1.0 / a.hz, kernel_log="/dev/kmsg").start()
    time.sleep(a.seconds)
    out = s.stop()
    wall = time.perf_counter() - wall0
    proc_cpu = time.process_time() - cpu0
    gpus = len(out.get("gpus") or {})
    print(f"source: {source}; status {out['status']}" + (f" ({out.get('reason')})" if out.get("reason") else ""))
    print(f"{out.get('samples', 0)} samples of {gpus} GPU(s) at {a.hz:g} Hz over {wall:.1f} s; kernel log: "
          f"{out.get('kernel_log')}")
    print(f"sampler thread CPU: {out['sampler_cpu_s'] * 1000:.1f} ms = {out['sampler_cpu_s'] / wall * 100:.3f} % of a "
          f"core (whole process: {proc_cpu / wall * 100:.3f} %); target < 1 %")


if __name__ == "__main__":
    main()
