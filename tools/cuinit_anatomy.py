#!/usr/bin/env python3
"""Where a bare cuInit subprocess spends its wall time, beside `gpudoctor check` launched two ways, interleaved in one
run (issue #33's profiling aid on a GPU host, not product code):

  bare      python3 -c "import ctypes; ctypes.CDLL('libcuda.so.1').cuInit(0)" (bench/check_latency.py's reference),
            with timestamps: interpreter start, `import ctypes`, dlopen, cuInit, and the exit after the last line
            (the driver's teardown: what a forked probe whose answer is taken at EOF no longer waits for);
  check     the installed console script (pip's: `import re` before gpudoctor.entry);
  lean      the same check from a launcher that imports gpudoctor.entry first (what install.sh could write).

Usage: python3 tools/cuinit_anatomy.py [--runs 9] [--gpudoctor PATH]     (prints medians in ms; JSON with --json)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

BARE = r"""
import time; t1 = time.time()
import ctypes; t2 = time.time()
l = ctypes.CDLL('libcuda.so.1'); t3 = time.time()
rc = l.cuInit(0); t4 = time.time()
print(rc, t1, t2, t3, t4, flush=True)
"""


def bare(py: str) -> dict:
    t0 = time.time()
    p = subprocess.run([py, "-c", BARE], capture_output=True, text=True)
    end = time.time()
    try:
        rc, t1, t2, t3, t4 = p.stdout.split()
    except ValueError:
        return {"error": (p.stderr or p.stdout).strip().splitlines()[-1:]}
    t1, t2, t3, t4 = (float(x) for x in (t1, t2, t3, t4))
    return {"total": end - t0, "interpreter": t1 - t0, "import ctypes": t2 - t1, "dlopen": t3 - t2,
            "cuInit": t4 - t3, "exit (teardown)": end - t4, "rc": int(rc)}


def whole(argv: list[str]) -> dict:
    t0 = time.time()
    p = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return {"total": time.time() - t0, "rc": p.returncode}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--gpudoctor", default=shutil.which("gpudoctor"))
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    gd = a.gpudoctor and os.path.realpath(a.gpudoctor)
    runs: dict[str, list[dict]] = {"bare": [], "check": [], "lean": []}
    lean = None
    if gd:
        gpy = os.path.join(os.path.dirname(gd), "python")
        fd, lean = tempfile.mkstemp(prefix="gd-lean-")
        os.write(fd, f"#!{gpy}\nfrom gpudoctor.entry import main\nimport sys\nsys.exit(main())\n".encode())
        os.close(fd)
        os.chmod(lean, 0o755)
    try:
        for i in range(a.runs + 1):
            got = {"bare": bare(sys.executable)}
            if gd:
                got["check"] = whole([gd, "check"])
                got["lean"] = whole([lean, "check"])
            if i:  # the first round warms caches
                for k, v in got.items():
                    runs[k].append(v)
    finally:
        if lean:
            os.unlink(lean)
    med = {k: {f: round(statistics.median(r[f] for r in v) * 1e3, 1) for f in v[0] if f != "rc"}
           for k, v in runs.items() if v and "error" not in v[0]}
    for k, v in runs.items():
        if v and "error" in v[0]:
            med[k] = {"error": v[0]["error"]}
    if a.json:
        print(json.dumps(med, indent=1))
        return 0
    for k, v in med.items():
        print(f"{k:6s} " + ", ".join(f"{f} {x} ms" if f != "error" else f"error {x}" for f, x in v.items()))
    if "check" in med and "total" in med.get("bare", {}):
        for k in ("check", "lean"):
            print(f"ratio {k} / bare cuInit: {med[k]['total'] / med['bare']['total']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
