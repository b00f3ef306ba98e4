#!/usr/bin/env python3
"""What slows the cuInit probe inside a live `gpudoctor check` (issue #33's profiling aid on a GPU host, not product
code): the text check run through the console script's path with one part changed, a bare cuInit subprocess, and
the probe alone (forked from a bare interpreter, or spawned `-I -S`), interleaved round by round, leftovers reaped
untimed. Each line: wall median and min, and the probe's own dlopen+cuInit (its answer's "seconds").

  normal        as installed
  nonvml        NVML's read not started at entry (host/nvml.start_early)
  late          NVML's read 120 ms later
  noprestart    the gathers' probes not started at entry (gather/prestart.py)
  forked-alone  the probe forked from a bare interpreter, nothing else running
  spawned-alone `python -I -S -c PROBE`
  bare          bench/check_latency.py's bare cuInit subprocess

Usage: python3 tools/check_variants.py GPUDOCTOR_VENV_PYTHON [ROUNDS]      (run it from a directory without gpudoctor/)
"""
import os, statistics, subprocess, sys, time, ctypes, json
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)
WRAP = r"""
import os, sys, time, json
V = os.environ["V"]
sys.argv = ["gpudoctor", "check"]
import gpudoctor.host.nvml as hn
if V == "nonvml":
    hn.start_early = lambda: None
if V == "late":
    orig = hn.read
    def read():
        time.sleep(0.12)
        return orig()
    hn.read = read
if V == "noprestart":
    import gpudoctor.entry as E
    E._gather_argvs = lambda args: []
import gpudoctor.host.local as L
of = L.LocalHost._finish
def _finish(self, proc, argv, *a):
    r = of(self, proc, argv, *a)
    if "cuInit" in argv[-1]:
        try:
            os.write(2, ("CUSEC %s\n" % json.loads(r.stdout)["seconds"]).encode())
        except Exception:
            pass
    return r
L.LocalHost._finish = _finish
from gpudoctor.entry import main
main()
"""
FORK = r"""
import json, os
from gpudoctor.cuda_probe import PROBE
from gpudoctor.host.forked import Forked
p = Forked(['p'], PROBE); o, e = p.communicate(timeout=30)
os.write(2, ("CUSEC %s\n" % json.loads(o)["seconds"]).encode())
"""
py = sys.argv[1]; runs = int(sys.argv[2]) if len(sys.argv) > 2 else 13
from gpudoctor.cuda_probe import PROBE
vs = ["normal", "nonvml", "late", "noprestart", "forked-alone", "spawned-alone", "bare"]
ts = {v: [] for v in vs}; cs = {v: [] for v in vs}
for i in range(runs + 1):
    for v in vs:
        argv = {"bare": [py, "-c", "import ctypes; l = ctypes.CDLL('libcuda.so.1'); print(l.cuInit(0))"],
                "forked-alone": [py, "-c", FORK], "spawned-alone": [py, "-I", "-S", "-c", PROBE]}.get(v, [py, "-c", WRAP])
        t = time.perf_counter()
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ, V=v))
        w = time.perf_counter() - t
        while True:
            try: os.waitpid(-1, 0)
            except ChildProcessError: break
        if i:
            ts[v].append(w)
            cs[v] += [float(l.split()[1]) for l in p.stderr.splitlines() if l.startswith("CUSEC ")]
            if v == "spawned-alone":
                cs[v].append(json.loads(p.stdout)["seconds"])
for v in vs:
    c = f"  probe's own dlopen+cuInit median {statistics.median(cs[v])*1e3:.1f} ms" if cs[v] else ""
    print(f"{v:13s} median {statistics.median(ts[v])*1e3:.1f} ms  min {min(ts[v])*1e3:.1f} ms{c}")
