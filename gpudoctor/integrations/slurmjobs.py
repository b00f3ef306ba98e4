"""Slurm jobs for `bench run --slurm`: submit (sbatch), watch (squeue, then `scontrol show job` — run by
gpudoctor.integrations.slurm, the one module that runs scontrol — or sacct for how a job ended), cancel (scancel by
job id) — only jobs gpudoctor submitted: the job ids it recorded at submit, of the user it runs as (a job is never
recognised by its name alone: anyone can name a job like a campaign's).

Every command runs through `host.run` (a LocalHost where the submitting gpudoctor runs), never through a shell. Node
states (drain on a refused gate) stay gpudoctor.integrations.slurm's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpudoctor.errors import GpudoctorError
from gpudoctor.integrations.slurm import show_job

# how a job can end when Slurm, not the job, ended it (scontrol's JobState words)
KILLED_BY_SLURM = frozenset({"TIMEOUT", "PREEMPTED", "NODE_FAIL", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY",
                             "CANCELLED", "REVOKED"})
ACTIVE = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD",
                    "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD"})


class SlurmCommandError(GpudoctorError):
    """A Slurm command failed or answered what it never does: where no caller handles it, one line, exit 3 (the
    campaign's state could not be learned; nothing was judged)."""


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


def queue(host, job_ids: list[str], uid: int) -> dict[str, dict]:
    """Those of these jobs still in the queue that belong to user `uid`: {job id: {name, state, node, reason}}.
    squeue lists the user's jobs (-u; a job id Slurm already forgot would make `squeue -j` fail); the ids and the
    owner are checked here again."""
    wanted = set(job_ids)
    if not wanted:
        return {}
    out = _run(host, ["squeue", "-h", f"--user={uid}", "-o", "%i|%U|%j|%T|%N|%r"])
    jobs = {}
    for line in out.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 6 or parts[0] not in wanted or parts[1] != str(uid):
            continue
        jobs[parts[0]] = {"name": parts[2], "state": parts[3], "node": parts[4] or None, "reason": parts[5]}
    return jobs


def _field(text: str, name: str) -> str | None:
    m = re.search(rf"(?:^|\s){name}=(\S*)", text)
    return m.group(1) if m else None


def ended(host, job_id: str) -> JobEnd:
    """How a job ended: `scontrol show job` while slurmctld still holds it (MinJobAge), else sacct."""
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


def cancel(host, job_ids: list[str], uid: int) -> str | None:
    """`scancel --user=UID ID...`: these job ids only, and only while user `uid` owns them; None, or what failed."""
    if not job_ids:
        return None
    res = host.run(["scancel", f"--user={uid}", *job_ids], timeout=30.0)
    return None if res.ok else res.describe()
