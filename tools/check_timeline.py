#!/usr/bin/env python3
"""Where a live `gpudoctor check` spends its wall time: one check, run in this process through the console script's
own entry (gpudoctor.entry.main), with a mark at each phase: wall ms since this interpreter's first line, and the
process's CPU ms (all threads: the gather's threads share one GIL, so CPU ms close to wall ms means the check is
CPU-bound, not waiting on cuInit). Issue #33's profiling aid, not product code: it wraps gpudoctor's functions.

Usage: python3 tools/check_timeline.py [--launched EPOCH] [check args...] > timeline.json   (default args: check --json)
  --launched: time.time() when the caller started this interpreter (tools/h200_check_profile.sh): the interpreter's
  own start then shows as the first mark. The check's output goes to /dev/null; the timeline is one JSON document
  on stdout: {"marks": [[wall_ms, cpu_ms, what], ...], "subsystems": {name: [start_ms, end_ms]}, "critical_path": [...]}.
"""

import json
import os
import sys
import time

T0 = time.perf_counter()
E0 = time.time()
MARKS: list = []


def mark(what: str) -> None:
    MARKS.append([round((time.perf_counter() - T0) * 1e3, 1), round(time.process_time() * 1e3, 1), what])


def summary(subsystems: dict) -> list[str]:
    """The last things to end before exit, in order: the critical path's tail."""
    ends = {m[2]: m[0] for m in MARKS}
    out = []
    cuda = next((m for m in MARKS if m[2].startswith("cuInit probe answered")), None)
    gather_end = ends.get("gather end")
    exit_ms = MARKS[-1][0]
    if cuda:
        out.append(f"cuInit probe collected at {cuda[0]:.0f} ms ({cuda[2]})")
    if gather_end is not None:
        last = sorted(subsystems.items(), key=lambda kv: -kv[1][1])[:4]
        out.append(f"gather ended at {gather_end:.0f} ms; last subsystems to end: "
                   + ", ".join(f"{k} {v[0]:.0f}->{v[1]:.0f} ms" for k, v in last))
    out.append(f"exit at {exit_ms:.0f} ms wall, {MARKS[-1][1]:.0f} ms CPU of this process (all threads, interpreter "
               f"start included): {'CPU-bound' if MARKS[-1][1] > 0.8 * exit_ms else 'waiting'}")
    return out


def main() -> None:
    args = sys.argv[1:]
    if args[:1] == ["--launched"]:
        launched = float(args[1])
        args = args[2:]
        MARKS.append([round((launched - E0) * 1e3, 1), 0.0, "interpreter launched (by the caller)"])
    args = args or ["check", "--json"]
    mark("first line")
    import gpudoctor.entry as entry

    mark("gpudoctor.entry imported")
    orig_start = entry.start_probes

    def start_probes(a):
        mark("start_probes begin")
        orig_start(a)
        mark("start_probes end (cuInit probe, gathers' probes, NVML thread started)")

    entry.start_probes = start_probes
    import gpudoctor.host.nvml as hn

    orig_read = hn.read

    def read():
        mark("NVML read begin (thread)")
        r = orig_read()
        mark(f"NVML read end (init {r.get('init_ms')} ms, all {r.get('ms')} ms, error {r.get('error')})")
        return r

    hn.read = read
    subsystems: dict = {}

    def hook():
        import gpudoctor.commands.check as C
        import gpudoctor.gather as G
        import gpudoctor.host.local as L
        import gpudoctor.pipeline as P
        import gpudoctor.report as R

        orig_finish = L.LocalHost._finish

        def _finish(self, proc, argv, *a):
            r = orig_finish(self, proc, argv, *a)
            if "cuInit" in argv[-1]:
                mark(f"cuInit probe answered, collected (its own cuInit {r.stdout.strip()[-30:]})")
            return r

        L.LocalHost._finish = _finish
        orig_load = G._load

        def _load(target):
            key = next(k for k, v in G.SUBSYSTEMS.items() if v == target)
            t = (time.perf_counter() - T0) * 1e3
            fn = orig_load(target)
            if fn is None:
                return None

            def run(host, ctx):
                try:
                    return fn(host, ctx)
                finally:
                    subsystems[key] = [round(t, 1), round((time.perf_counter() - T0) * 1e3, 1)]
            return run

        G._load = _load
        for mod, names in ((C, ("_warm_imports", "open_check_target")), (P, ("check_host",)),
                           (G, ("gather",)), (R, ("to_json", "render"))):
            for n in names:
                o = getattr(mod, n)

                def w(*a, _o=o, _n=n, **k):
                    mark(_n + " begin")
                    try:
                        return _o(*a, **k)
                    finally:
                        mark(_n + " end")
                setattr(mod, n, w)

    def done():
        mark("exit")
        doc = {"args": args, "marks": MARKS, "subsystems": subsystems, "critical_path": summary(subsystems)}
        os.write(real_stdout, (json.dumps(doc, indent=1) + "\n").encode())

    real_stdout = os.dup(1)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    orig_exit = os._exit

    me = os.getpid()

    def _exit(code):
        if os.getpid() == me:  # not the forked cuInit probe (host/forked.py), which leaves through os._exit too
            sys.stdout.flush()
            done()
        orig_exit(code)

    os._exit = _exit
    start_probes(list(args))  # what entry.main does first
    import gpudoctor.cli

    mark("gpudoctor.cli imported")
    hook()
    sys.argv = ["gpudoctor", *args]
    try:
        gpudoctor.cli.main()  # argv from sys.argv, as the console script: a live check leaves through os._exit
    except SystemExit:
        pass
    done()


if __name__ == "__main__":
    main()
