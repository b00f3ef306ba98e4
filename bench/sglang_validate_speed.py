#!/usr/bin/env python3
"""How much faster `gpudoctor sglang validate` judges a launch than SGLang's own resolution does, per case.

    python3 bench/sglang_validate_speed.py --python /tmp/sglang-ref/bin/python

Over every case of tests/sglang/{corpus,differential}.yaml, in one run:
- ours: validate() in this process (parse, every rule, the memory plan), median of --repeat runs per case;
- SGLang's: the same stages tools/sglang_differential.py runs (prepare_server_args, resolve_once,
  check_server_args, the draft worker's ModelConfig) in the reference venv, timed per case inside that process
  (the one-time `import sglang` and torch is reported apart: a real launch pays it too, before any of this).
Prints medians, totals and the ratio against the goal (>= 10x). The reference venv is the one the differential
uses (see tools/sglang_differential.py); SGLang is never a gpudoctor dependency.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpudoctor.sglang import differential as D  # noqa: E402
from gpudoctor.sglang.resolver import resolve_many  # noqa: E402

GOAL = 10.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", required=True, help="Python of the reference venv where `import sglang` works")
    ap.add_argument("--repeat", type=int, default=5, help="runs of our validate() per case (median)")
    a = ap.parse_args()
    models, cases = D.load(ROOT / "tests/sglang")
    cases = [c for c in cases if D.comparable(c)]
    with tempfile.TemporaryDirectory(prefix="sglang-bench-") as tmp:
        dirs = D.write_models(models, Path(tmp))
        D.run_ours(cases[0], dirs)  # warm our imports, as SGLang's are warm after the first case
        ours = {}
        for c in cases:
            times = []
            for _ in range(a.repeat):
                t0 = time.perf_counter()
                D.run_ours(c, dirs)
                times.append(time.perf_counter() - t0)
            ours[c["name"]] = statistics.median(times)
        t0 = time.perf_counter()
        cp = subprocess.run([a.python, "-c", "import sglang.srt.server_args, sglang.srt.arg_groups.pipeline"],
                            capture_output=True, text=True)
        import_s = time.perf_counter() - t0
        if cp.returncode != 0:
            print(f"the reference Python cannot import sglang: {(cp.stderr.strip().splitlines() or ['?'])[-1]}")
            return 3
        theirs = {}
        by_dev: dict[str, list[dict]] = {}
        for c in cases:
            by_dev.setdefault(c.get("device") or D.DEFAULT_DEVICE, []).append(c)
        for dev, group in by_dev.items():
            jobs = [{"argv": D.argv_of(c, dirs, strip=True), "env": c.get("env") or {}} for c in group]
            # the first job of a process pays the lazy imports of the resolution pipeline: run it twice, drop one
            reals = resolve_many(jobs[:1] + jobs, python=a.python, timeout=1800, device=dev)[1:]
            for c, r in zip(group, reals):
                if r.get("seconds") is not None:
                    theirs[c["name"]] = r["seconds"]
    both = [n for n in ours if n in theirs]
    o = [ours[n] for n in both]
    t = [theirs[n] for n in both]
    ratios = sorted(t[i] / o[i] for i in range(len(both)) if o[i] > 0)
    med_o, med_t = statistics.median(o), statistics.median(t)
    ratio = med_t / med_o
    print(f"cases timed on both sides: {len(both)}")
    print(f"gpudoctor validate : median {med_o * 1e3:8.2f} ms per case, total {sum(o):7.2f} s (in-process, warm)")
    print(f"SGLang resolution  : median {med_t * 1e3:8.2f} ms per case, total {sum(t):7.2f} s "
          f"(+ {import_s:.1f} s to import sglang/torch once)")
    print(f"per-case ratio     : median {statistics.median(ratios):.1f}x, worst {ratios[0]:.1f}x, best {ratios[-1]:.1f}x")
    print(f"median ratio {ratio:.1f}x vs goal {GOAL:.0f}x: {'met' if ratio >= GOAL else 'NOT met'}")
    return 0 if ratio >= GOAL else 1


if __name__ == "__main__":
    raise SystemExit(main())
