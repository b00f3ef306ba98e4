"""Slurm jobs for `bench run --slurm`: submit (sbatch), watch (squeue, then `scontrol show job` — run by
gpudoctor.integrations.slurm, the one module that runs scontrol — or sacct for how a job ended), cancel (scancel by
job id) — only jobs gpudoctor submitted, recognised by their exact job names.

Every command runs through `host.run` (a LocalHost where the submitting gpudoctor runs), never through a shell. Node
states (drain on a refused gate) stay gpudoctor.integrations.slurm's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# how a job can end when Slurm, not the job, ended it (scontrol's JobState words)
KILLED_BY_SLURM = frozenset({"TIMEOUT", "PREEMPTED", "NODE_FAIL", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY",
                             "CANCELLED", "REVOKED"})
ACTIVE = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD",
                    "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD"})


class SlurmCommandError(Exception):
    pass


@dataclass
class JobEnd:
    """How a job that left the queue ended (`scontrol show job`, else sacct); state None: Slurm no longer knows."""

    job_id: str
    state: str | None
    reason: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    node: str | None = None

    def describe(self) -> str:
        if self.state is None:
            return f"Slurm job {self.job_id}: its end is no longer known to Slurm (scontrol, sacct)"
        bits = [f"Slurm job {self.job_id} {self.state}"]
        if self.node:
            bits.append(f"on {self.node}")
        if self.reason and self.reason != "None":
            bits.append(f"(Reason={self.reason})")
        if self.exit_code is not None:
            bits.append(f"ExitCode={self.exit_code}:{self.signal or 0}")
        return " ".join(bits)


def _run(host, argv, timeout: float = 30.0):
    res = host.run(argv, timeout=timeout)
    if not res.ok:
        raise SlurmCommandError(res.describe())
    return res.stdout


def submit(host, script: str, extra: list[str]) -> str:
    """`sbatch --parsable EXTRA SCRIPT` → the job id."""
    out = _run(host, ["sbatch", "--parsable", *extra, script], timeout=60.0)
    job = out.strip().split(";")[0]
    if not job.isdigit():
        raise SlurmCommandError(f"sbatch printed {out.strip()[:200]!r}, not a job id")
    return job


def queue(host, names: list[str]) -> dict[str, dict]:
    """Jobs in the queue with one of these exact names: {job id: {name, state, node, reason}}."""
    if not names:
        return {}
    out = _run(host, ["squeue", "-h", "--name=" + ",".join(names), "-o", "%i|%j|%T|%N|%r"])
    jobs = {}
    wanted = set(names)
    for line in out.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 5 or parts[1] not in wanted:  # squeue's own name filter, checked again
            continue
        jobs[parts[0]] = {"name": parts[1], "state": parts[2], "node": parts[3] or None, "reason": parts[4]}
    return jobs


def _field(text: str, name: str) -> str | None:
    m = re.search(rf"(?:^|\s){name}=(\S*)", text)
    return m.group(1) if m else None


def ended(host, job_id: str) -> JobEnd:
    """How a job ended: `scontrol show job` while slurmctld still holds it (MinJobAge), else sacct."""
    from gpudoctor.integrations.slurm import show_job

    res = show_job(host, job_id)
    if res.ok and _field(res.stdout, "JobState"):
        t = res.stdout
        rc, _, sig = (_field(t, "ExitCode") or ":").partition(":")
        node = _field(t, "NodeList")
        return JobEnd(job_id, _field(t, "JobState"), _field(t, "Reason"),
                      int(rc) if rc.isdigit() else None, int(sig) if sig.isdigit() else None,
                      None if node in (None, "(null)") else node)
    res = host.run(["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "State,ExitCode,NodeList,Reason"], timeout=30.0)
    if res.ok:
        for line in res.stdout.splitlines():
            parts = line.split("|")
            if len(parts) >= 3 and parts[0]:
                rc, _, sig = parts[1].partition(":")
                return JobEnd(job_id, parts[0].split()[0], parts[3] if len(parts) > 3 else None,
                              int(rc) if rc.isdigit() else None, int(sig) if sig.isdigit() else None,
                              parts[2] or None)
    return JobEnd(job_id, None)


def cancel(host, job_ids: list[str]) -> str | None:
    """`scancel ID...` for these job ids only; None, or what failed."""
    if not job_ids:
        return None
    res = host.run(["scancel", *job_ids], timeout=30.0)
    return None if res.ok else res.describe()
