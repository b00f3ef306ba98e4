#!/usr/bin/env python3
"""What does `bench run --slurm` buy? The same 6-configuration campaign run on one node and on three, wall time of each,
measured in one run on one real Slurm 22.05 cluster (tests/slurmlab.py's cluster shape: slurmctld and three slurmd, each node its
own network namespace, 2 GPUs per node as gres), the SGLang stand-in as every configuration's server.

The campaign: 3 methods x TP 1, 2 (6 configurations, each one Slurm job holding its node: slurm.exclusive), each
configuration 2 levels (concurrency 1, 2) of 6 prompts x 48 tokens at --decode-tok-s; the one-node run uses partition
`one` (n1), the three-node run partition `lab` (n1-n3). Both record every level once (checked).

Usage (as root, the lab's lock held: flock /tmp/gpudoctor-lab.lock ...):
  python bench/slurm_speedup.py [--decode-tok-s 40]
Prints both wall times, where each went (Slurm's job times, the servers' start) and their ratio (3 nodes / 1 node);
exit 0 when the ratio is <= 0.37, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO))

from tests.slurmlab import SlurmLab  # noqa: E402

GPUDOCTOR = Path(sys.executable).with_name("gpudoctor")


def campaign(d: Path, partition: str, decode: float) -> Path:
    (d / "model").mkdir(parents=True, exist_ok=True)
    p = d / f"{partition}.yaml"
    p.write_text(textwrap.dedent(f"""\
        name: speedup-{partition}
        model: {d}/model
        server:
          command: [{sys.executable}, -m, gpudoctor.bench.standin, --decode-tok-s, "{decode}", --ttft-ms, "10"]
          port: 30555
        gate: {{command: "true"}}
        tp: [1, 2]
        concurrency: [1, 2]
        warmup: 1
        timeouts: {{ready_s: 90, stall_s: 30, stop_s: 5, gpu_release_s: 5}}
        health: {{sample: false}}
        methods:
          baseline: {{baseline: true}}
          eagle3: {{args: [--accept-length, "3"]}}
          ngram: {{args: [--accept-length, "2"]}}
        workloads:
          - name: chat
            max_tokens: [48]
            num_prompts: 6
        slurm:
          partition: {partition}
          poll_s: 0.3
        """))
    return p


def _slurm_time(text: str, field: str) -> float | None:
    """A `scontrol show job` time field (local time, 1 s resolution) as a Unix time."""
    m = re.search(rf"(?:^|\s){field}=(\d{{4}}-\d\d-\d\dT\d\d:\d\d:\d\d)", text)
    return time.mktime(time.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S")) if m else None


def breakdown(c: SlurmLab, out: Path, t0: float, t1: float) -> dict:
    """Where one run's wall time went, from Slurm's own job times (SubmitTime, StartTime, EndTime: 1 s resolution)
    and each job's output ("ready in X s": the server's start): the submitting side before the first sbatch, the
    jobs' wait in the queue (batch_sched_delay, a node freed), each job's run (its gpudoctor start and gate, the
    server start, the levels, the stop) and the tail after the last job ended (the submitter's poll, collecting)."""
    state = json.loads((out / "slurm" / "state.json").read_text())
    jobs = []
    for label, st in state["configs"].items():
        for jid in st["jobs"]:
            text = c.scontrol("show", "job", jid)
            ready = re.findall(r"ready in ([0-9.]+) s", (out / "slurm" / f"{label}-{jid}.out").read_text())
            jobs.append({"submit": _slurm_time(text, "SubmitTime"), "start": _slurm_time(text, "StartTime"),
                         "end": _slurm_time(text, "EndTime"), "server_start": float(ready[0]) if ready else 0.0})
    first_submit = min(j["submit"] for j in jobs)
    return {"jobs": len(jobs), "before_first_sbatch_s": first_submit - t0,
            "queue_wait_s": sum(j["start"] - j["submit"] for j in jobs),
            "first_start_after_submit_s": min(j["start"] for j in jobs) - first_submit,
            "job_run_s": sum(j["end"] - j["start"] for j in jobs),
            "server_start_s": sum(j["server_start"] for j in jobs),
            "after_last_job_s": t1 - max(j["end"] for j in jobs)}


def run(c: SlurmLab, d: Path, partition: str, decode: float) -> tuple[float, dict]:
    out = d / f"out-{partition}"
    path = campaign(d, partition, decode)
    t0 = time.time()
    res = c.run([str(GPUDOCTOR), "bench", "run", str(path), "--out", str(out), "--slurm"], timeout=1800)
    t1 = time.time()
    wall = t1 - t0
    if res.returncode != 0:
        sys.exit(f"{partition}: bench run --slurm exited {res.returncode}: {res.stderr[-2000:]}")
    recs = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    keys = {(r["label"], r["workload"], r["concurrency"]) for r in recs}
    if len(keys) != len(recs) or len(recs) != 12 or any(r["status"] != "ok" for r in recs):
        sys.exit(f"{partition}: expected 12 ok records, each once; got {len(recs)}")
    nodes = sorted({r["provenance"]["slurm"]["node"] for r in recs})
    b = breakdown(c, out, t0, t1)
    print(f"{partition}: {wall:.1f} s wall, 12 levels recorded once, on {', '.join(nodes)}; "
          f"before the first sbatch {max(0.0, b['before_first_sbatch_s']):.0f} s, first job started "
          f"{b['first_start_after_submit_s']:.0f} s after it; {b['jobs']} jobs: queued {b['queue_wait_s']:.0f} s, "
          f"ran {b['job_run_s']:.0f} s (of which server start {b['server_start_s']:.1f} s); after the last job ended "
          f"{b['after_last_job_s']:.1f} s", flush=True)
    return wall, b


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--decode-tok-s", type=float, default=40.0)
    args = ap.parse_args()
    d = Path(tempfile.mkdtemp(prefix="gpd-slurm-speedup-"))
    try:
        with SlurmLab(d / "cluster", nodes=3, gpus=2) as c:
            one, _ = run(c, d, "one", args.decode_tok_s)
            three, _ = run(c, d, "lab", args.decode_tok_s)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    ratio = three / one
    print(f"wall time, 3 nodes / 1 node: {three:.1f} s / {one:.1f} s = {ratio:.2f} (target <= 0.37)")
    return 0 if ratio <= 0.37 else 1


if __name__ == "__main__":
    sys.exit(main())
