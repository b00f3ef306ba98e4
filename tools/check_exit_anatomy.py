#!/usr/bin/env python3
"""How long a live `gpudoctor check` process takes to end after its last word (issue #33's profiling aid on a GPU
host, not product code). The check runs through the console script's own path (argv None: cli._fast_exit ends it
with os._exit); a wrapper marks the moment os._exit is called and lists the descriptors and driver libraries the
process holds then. The kernel's exit (closing /dev/nvidia* descriptors frees the driver's client state) is the gap
between that mark and the moment the caller reaps the process. Two ways, interleaved:

  nvml      as installed (NVML read in process, host/nvml.py);
  no-nvml   pynvml hidden (the driver facts come from nvidia-smi): does the exit cost follow NVML?

Usage: python3 tools/check_exit_anatomy.py [--runs 7] [--python GPUDOCTOR_VENV_PYTHON]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

WRAP = r"""
import os, sys, time
T0 = time.time()
if os.environ.get("NO_NVML"):
    sys.modules["pynvml"] = None
real = os._exit
def marked(code):
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds.append(os.readlink("/proc/self/fd/" + fd))
        except OSError:
            pass
    libs = sorted({l.split()[-1] for l in open("/proc/self/maps") if "nvidia" in l or "libcuda" in l})
    os.write(2, ("\nEXIT-MARK " + json.dumps({"t0": T0, "exit": time.time(), "fds": sorted(fds), "libs": libs,
                                              "code": code}) + "\n").encode())
    real(code)
import json
os._exit = marked
sys.argv = ["gpudoctor", "check", "--json"]
from gpudoctor.entry import main
main()
"""


def one(py: str, no_nvml: bool) -> dict:
    env = dict(os.environ, **({"NO_NVML": "1"} if no_nvml else {}))
    t = time.time()
    p = subprocess.run([py, "-c", WRAP], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    end = time.time()
    mark = next((json.loads(ln.split(" ", 1)[1]) for ln in p.stderr.splitlines() if ln.startswith("EXIT-MARK ")), None)
    if mark is None:
        return {"total": end - t, "error": p.stderr.strip().splitlines()[-3:]}
    return {"total": end - t, "to _exit": mark["exit"] - t, "_exit to reaped": end - mark["exit"],
            "nvidia fds": [f for f in mark["fds"] if "nvidia" in f], "libs": mark["libs"], "rc": p.returncode}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=7)
    gd = shutil.which("gpudoctor")
    ap.add_argument("--python", default=gd and os.path.join(os.path.dirname(os.path.realpath(gd)), "python"))
    a = ap.parse_args()
    runs: dict = {"nvml": [], "no-nvml": []}
    os.chdir("/tmp")
    for i in range(a.runs + 1):
        for k in runs:
            r = one(a.python, k == "no-nvml")
            if i:
                runs[k].append(r)
    for k, v in runs.items():
        ok = [r for r in v if "error" not in r]
        if not ok:
            print(f"{k:8s} error: {v[0].get('error')}")
            continue
        med = {f: round(statistics.median(r[f] for r in ok) * 1e3, 1) for f in ("total", "to _exit", "_exit to reaped")}
        print(f"{k:8s} " + ", ".join(f"{f} {x} ms" for f, x in med.items())
              + f"; at _exit: nvidia fds {ok[-1]['nvidia fds']}, driver libs {ok[-1]['libs']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
