#!/usr/bin/env python3
"""What does `bench run --slurm` buy? The same 6-configuration campaign run on one node and on three, wall time of each,
measured in one run on one real Slurm 22.05 cluster (tests/slurmlab.py's cluster shape: slurmctld and three slurmd, each node its
own network namespace, 2 GPUs per node as gres), the SGLang stand-in as every configuration's server.

The campaign: 3 methods x TP 1, 2 (6 configurations, each one Slurm job holding its node: slurm.exclusive), each
configuration 2 levels (concurrency 1, 2) of 6 prompts x 48 tokens at --decode-tok-s; the one-node run uses partition
`one` (n1), the three-node run partition `lab` (n1-n3). Both record every level once (checked).

Usage (as root, the lab's lock held: flock /tmp/gpudoctor-lab.lock ...):
  python bench/slurm_speedup.py [--decode-tok-s 40]
Prints both wall times, where each went on its critical path (squeue polled every 0.1 s: Slurm's wait before the first
job, each job's run and its server's start, the node idle between jobs, the submitter's tail) and their ratio (3 nodes /
1 node);
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
import threading
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


class Watch:
    """squeue every 0.1 s in a thread while a run goes on: when each job was first seen queued, first seen RUNNING
    (on which node) and last seen in the queue (Slurm's own SubmitTime/StartTime/EndTime have 1 s resolution: too
    coarse for the gaps of interest here)."""

    def __init__(self, c: SlurmLab):
        self.c, self.t0, self.jobs, self.stop = c, time.time(), {}, threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()

    def _poll(self) -> None:
        while not self.stop.is_set():
            res = self.c.run(["squeue", "-h", "-o", "%i|%T|%N"])
            now = time.time() - self.t0
            for line in res.stdout.split():
                jid, state, node = (line.split("|") + ["", ""])[:3]
                j = self.jobs.setdefault(jid, {"queued": now, "start": None, "node": None, "gone": now})
                j["gone"] = now
                if state == "RUNNING" and j["start"] is None:
                    j["start"], j["node"] = now, node
            self.stop.wait(0.1)


def breakdown(w: Watch, out: Path, wall: float) -> dict:
    """Where one run's wall time went, on its critical path (the node whose last job ended last): the submitting side
    before the first sbatch, Slurm's wait before that node's first job started, that node's jobs (each: the job's
    gpudoctor start and gate, the server's start from its "ready in" line, the levels, the stop), the node idle between
    one job leaving the queue and the next starting there (slurmctld's scheduling), and the tail after the last job
    left the queue (the submitter's poll, collecting, exit)."""
    state = json.loads((out / "slurm" / "state.json").read_text())
    ready = {}
    for label, st in state["configs"].items():
        for jid in st["jobs"]:
            found = re.findall(r"ready in ([0-9.]+) s", (out / "slurm" / f"{label}-{jid}.out").read_text())
            ready[jid] = float(found[0]) if found else 0.0
    jobs = {jid: j for jid, j in w.jobs.items() if jid in ready and j["start"] is not None}
    last = max(jobs.values(), key=lambda j: j["gone"])
    path = sorted((j for j in jobs.values() if j["node"] == last["node"]), key=lambda j: j["start"])
    runs = [j["gone"] - j["start"] for j in path]
    return {"jobs": len(jobs), "node": last["node"], "before_first_sbatch_s": min(j["queued"] for j in jobs.values()),
            "first_start_wait_s": path[0]["start"] - min(j["queued"] for j in jobs.values()),
            "path_jobs": len(path), "path_job_run_s": sum(runs),
            "path_server_start_s": sum(ready[jid] for jid, j in jobs.items() if j in path),
            "path_idle_between_s": sum(b["start"] - a["gone"] for a, b in zip(path, path[1:])),
            "tail_s": wall - last["gone"]}


def run(c: SlurmLab, d: Path, partition: str, decode: float) -> tuple[float, dict]:
    out = d / f"out-{partition}"
    path = campaign(d, partition, decode)
    with Watch(c) as w:
        res = c.run([str(GPUDOCTOR), "bench", "run", str(path), "--out", str(out), "--slurm"], timeout=1800)
        wall = time.time() - w.t0
    if res.returncode != 0:
        sys.exit(f"{partition}: bench run --slurm exited {res.returncode}: {res.stderr[-2000:]}")
    recs = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    keys = {(r["label"], r["workload"], r["concurrency"]) for r in recs}
    if len(keys) != len(recs) or len(recs) != 12 or any(r["status"] != "ok" for r in recs):
        sys.exit(f"{partition}: expected 12 ok records, each once; got {len(recs)}")
    nodes = sorted({r["provenance"]["slurm"]["node"] for r in recs})
    b = breakdown(w, out, wall)
    print(f"{partition}: {wall:.1f} s wall, 12 levels recorded once, on {', '.join(nodes)}; on the critical path "
          f"({b['node']}): before the first sbatch {b['before_first_sbatch_s']:.1f} s, Slurm's wait for the first "
          f"job {b['first_start_wait_s']:.1f} s, {b['path_jobs']} jobs {b['path_job_run_s']:.1f} s (of which "
          f"server start {b['path_server_start_s']:.1f} s), the node idle between them {b['path_idle_between_s']:.1f} "
          f"s, after the last job {b['tail_s']:.1f} s", flush=True)
    return wall, b


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--decode-tok-s", type=float, default=40.0)
    ap.add_argument("--scheduler-parameters", metavar="LIST",
                    help="the lab's SchedulerParameters (a site's setting, e.g. batch_sched_delay=1; default: Slurm's "
                         "defaults), to see what slurmctld's batch scheduling costs")
    args = ap.parse_args()
    d = Path(tempfile.mkdtemp(prefix="gpd-slurm-speedup-"))
    try:
        with SlurmLab(d / "cluster", nodes=3, gpus=2) as c:
            if args.scheduler_parameters:
                c.write_conf(SchedulerParameters=args.scheduler_parameters)
                c.scontrol("reconfigure")
            one, _ = run(c, d, "one", args.decode_tok_s)
            three, _ = run(c, d, "lab", args.decode_tok_s)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    ratio = three / one
    print(f"wall time, 3 nodes / 1 node: {three:.1f} s / {one:.1f} s = {ratio:.2f} (target <= 0.37)")
    return 0 if ratio <= 0.37 else 1


if __name__ == "__main__":
    sys.exit(main())
