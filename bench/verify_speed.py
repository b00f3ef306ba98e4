#!/usr/bin/env python3
"""How fast `gpudoctor model verify` tells a whole model from a skeleton: 50 sparse 1 GB shards (50 GB-equivalent).

    python3 bench/verify_speed.py                         # 50 x 1 GB sparse shards in a temp dir
    python3 bench/verify_speed.py --shards 17 --shard-gb 3.9 --tensors 400

Prints the in-process verification time (first and median of repeats), the same for a Hugging Face cache layout
(symlinks into blobs/), the whole CLI's wall time, and python's own start-up time, against the 100 ms target.
Needs only the stdlib and gpudoctor's own dependencies.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.append(os.path.dirname(HERE))  # tests.*; gpudoctor itself: the installed package

from gpudoctor.model import probe  # noqa: E402
from synth_shards import write_model  # noqa: E402

TARGET_S = 0.100


def timed(fn, repeat):
    first = None
    times = []
    for i in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
        first = first if first is not None else times[0]
    return first, statistics.median(times), out


def as_hf_cache(model_dir: str, cache: str) -> str:
    """The same files as an HF cache repo: blobs named by sha256 of their header (cheap stand-in), symlinks."""
    repo = os.path.join(cache, "models--bench--sparse")
    commit = "c" * 40
    snap = os.path.join(repo, "snapshots", commit)
    os.makedirs(snap)
    os.makedirs(os.path.join(repo, "blobs"))
    os.makedirs(os.path.join(repo, "refs"))
    with open(os.path.join(repo, "refs", "main"), "w") as fh:
        fh.write(commit)
    for name in sorted(os.listdir(model_dir)):
        src = os.path.join(model_dir, name)
        with open(src, "rb") as fh:
            blob = hashlib.sha256(name.encode() + fh.read(4096)).hexdigest()
        os.rename(src, os.path.join(repo, "blobs", blob))
        os.symlink(f"../../blobs/{blob}", os.path.join(snap, name))
    return repo


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shards", type=int, default=50)
    ap.add_argument("--shard-gb", type=float, default=1.0, help="logical (sparse) size of each shard, GB")
    ap.add_argument("--tensors", type=int, default=40, help="tensors per shard (header size)")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--dir", default=None, help="where to build the layout (default: a temp dir)")
    a = ap.parse_args()

    base = tempfile.mkdtemp(prefix="gpudoctor-verify-bench-", dir=a.dir)
    model = os.path.join(base, "model")
    total = write_model(model, shards=a.shards, shard_bytes=int(a.shard_gb * 1e9), tensors=a.tensors, sparse=True)
    hdr = int.from_bytes(open(os.path.join(model, sorted(os.listdir(model))[1]), "rb").read(8), "little")
    print(f"layout: {a.shards} shards x {a.shard_gb:g} GB sparse = {total / 1e9:.1f} GB logical, header {hdr} B, "
          f"in {base}")

    first, med, rep = timed(lambda: probe.verify_model(model), a.repeat)
    assert rep["complete"], rep["problems"][:3]
    print(f"verify (in-process, dir):       first {first * 1e3:7.2f} ms   median {med * 1e3:7.2f} ms")
    # a truncated shard must be found as fast
    victim = os.path.join(model, sorted(n for n in os.listdir(model) if n.endswith(".safetensors"))[a.shards // 2])
    size = os.path.getsize(victim)
    os.truncate(victim, size - 1)
    _, med_bad, bad = timed(lambda: probe.verify_model(model), a.repeat)
    assert [p["kind"] for p in bad["problems"]] == ["truncated"], bad["problems"]
    os.truncate(victim, size)
    print(f"verify (in-process, 1 truncated): median {med_bad * 1e3:7.2f} ms (found it)")

    cli = [sys.executable, "-m", "gpudoctor", "model", "verify", model]
    env = dict(os.environ, PYTHONPATH=os.path.dirname(HERE) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    _, cli_med, res = timed(lambda: subprocess.run(cli, capture_output=True, text=True, env=env), 5)
    assert res.returncode == 0, res.stderr
    _, py_med, _ = timed(lambda: subprocess.run([sys.executable, "-c", "pass"]), 5)

    repo = as_hf_cache(model, os.path.join(base, "hub"))
    hf_first, hf_med, hrep = timed(lambda: probe.verify_model(repo), a.repeat)
    assert hrep["complete"], hrep["problems"][:3]
    print(f"verify (in-process, HF cache):  first {hf_first * 1e3:7.2f} ms   median {hf_med * 1e3:7.2f} ms")
    print(f"`gpudoctor model verify` wall:  median {cli_med * 1e3:7.2f} ms  (python -c pass alone: "
          f"{py_med * 1e3:.1f} ms)")
    worst = max(first, med, hf_first, hf_med)
    print(f"target < {TARGET_S * 1e3:.0f} ms for the verification: worst {worst * 1e3:.2f} ms = "
          f"{TARGET_S / worst:.0f}x under target -> {'PASS' if worst < TARGET_S else 'FAIL'}")
    print(f"whole command incl. interpreter start: {cli_med * 1e3:.1f} ms -> "
          f"{'PASS' if cli_med < TARGET_S else 'over 100 ms (start-up cost, see python -c pass)'}")
    subprocess.run(["rm", "-rf", base])
    return 0 if worst < TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
