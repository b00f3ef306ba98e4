#!/usr/bin/env python3
"""Wall time of a full local `gpudoctor check` vs `nvidia-smi -q` and a bare cuInit subprocess, measured in one run.

Usage: python3 bench/check_latency.py [--runs 7]. Prints medians and the ratios (target on an H200: check ≤ 1.0× a
bare cuInit subprocess measured in the same run, issue #28; earlier ≤ 0.40 s and ≤ 1.25×, issue #13). Without a GPU
(no libcuda.so.1) the probe ends at dlopen: the ratio then measures only gpudoctor's own start and work, not the goal.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time

CUINIT = "import ctypes; l = ctypes.CDLL('libcuda.so.1'); print(l.cuInit(0))"


def timed(argv: list[str], runs: int) -> tuple[float, float, int]:
    ts, rc = [], None
    for i in range(runs + 1):
        t = time.perf_counter()
        p = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if i:  # the first run warms caches
            ts.append(time.perf_counter() - t)
        rc = p.returncode
    return statistics.median(ts), min(ts), rc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=7)
    a = ap.parse_args()
    gd = shutil.which("gpudoctor")
    cmds = {
        "gpudoctor check": [gd, "check"] if gd else [sys.executable, "-m", "gpudoctor", "check"],
        "gpudoctor check --json": ([gd] if gd else [sys.executable, "-m", "gpudoctor"]) + ["check", "--json"],
        "nvidia-smi -q": ["nvidia-smi", "-q"],
        "bare cuInit subprocess": [sys.executable, "-c", CUINIT],
        "python -c pass": [sys.executable, "-c", "pass"],
        # what runs before the cuInit probe starts: the console script's entry (#28) vs the CLI module (before)
        "import gpudoctor.entry": [sys.executable, "-c", "import gpudoctor.entry"],
        "import gpudoctor.cli": [sys.executable, "-c", "import gpudoctor.cli"],
    }
    res = {}
    for name, argv in cmds.items():
        try:
            res[name] = timed(argv, a.runs)
        except FileNotFoundError:
            res[name] = None
        if res[name]:
            med, mn, rc = res[name]
            print(f"{name:26s} median {med:.3f} s  min {mn:.3f} s  rc {rc}")
        else:
            print(f"{name:26s} not available")
    chk = res["gpudoctor check"][0]
    for ref in ("nvidia-smi -q", "bare cuInit subprocess"):
        if res.get(ref):
            print(f"ratio gpudoctor check / {ref}: {chk / res[ref][0]:.2f}x")
    print(f"target check <= 0.40 s: {'met' if chk <= 0.40 else 'NOT met'} ({chk:.3f} s)")
    if res.get("bare cuInit subprocess"):
        r = chk / res["bare cuInit subprocess"][0]
        print(f"target check <= 1.0x bare cuInit (#28): {'met' if r <= 1.0 else 'NOT met'} ({r:.2f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
