#!/usr/bin/env python3
"""`gpudoctor model stage` (parallel copy + header verification + marker) against `cp -r`, disk -> tmpfs, one run.

    python3 bench/stage_throughput.py                                  # 20 GiB in 10 shards, defaults below
    python3 bench/stage_throughput.py --size-gib 2 --shards 4 --src /var/tmp/gd-src --dst /dev/shm/gd-dst
    python3 bench/stage_throughput.py --jobs 4,8,16                    # also sweep the thread count

The source (real random data, fsynced) is written once to --src on persistent storage and reused when it matches.
Before every timed copy the source's page cache is dropped (posix_fadvise DONTNEED per file; with --drop-caches
also /proc/sys/vm/drop_caches) and the destination is deleted, so each copy reads from the disk.
cp and stage alternate; every variant runs --repeat times; the median rate counts. Prints both rates and the ratio.
Needs only the stdlib and gpudoctor's own dependencies (run it with gpudoctor installed: pip install .).
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

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.append(REPO)  # tests.*; gpudoctor itself: the installed package

from synth_shards import evict, write_model  # noqa: E402

GiB = 1 << 30


def drop_caches(src: str, global_drop: bool = False) -> str:
    evict(src)
    if not global_drop:  # writing /proc/sys/vm/drop_caches is a sysctl write: only when asked
        return "fadvise"
    try:
        with open("/proc/sys/vm/drop_caches", "w") as fh:
            fh.write("1\n")
        return "fadvise+drop_caches"
    except OSError:
        return "fadvise"


def source_ok(src: str, shards: int, size: int) -> bool:
    meta = os.path.join(src, ".bench.json")
    try:
        with open(meta) as fh:
            m = json.load(fh)
    except (OSError, ValueError):
        return False
    return m == {"shards": shards, "size": size}


def make_source(src: str, shards: int, size: int) -> None:
    shutil.rmtree(src, ignore_errors=True)
    t0 = time.perf_counter()
    pool = os.urandom(64 << 20)
    write_model(src, shards=shards, shard_bytes=size // shards, tensors=40, sparse=False, pool=pool)
    with open(os.path.join(src, ".bench.json"), "w") as fh:
        json.dump({"shards": shards, "size": size}, fh)
    print(f"wrote the source in {time.perf_counter() - t0:.1f} s", flush=True)


def tree_bytes(d: str) -> int:
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(d) for f in fs if not f.startswith("."))


def run_cp(src: str, dst: str) -> float:
    t0 = time.perf_counter()
    subprocess.run(["cp", "-r", src, dst], check=True)
    return time.perf_counter() - t0


def run_stage(src: str, dst: str, jobs: int, method: str, state: str) -> float:
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), GPUDOCTOR_STATE_DIR=state,
               GPUDOCTOR_STAGE_COPY=method)
    cmd = [sys.executable, "-m", "gpudoctor", "model", "stage", "--from", src, "--to", dst, "--apply",
           "--jobs", str(jobs), "--json"]
    t0 = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    secs = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"stage failed (rc {res.returncode}): {res.stderr.strip()[-500:]}")
    out = json.loads(res.stdout)["result"]
    assert out["verify"]["complete"] and out["skipped"] == 0, out
    run_stage.methods.add(out["method"])
    return secs


run_stage.methods = set()


def preflight() -> None:
    """The stage runs as the real CLI: say up front which of gpudoctor's dependencies are missing here."""
    import importlib.util

    missing = [m for m in ("click", "rich", "psutil", "structlog", "yaml") if importlib.util.find_spec(m) is None]
    if missing:
        raise SystemExit(f"missing gpudoctor dependencies for {sys.executable}: {', '.join(missing)} "
                         f"(pip install -e {REPO}, or carry their wheels)")


def main() -> int:
    preflight()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-gib", type=float, default=20.0, help="total shard data, GiB [20]")
    ap.add_argument("--shards", type=int, default=10, help="shard count [10]")
    ap.add_argument("--src", default="/var/tmp/gpudoctor-bench-src", help="source dir on persistent storage")
    ap.add_argument("--dst", default="/dev/shm/gpudoctor-bench-dst", help="destination dir on tmpfs")
    ap.add_argument("--jobs", default=str(min(8, os.cpu_count() or 1)),
                    help="stage thread count, or a comma list to sweep [min(8, cores)]")
    ap.add_argument("--methods", default="auto",
                    help="copy primitives to try, comma list of auto|rw|sendfile|copy_file_range [auto]")
    ap.add_argument("--repeat", type=int, default=2, help="runs of each variant [2]")
    ap.add_argument("--keep-src", action="store_true", help="keep the source afterwards (default: keep it anyway "
                    "for the next run; use --clean to remove)")
    ap.add_argument("--clean", action="store_true", help="remove the source at the end")
    ap.add_argument("--drop-caches", action="store_true",
                    help="also write /proc/sys/vm/drop_caches (a sysctl write; off by default: fadvise only)")
    a = ap.parse_args()

    size = int(a.size_gib * GiB)
    jobs_list = [int(j) for j in a.jobs.split(",")]
    methods = a.methods.split(",")
    src, dst = os.path.abspath(a.src), os.path.abspath(a.dst)
    dst_cp = dst + "-cp"
    state = dst + "-state"
    for d in (dst, dst_cp):
        shutil.rmtree(d, ignore_errors=True)
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    sv = os.statvfs(os.path.dirname(dst))
    if sv.f_bavail * sv.f_frsize < size * 1.02:
        raise SystemExit(f"{os.path.dirname(dst)} has {sv.f_bavail * sv.f_frsize / GiB:.1f} GiB free; need "
                         f"{a.size_gib:g} GiB")
    if not source_ok(src, a.shards, size):
        print(f"writing {a.size_gib:g} GiB of synthetic shards to {src} ...", flush=True)
        make_source(src, a.shards, size)
    total = tree_bytes(src)
    with open("/proc/mounts") as fh:
        fstypes = {ln.split()[1]: ln.split()[2] for ln in fh}
    print(f"data: {total / GiB:.2f} GiB in {a.shards} shards; src {src}; dst {dst} "
          f"({fstypes.get(os.path.dirname(dst), '?')}); {os.cpu_count()} cores; python {sys.version.split()[0]}")

    rates: dict[str, list[float]] = {"cp -r": []}
    variants = {}
    for m in methods:
        for j in jobs_list:
            name = f"stage -j{j}" + (f" {m}" if len(methods) > 1 or m != "auto" else "")
            rates[name], variants[name] = [], (j, m)
    how = ""
    for r in range(a.repeat):
        order = list(rates)
        if r % 2:
            order.reverse()
        for name in order:
            how = drop_caches(src, a.drop_caches)
            if name == "cp -r":
                secs = run_cp(src, dst_cp)
                got = tree_bytes(dst_cp)
                shutil.rmtree(dst_cp)
            else:
                secs = run_stage(src, dst, *variants[name], state)
                got = tree_bytes(dst)
                shutil.rmtree(dst)
            assert got == total, (name, got, total)
            rates[name].append(total / secs)
            print(f"  run {r + 1} {name:<22} {secs:7.2f} s  {total / secs / GiB:6.2f} GiB/s", flush=True)
    shutil.rmtree(state, ignore_errors=True)
    if a.clean:
        shutil.rmtree(src, ignore_errors=True)

    cp = statistics.median(rates["cp -r"])
    print(f"\ncache eviction before each run: {how}; stage copy methods used: {sorted(run_stage.methods)}")
    print(f"{'variant':<24}{'median GiB/s':>14}{'vs cp -r':>10}")
    for name, rs in rates.items():
        med = statistics.median(rs)
        print(f"{name:<24}{med / GiB:>14.2f}{med / cp:>9.2f}x")
    best = max((statistics.median(rs), n) for n, rs in rates.items() if n != "cp -r")
    print(f"\nRESULT: model stage (with verification) {best[0] / GiB:.2f} GiB/s vs cp -r {cp / GiB:.2f} GiB/s "
          f"= {best[0] / cp:.2f}x ({best[1]}; target >= 1.0x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
