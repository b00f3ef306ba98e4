#!/usr/bin/env python3
"""Wall time of a full local `gpudoctor check` vs `nvidia-smi -q` and a bare cuInit subprocess, measured in one run.

Usage: python3 bench/check_latency.py [--runs 7]. Prints medians and the ratios (target on an H200: check ≤ 1.0× a
bare cuInit subprocess measured in the same run, issues #28, #33; earlier ≤ 0.40 s and ≤ 1.25×, issue #13). Without a
GPU (no libcuda.so.1) the probe ends at dlopen: the ratio then measures only gpudoctor's own start and work, not the
goal. It also says who answered the driver facts (NVML in process since #33, else nvidia-smi) and times NVML's read
in a fresh process (interpreter start, `import pynvml`, nvmlInit and the driver queries) beside `nvidia-smi -q -x`,
the subprocess it replaced on the critical path.

The commands run interleaved, round by round. A run's time is the user's wait: until the command has exited. What it
leaves behind (the forked cuInit probe still in its exit, the driver's teardown: ~60 ms on the H200, which check no
longer waits for) is reaped between runs, untimed, so the next run starts on a quiet driver as a user's check does.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time

CUINIT = "import ctypes; l = ctypes.CDLL('libcuda.so.1'); print(l.cuInit(0))"


def subreaper() -> bool:
    """Orphans of a timed command (gpudoctor's forked cuInit probe still in its exit: the driver's teardown, tens
    of ms after the answer was taken) become this process's children, so `quiesce` can wait for them."""
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def quiesce() -> None:
    """Reap every leftover descendant, outside the timed span: each run starts on a quiet driver, as a user's
    check does (back to back, one run's teardown would overlap the next run's cuInit)."""
    import os

    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def once(argv: list[str]) -> tuple[float, int]:
    t = time.perf_counter()
    p = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t  # the user's wait: until the command itself has exited
    quiesce()
    return wall, p.returncode


def timed(cmds: dict, runs: int) -> dict:
    """{name: (median, min, rc)}: the commands interleaved, round by round (a drift of the machine over the run
    weighs on all alike); the first round warms caches and is not counted."""
    ts: dict = {name: [] for name in cmds}
    rcs: dict = {}
    for i in range(runs + 1):
        for name, argv in cmds.items():
            if name in rcs and rcs[name] is None:
                continue
            try:
                wall, rc = once(argv)
            except FileNotFoundError:
                rcs[name] = None
                continue
            rcs[name] = rc
            if i:
                ts[name].append(wall)
    return {name: (statistics.median(v), min(v), rcs[name]) if v else None for name, v in ts.items()}


def driver_source(argv: list[str]) -> str:
    """The evidence of driver.nvml.init in one `check --json`: `$ NVML in process (...) → rc 0 in 0.01 s`."""
    import json

    p = subprocess.run(argv, capture_output=True, text=True)
    try:
        f = next(f for f in json.loads(p.stdout)["findings"] if f["id"] == "driver.nvml.init")
    except (ValueError, KeyError, StopIteration):
        return f"unknown (check --json rc {p.returncode})"
    return f"{f['status']}: {(f.get('evidence') or ['?'])[0]}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=7)
    a = ap.parse_args()
    gd = shutil.which("gpudoctor")
    cmds = {
        "gpudoctor check": [gd, "check"] if gd else [sys.executable, "-m", "gpudoctor", "check"],
        "gpudoctor check --json": ([gd] if gd else [sys.executable, "-m", "gpudoctor"]) + ["check", "--json"],
        "nvidia-smi -q": ["nvidia-smi", "-q"],
        "nvidia-smi -q -x": ["nvidia-smi", "-q", "-x"],
        "NVML read (new process)": [sys.executable, "-c", "from gpudoctor.host.nvml import read; read()"],
        "bare cuInit subprocess": [sys.executable, "-c", CUINIT],
        "python -c pass": [sys.executable, "-c", "pass"],
        # what runs before the cuInit probe starts: the console script's entry (#28) vs the CLI module (before)
        "import gpudoctor.entry": [sys.executable, "-c", "import gpudoctor.entry"],
        "import gpudoctor.cli": [sys.executable, "-c", "import gpudoctor.cli"],
    }
    reaping = subreaper()
    res = timed(cmds, a.runs)
    print(f"{a.runs} rounds, commands interleaved; leftover descendants reaped between runs, untimed: "
          f"{'yes' if reaping else 'no (no PR_SET_CHILD_SUBREAPER)'}")
    for name in cmds:
        if res[name]:
            med, mn, rc = res[name]
            print(f"{name:26s} median {med:.3f} s  min {mn:.3f} s  rc {rc}")
        else:
            print(f"{name:26s} not available")
    src = driver_source(cmds["gpudoctor check --json"])
    print(f"driver facts from: {src}")
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
