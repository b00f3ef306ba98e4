"""The deep tier's phases that need no GPU (#51), today's code beside the previous code in one run (interleaved):
the python search, the children's start, their imports, the NCCL probe's, the orchestration around them.

Stand-ins, so it runs on any machine: `nvidia-smi` (a script: N GPUs on NVLink, no compute process), and torch (a
package in a venv of its own, found as `--deep-python`) whose import takes `--import-s` seconds (a sleep: the length
of torch's import, not its CPU; docs/performance.md has the real one's on an H100) and whose CUDA is unavailable, so
each measuring child stops after its start-up, and whose torch.distributed answers the NCCL probe at once. What it
measures is the wall of the deep gather (gather(..., only={"deep"})) from its start to its record; the GPU's own
phases (CUDA context, the copies, the GEMM) are tools/deep_speed_proof.sh's.

    python bench/deep_phases.py [--runs 5] [--gpus 1] [--import-s 1.5] [--previous c6c0edc]

Prints each run's wall for both, the medians, and now/previous.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT))  # tests/standins: the stand-in torch

from tests.standins import torch_venv  # noqa: E402

TOPO_1 = ("\\tGPU0\\tCPU Affinity\\tNUMA Affinity\\tGPU NUMA ID\\nGPU0\\t X \\t0-15\\t0\\t\\tN/A\\n")

# Run inside the tree under test (PYTHONPATH): the deep gather alone, its wall, what it ran.
RUNNER = r"""
import json, sys, time
from gpudoctor.gather import gather
from gpudoctor.gather.context import GatherContext
from gpudoctor.host.local import LocalHost
bindir, py = sys.argv[1], sys.argv[2]
ctx = GatherContext(name="bench", policy={"deep": True, "torch_python": py}, timeout=30)
t = time.perf_counter()
facts = gather(LocalHost(path_prepend=[bindir]), ctx, only={"deep"})
wall = time.perf_counter() - t
d = facts["deep"]
print(json.dumps({"wall": wall, "children": len([g for g in d.get("gpus") or [] if g.get("command")]),
                  "groups": len([g for g in d.get("groups") or [] if "seconds_per_op" in g]),
                  "errors": [g.get("error") for g in d.get("groups") or [] if g.get("error")]}))
"""


def _smi(n: int) -> str:
    rows = "".join(f"{i}, 00000000:{0x18 + i:02x}:00.0, NVIDIA H100 80GB HBM3\\n" for i in range(n))
    if n == 1:
        topo = TOPO_1
    else:
        head = "\\t" + "\\t".join(f"GPU{i}" for i in range(n)) + "\\tCPU Affinity\\tNUMA Affinity\\tGPU NUMA ID\\n"
        topo = head + "".join(f"GPU{i}\\t" + "\\t".join(" X " if i == j else "NV18" for j in range(n))
                              + "\\t0-15\\t0\\t\\tN/A\\n" for i in range(n))
    return f"""#!/bin/sh
case "$1" in
  --query-gpu=*) printf '{rows}' ;;
  --query-compute-apps=*) ;;
  topo) printf '{topo}' ;;
  *) exit 0 ;;
esac
"""


def _standins(tmp: Path, gpus: int, import_s: float) -> tuple[str, str]:
    bindir = tmp / "bin"
    bindir.mkdir()
    (bindir / "nvidia-smi").write_text(_smi(gpus))
    (bindir / "nvidia-smi").chmod(0o755)
    return str(bindir), torch_venv.make(tmp / "venv", import_s)


def _previous(tmp: Path, rev: str) -> str:
    dest = tmp / "previous"
    dest.mkdir()
    arch = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "gpudoctor", "checks", "remedies"],
                          capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=arch.stdout, check=True)
    return str(dest)


def _run(tree: str, bindir: str, py: str) -> dict:
    env = dict(os.environ, PYTHONPATH=tree)
    r = subprocess.run([sys.executable, "-c", RUNNER, bindir, py], capture_output=True, text=True, env=env,
                       timeout=300, cwd="/")
    if r.returncode != 0:
        raise SystemExit(f"deep gather failed in {tree}: {r.stderr.strip()[-400:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--gpus", type=int, default=1)
    ap.add_argument("--import-s", type=float, default=1.5, help="the stand-in torch's import, seconds")
    ap.add_argument("--previous", default="c6c0edc", help="the commit to compare with")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="gd-deep-phases.") as d:
        tmp = Path(d)
        bindir, py = _standins(tmp, a.gpus, a.import_s)
        trees = {"now": str(ROOT), "previous": _previous(tmp, a.previous)}
        walls: dict = {k: [] for k in trees}
        for i in range(a.runs):
            for name, tree in trees.items():
                got = _run(tree, bindir, py)
                walls[name].append(got["wall"])
                print(f"run {i + 1} {name:8s}: deep gather {got['wall']:.3f} s ({got['children']} children, "
                      f"{got['groups']} NCCL groups measured{'; ' + str(got['errors']) if got['errors'] else ''})")
        now, prev = statistics.median(walls["now"]), statistics.median(walls["previous"])
        print(f"{a.gpus} GPU(s), stand-in import {a.import_s:g} s, {a.runs} runs: now {now:.3f} s, "
              f"previous ({a.previous}) {prev:.3f} s, median; now/previous {now / prev:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
