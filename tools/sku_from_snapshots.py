"""Turn deep snapshots of one GPU SKU into its gpudoctor/data/gpu_skus.json entry, so the next SKU's floors are
measured, not assumed (docs/deep.md, "Floors from measurements").

  python3 tools/sku_from_snapshots.py [--min-runs 3] [--margin 0.90] [--site] SNAPSHOT.json...

Each SNAPSHOT is `gpudoctor snapshot --deep` (with a python that has torch, so the GEMM is measured) of a healthy
card; every GPU of every snapshot is one run. A run whose own record names a cause (clock events, another process,
a link below its max, NUMA, MIG, errors — the deep tier's causes) is refused: a floor is derived from healthy runs
only. The figures are replayed through the installed gpudoctor (the same ratios `check --deep` prints). The rule
(gpudoctor.catalog.deep_limits.derive_floor): healthy = the lowest run's ratio rounded to 0.01, floor = MARGIN x
healthy rounded down to 0.01; fewer than --min-runs runs is refused.

Prints the SKU's entry as JSON (the table's entry with d2d and gemm replaced, each source saying where, when, how and
from how many runs), checked as gpudoctor checks its table when it loads it; --site prints a whole site table
(/etc/gpudoctor/gpu_skus.json) holding that entry. Exit 0; 3 with one line on bad input.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import sys


def fail(msg: str) -> int:
    print(f"sku_from_snapshots: {msg}", file=sys.stderr)
    return 3


def runs_of(path: str) -> list[dict]:
    """Each measured GPU of one deep snapshot: name, figures (kind -> figure), the causes found, the record."""
    from gpudoctor import snapshot
    from gpudoctor.checks.bandwidth import analyse
    from gpudoctor.target import snapshot_facts

    doc = snapshot.load(path)
    facts = snapshot_facts(doc)
    created = doc.get("created")
    day = datetime.datetime.fromtimestamp(created, datetime.timezone.utc).date().isoformat() if created else "?"
    driver = (((facts.get("host") or {}).get("driver_version_file")) or {}).get("version")
    out = []
    for g in analyse(facts):
        res = g["rec"].get("result") or {}
        if not g["figs"]:
            continue
        causes = sorted({c["name"] for c in g["causes"].values()} | {c for f in g["figs"] for c in f["causes"]})
        out.append({"path": path, "created": created, "day": day, "driver": driver, "gpu": g["rec"].get("index"), "name": res.get("name"),
                    "torch": res.get("torch"), "backend": res.get("backend"), "before": res.get("before") or {},
                    "figs": {f["kind"]: f for f in g["figs"]}, "causes": causes})
    return out


METHOD = {"d2d": "1 GiB device-to-device copies counting read+write", "gemm": "bf16 8192^3 torch.matmul"}


def entry(paths: list[str], *, min_runs: int, margin: float) -> dict:
    from gpudoctor.catalog.deep_limits import derive_floor, sku_for
    from gpudoctor.errors import InputError

    runs = [r for p in paths for r in runs_of(p)]
    seen = {}
    for r in runs:  # one run counted once: the same snapshot (or a copy of it) given twice is not a second run
        key = (r["created"], r["gpu"])
        if key in seen:
            raise InputError(f"{r['path']} is the run {seen[key]} already gave (GPU {r['gpu']}, same snapshot): "
                             "each run counts once")
        seen[key] = r["path"]
    if not runs:
        raise InputError("no measured GPU in " + ", ".join(paths) + " (a `gpudoctor snapshot --deep` is needed)")
    sick = [r for r in runs if r["causes"]]
    if sick:
        r = sick[0]
        raise InputError(f"GPU {r['gpu']} in {r['path']} is not a healthy run: its record names "
                         f"{', '.join(r['causes'])} (measure an idle card at its full link and clocks)")
    skus = {(sku_for(r["name"]) or {}).get("sku") for r in runs}
    if None in skus:
        raise InputError(f"{next(r['name'] for r in runs if not sku_for(r['name']))!r} matches no SKU of the table: "
                         "add its datasheet numbers (memory_gbs, bf16_dense_tflops, source) first")
    if len(skus) != 1:
        raise InputError(f"the snapshots hold several SKUs ({', '.join(sorted(skus))}): one SKU at a time")
    if len(runs) < min_runs:
        raise InputError(f"{len(runs)} run(s), the rule needs {min_runs} healthy runs (separate `snapshot --deep`s; "
                         "--min-runs N to derive from fewer, which the source then says)")
    sku = copy.deepcopy(sku_for(runs[0]["name"]))
    sku.pop("site", None)
    for kind in ("d2d", "gemm"):
        have = [r for r in runs if kind in r["figs"] and r["figs"][kind]["ratio"] is not None]
        if len(have) < min_runs:
            raise InputError(f"{kind}: measured in {len(have)} run(s) of {len(runs)}, the rule needs {min_runs} "
                             "(GEMM needs torch: `snapshot --deep --deep-python PATH`)")
        d = derive_floor([r["figs"][kind]["ratio"] for r in have], margin)
        f0 = have[0]["figs"][kind]
        r0 = have[0]
        link = (r0["before"].get("link_max") or {})
        what = ", ".join(x for x in (f"Gen{link['gen']} x{link['width']}" if link.get("gen") else None,
                                      f"{r0['before']['power_limit_w']:g} W" if r0["before"].get("power_limit_w") else None,
                                      f"driver {r0['driver']}" if r0["driver"] else None) if x)
        days = sorted({r["day"] for r in have})
        reps = sorted({len(r["figs"][kind]["test"].get("seconds") or []) for r in have})
        vals = ", ".join(f"{r['figs'][kind]['value']:.0f} ({r['figs'][kind]['ratio']:.3f})" for r in have)
        src = (f"measured {' and '.join(days)} on an {r0['name']}{f' ({what})' if what else ''} by gpudoctor check "
               f"--deep with torch {r0['torch']}: {METHOD[kind]}, median of {'/'.join(map(str, reps))}: {vals} of "
               f"{f0['limit']:g} {f0['unit']}, {len(have)} run{'s' if len(have) > 1 else ''}; healthy the lowest run's ratio, floor {margin:.2f} "
               "of it rounded down (docs/deep.md)")
        sku["floors"][kind] = {"floor": d["floor"], "healthy": d["healthy"], "source": src}
    return sku


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("snapshots", nargs="+", metavar="SNAPSHOT")
    ap.add_argument("--min-runs", type=int, default=None, help="healthy runs the rule needs (default 3)")
    ap.add_argument("--margin", type=float, default=None, help="floor = MARGIN x healthy (default 0.90)")
    ap.add_argument("--site", action="store_true", help="print a site table holding the entry")
    a = ap.parse_args(argv)
    from gpudoctor.catalog.deep_limits import MARGIN, MIN_RUNS, table_problems
    from gpudoctor.errors import GpudoctorError

    try:
        e = entry(a.snapshots, min_runs=MIN_RUNS if a.min_runs is None else max(1, a.min_runs),
                  margin=MARGIN if a.margin is None else a.margin)
    except GpudoctorError as exc:
        return fail(exc.one_line())
    problems = table_problems({"floors_default": {}, "skus": [e]})
    if problems:
        return fail(f"the derived entry would be refused: {problems[0]}")
    doc = {"schema": "gpudoctor.gpu_skus/1", "skus": [e]} if a.site else e
    print(json.dumps(doc, indent=1, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
