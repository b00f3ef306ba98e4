"""`bench run --slurm`: every configuration (method x TP) of a campaign is one Slurm job, run on the node it lands on by
the same code as `target: local` (gpudoctor.campaign.runner.Runner, restricted to that configuration: the gate,
the server, the levels, the stop), writing its records to OUT/jobs/LABEL/ on the shared --out; the submitting side
collects them into OUT/results.jsonl (no key twice), drains a node whose gate refused it (gpudoctor.integrations.slurm:
never an admin's node) and resubmits with that node excluded, and records a job Slurm ended (time limit, preemption,
node failure) with Slurm's reason, retried per on_crash. docs/bench.md "Campaigns on Slurm" shows the job script.

Files under OUT: slurm/LABEL.sh (the job script, plain), slurm/LABEL-JOBID.out (the job's output), slurm/state.json
(the campaign id, each configuration's jobs, refused nodes, how jobs ended), jobs/LABEL/ (each job's own run
directory: results.jsonl, logs/, refused.json when its gate refused the node).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import signal
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

from gpudoctor.campaign.file import SlurmSpec, check_gate_profile, check_paths, load
from gpudoctor.campaign.runner import (CampaignStopped, GateRefused, Runner, held_campaign, levels_for,
                                       status_counts)
from gpudoctor.bench.client.levels import skipped_record
from gpudoctor.bench.records.results import CRASHED, ERROR, ResultStore, key
from gpudoctor.errors import ConfigError, GpudoctorError, InputError
from gpudoctor.exitcodes import EXIT_INTERRUPTED, EXIT_JOB_REFUSED, EXIT_TERMINATED
from gpudoctor.files import safe
from gpudoctor.files.atomic import atomic_write
from gpudoctor.host import ops as fs  # the mutation seam (tests/crash)
from gpudoctor.host.childpy import python_argv
from gpudoctor.integrations import slurm as slurmnode
from gpudoctor.integrations import slurmjobs
from gpudoctor.target import local_host

SQUEUE_OUTAGE_S = 60.0  # squeue failing this long while jobs run (slurmctld restarting takes seconds): stop watching
JOB_REFUSED = EXIT_JOB_REFUSED  # `bench job`'s exit code when the gate refused the node (OUT/jobs/LABEL/refused.json says why)


def gpudoctor_command() -> list[str]:
    """The gpudoctor that is running, as a job runs it: its console script by absolute path (the interpreter's
    neighbour), else this interpreter with -m."""
    script = Path(sys.executable).with_name("gpudoctor")
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return python_argv([sys.executable], "-m", "gpudoctor")


def job_script(camp, cfg, out_dir: Path, job_name: str, campaign_id: str) -> str:
    """The batch script of one configuration: sbatch options as #SBATCH lines, then the one command the node runs."""
    spec: SlurmSpec = camp.slurm or SlurmSpec()
    opts = [f"--job-name={job_name}", f"--comment=gpudoctor-campaign={campaign_id}",
            f"--output={out_dir / 'slurm' / cfg.label}-%j.out", f"--chdir={out_dir}", "--nodes=1", "--ntasks=1",
            "--no-requeue"]  # gpudoctor resubmits per on_crash, resuming the job's directory
    if spec.exclusive:
        opts.append("--exclusive")
    if spec.gpu_request == "gpus":
        opts.append(f"--gpus={cfg.tp}")
    elif spec.gpu_request == "gres":
        opts.append(f"--gres=gpu:{cfg.tp}")
    for k, flag in (("partition", "--partition"), ("account", "--account"), ("qos", "--qos"),
                    ("time_limit", "--time")):
        if getattr(spec, k):
            opts.append(f"{flag}={getattr(spec, k)}")
    opts += spec.sbatch_args
    argv = [*gpudoctor_command(), "bench", "job", camp.real_path, "--out", str(out_dir),
            "--config", cfg.label]
    return ("#!/bin/sh\n"
            f"# gpudoctor bench run --slurm: configuration {cfg.label} of campaign {camp.name}, written by gpudoctor.\n"
            "# The node runs the same code as `target: local` for this one configuration: the gate, the server, the\n"
            f"# levels, the stop; its records go to {out_dir}/jobs/{cfg.label}/. Exit {JOB_REFUSED}: the gate refused "
            "this node.\n"
            + "".join(f"#SBATCH {o}\n" for o in opts)
            + "exec " + " ".join(shlex.quote(a) for a in argv) + "\n")


# ---- the job (on the node) -----------------------------------------------------------------------------------------
class NodeRefused(GpudoctorError):
    exit_code = JOB_REFUSED


def drain(host, node: str, reason: str):
    """A node refused by the gate drained through `gate --slurm`'s logic (gpudoctor.integrations.slurm): only a node
    in service or one gpudoctor drained; an admin's node is left as it is."""
    return slurmnode.apply(SimpleNamespace(passed=False, headline=f"bench gate: {reason}"), host, node=node)


def run_job(path: str, out_dir: str, label: str, on_event: Callable[..., None] | None = None) -> dict:
    """One configuration on this node (a Slurm job): the Runner of `target: local` into OUT/jobs/LABEL, resumed, its
    records carrying provenance.slurm {node, job_id}. A refused gate: the node drained while this job still holds it
    (so Slurm gives it no next job; never an admin's node), then OUT/jobs/LABEL/refused.json, NodeRefused."""
    camp = load(path)
    if camp.is_remote:
        raise InputError("bench job runs a configuration on this node: the campaign's target must be local",
                         path=path)
    if label not in {c.label for c in camp.configs()}:
        raise InputError(f"no configuration {label!r} in the campaign "
                         f"(it has {', '.join(c.label for c in camp.configs())})", path=path)
    check_gate_profile(camp, None)
    dfd = safe.owned_dir(str(out_dir))  # ours, as the Runner below requires of its directory in it
    try:
        held_campaign(dfd, Path(out_dir), camp)  # the campaign the submitter put in OUT, not a file edited since
    finally:
        os.close(dfd)
    host = local_host()
    node, job = slurmnode.node_name(), os.environ.get("SLURM_JOB_ID")
    jobdir = Path(out_dir) / "jobs" / label
    try:
        check_paths(camp, host)
        runner = Runner(camp, str(jobdir), host=host, on_event=on_event, only=(label,))
        runner.store.provenance_stamp = {"slurm": {"node": node, "job_id": job}}
        try:
            return runner.run(resume=True)
        except GateRefused as exc:
            act = drain(host, node, str(exc.reason or exc.said))  # before this job ends and frees the node
            fs.fs_makedirs(str(jobdir))
            atomic_write(jobdir / "refused.json", json.dumps({"node": node, "job_id": job, "said": exc.said,
                                                               "reason": exc.reason, "drain": act.to_json(),
                                                               "at": time.time()}).encode(),
                         mode=safe.output_mode())
            raise NodeRefused(f"the gate refused node {node} for {label}: {exc.said}") from None
    finally:
        host.close()


# ---- the submitting side -------------------------------------------------------------------------------------------
class Interrupted(GpudoctorError):
    exit_code = EXIT_INTERRUPTED


class _Terminated(BaseException):
    pass


class SlurmCampaign(Runner):
    """The submitting side: one output directory, its lock (Runner.run), the jobs of this campaign only."""

    def __init__(self, camp, out_dir: str, *, on_event=None, host=None, submit: bool = True):
        # only=(): Runner._run prepares the directory (token counts, campaign.yaml and .json) and runs nothing here
        super().__init__(camp, out_dir, host=host or local_host(), on_event=on_event, only=())
        self.submitting = submit  # False: write the scripts and collect what jobs recorded, submit nothing
        self.spec: SlurmSpec = camp.slurm or SlurmSpec()
        self.sdir = self.dir / "slurm"
        self.state: dict = {}
        self._squeue_down: float | None = None  # when squeue began failing (poll), None while it answers

    # state -----------------------------------------------------------------------------------------------------
    @property
    def state_path(self) -> Path:
        return self.sdir / "state.json"

    def save(self) -> None:
        atomic_write(self.state_path, json.dumps(self.state, indent=1).encode(), mode=safe.output_mode())

    def load_state(self) -> dict:
        if self.state_path.exists():
            try:
                st = json.loads(self.state_path.read_text())
            except ValueError as exc:
                raise InputError(f"is not JSON ({exc})", path=str(self.state_path)) from None
            if isinstance(st, dict) and isinstance(st.get("campaign_id"), str) and isinstance(st.get("configs"), dict):
                return st
            raise InputError("is not a gpudoctor Slurm campaign state", path=str(self.state_path))
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", self.camp.name)[:24]
        return {"campaign_id": f"{name}-{secrets.token_hex(4)}", "configs": {}, "excluded": []}

    def job_name(self, label: str) -> str:
        return f"gpd-{self.state['campaign_id']}-{label}"

    def own_jobs(self, labels) -> dict[str, dict]:
        """This campaign's jobs in the queue: a job id recorded at submit (state.json), submitted by this user, under
        the name given it — never a job matched by its name alone. {job id: squeue's fields + label}."""
        ids = {jid: label for label in labels for jid in self.cs(label)["jobs"]}
        mine = slurmjobs.queue(self.host, sorted(ids), os.getuid())
        return {jid: {**j, "label": ids[jid]} for jid, j in mine.items() if j["name"] == self.job_name(ids[jid])}

    def cs(self, label: str) -> dict:
        return self.state["configs"].setdefault(label, {"job": None, "jobs": [], "refused": [], "ended": [],
                                                        "restarts": 0, "status": "pending"})

    # the run ---------------------------------------------------------------------------------------------------
    def run(self, resume: bool) -> dict:
        if (self.dir / "slurm" / "state.json").exists() and not resume:
            raise InputError("holds a Slurm campaign (slurm/state.json): pass --resume to continue it, or choose "
                             "another --out", path=str(self.dir))
        return super().run(resume)

    def make_healer(self):
        return None  # `heal:` applies in each job, on its node

    def _run(self) -> dict:
        super()._run()
        fs.fs_makedirs(str(self.sdir))
        self.state = self.load_state()
        self.configs = {c.label: c for c in self.camp.configs()}
        for label, cfg in self.configs.items():
            atomic_write(self.sdir / f"{label}.sh",  # slurmd runs it as the submitting user: 0700 is enough
                         job_script(self.camp, cfg, self.dir.resolve(), self.job_name(label),
                                    self.state["campaign_id"]).encode(), mode=0o700)
            self.cs(label)
        self.save()
        self.emit("note", text=f"Slurm campaign {self.state['campaign_id']}: {len(self.configs)} configuration(s), "
                               f"job scripts in {self.sdir}")
        if not self.submitting:  # the sbatch-only recipe: people submit, gpudoctor writes and collects
            for label in self.configs:
                self.collect(label)
                if self.complete(label):
                    self.emit("config", label=label, what="complete")
                else:
                    self.emit("config", label=label, what=f"not complete: sbatch {self.sdir / (label + '.sh')}")
            return status_counts(self.store.load())
        old = signal.getsignal(signal.SIGTERM)

        def term(_sig, _frame):
            raise _Terminated()

        signal.signal(signal.SIGTERM, term)
        try:
            self.loop()
        except (KeyboardInterrupt, _Terminated) as exc:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            gone = self.cancel_own()
            err = Interrupted(f"interrupted ({'SIGTERM' if isinstance(exc, _Terminated) else 'SIGINT'}): "
                              f"{gone}; continue with {self.resume_hint} --slurm")
            err.exit_code = EXIT_TERMINATED if isinstance(exc, _Terminated) else EXIT_INTERRUPTED
            raise err from None
        finally:
            signal.signal(signal.SIGTERM, old)
        for label in self.configs:
            for r in self.cs(label)["refused"]:
                self.emit("note", text=f"node {r['node']} refused by the gate for {label}: {r['said'][:300]} "
                                       f"({r['drain']['detail']})")
        return status_counts(self.store.load())

    def cancel_own(self) -> str:
        """scancel exactly this campaign's jobs in the queue (own_jobs: recorded ids, this user)."""
        try:
            mine = self.own_jobs(self.configs)
        except slurmjobs.SlurmCommandError as exc:
            return f"could not list this campaign's jobs to cancel them ({exc})"
        failed = slurmjobs.cancel(self.host, sorted(mine), os.getuid())
        if not failed:
            for j in mine.values():  # cancelled by us, not ended by Slurm: --resume submits them again
                self.cs(j["label"])["status"] = "cancelled"
        self.save()
        if failed:
            return f"cancelling jobs {', '.join(sorted(mine))} failed: {failed}"
        return f"cancelled this campaign's {len(mine)} job(s)" + (f" ({', '.join(sorted(mine))})" if mine else "")

    def levels(self, label: str):
        return levels_for(self.camp, self.configs[label], self.counter, self.cache)

    def complete(self, label: str) -> bool:
        have = self.store.keys()
        return all(lv.key in have for lv in self.levels(label))

    def collect(self, label: str) -> None:
        """The job directory's records into OUT/results.jsonl, each key once."""
        path = self.dir / "jobs" / label
        have = self.store.keys()
        for rec in ResultStore(path).load():
            if key(rec) not in have:
                self.emit("level_done", record=self.store.append(rec))
                have.add(key(rec))

    def loop(self) -> None:
        order = list(self.configs)
        for label in order:
            self.collect(label)  # what jobs wrote while no submitter watched
        active: dict[str, str] = {}
        for jid, j in self.own_jobs(order).items():  # still queued or running: never submitted twice
            label = j["label"]
            active[label] = jid
            st = self.cs(label)
            st["job"], st["status"] = jid, "submitted"
            self.emit("note", text=f"{label}: job {jid} is still {j['state']}: watched, not submitted again")
        waiting = []
        for label in order:
            if label in active:
                continue
            st = self.cs(label)
            if self.complete(label):
                st["status"] = "done"
                self.emit("config", label=label, what="complete, not submitted")
            elif st["status"] == "failed":
                continue
            elif st["status"] == "cancelled":  # by an interrupted submitter: what its job recorded is kept
                self.emit("note", text=f"{label}: job {st['job']} was cancelled by an interrupted run: submitted again")
                waiting.append(label)
            elif st.get("job") and st["status"] == "submitted":
                if self.finish(label, st["job"]) == "again":
                    waiting.append(label)
            else:
                waiting.append(label)
        self.save()
        while waiting or active:
            while waiting and (not self.spec.max_jobs or len(active) < self.spec.max_jobs):
                label = waiting.pop(0)
                active[label] = self.submit(label)
            time.sleep(self.spec.poll_s)
            queued = self.poll(active)
            if queued is None:
                continue
            for label, jid in list(active.items()):
                if jid in queued:
                    continue
                del active[label]
                if self.finish(label, jid) == "again":
                    waiting.append(label)
            self.save()

    def poll(self, active: dict[str, str]) -> dict[str, dict] | None:
        """own_jobs(active), riding out a squeue that fails for less than SQUEUE_OUTAGE_S (None: ask again); past it
        the campaign stops, its jobs going on for --resume to watch."""
        try:
            queued = self.own_jobs(active)
        except slurmjobs.SlurmCommandError as exc:
            now = time.monotonic()
            if self._squeue_down is None:
                self._squeue_down = now
                self.emit("note", text=f"squeue failed ({exc}): asking again for up to {SQUEUE_OUTAGE_S:g} s")
            if now - self._squeue_down < SQUEUE_OUTAGE_S:
                return None
            raise CampaignStopped(f"squeue has failed for {now - self._squeue_down:.0f} s ({exc}): the jobs "
                                  f"submitted ({', '.join(sorted(active))}) go on, and {self.resume_hint} --slurm "
                                  "watches them") from None
        if self._squeue_down is not None:
            self.emit("note", text=f"squeue answers again after {time.monotonic() - self._squeue_down:.1f} s")
            self._squeue_down = None
        return queued

    def submit(self, label: str) -> str:
        st = self.cs(label)
        excluded = sorted(self.state["excluded"])
        extra = [f"--exclude={','.join(excluded)}"] if excluded else []
        try:
            jid = slurmjobs.submit(self.host, str(self.sdir / f"{label}.sh"), extra)
        except slurmjobs.SlurmCommandError as exc:
            running = [x for x in self.configs if x != label and self.cs(x)["status"] == "submitted"]
            raise CampaignStopped(f"cannot submit {label}: {exc}" + (
                f"; the jobs already submitted ({', '.join(running)}) go on, and {self.resume_hint} --slurm "
                "watches them" if running else "")) from None
        st["job"], st["status"] = jid, "submitted"
        st["jobs"].append(jid)
        self.save()
        self.emit("config", label=label, what=f"submitted as Slurm job {jid}"
                                              + (f" (excluding {', '.join(excluded)})" if excluded else ""))
        return jid

    def finish(self, label: str, jid: str) -> str:
        """A job of `label` left the queue: collect, then done | again (resubmit) | failed (recorded)."""
        st = self.cs(label)
        end = slurmjobs.ended(self.host, jid)
        self.collect(label)
        refused = self.refusal(label, jid)
        if refused is not None and end.node and refused["node"] != end.node:
            # the file names another node than the one Slurm ran the job on: nothing is drained on its word
            self.emit("note", text=f"{label}: refused.json names node {refused['node']}, but Slurm ran job {jid} on "
                                   f"{end.node}: no node drained")
            refused = None
        if refused is not None:
            node = refused["node"]
            act = refused.get("drain")  # the job drained its node before it ended (run_job)
            if not (isinstance(act, dict) and act.get("action") == "drained" and isinstance(act.get("detail"), str)):
                act = drain(self.host, node, str(refused.get("reason") or refused["said"])).to_json()  # it could not
            st["refused"].append({"node": node, "job_id": jid, "said": refused["said"], "drain": act})
            if node not in self.state["excluded"]:
                self.state["excluded"].append(node)
            self.emit("note", text=f"{label}: the gate refused node {node} (job {jid}): {refused['said'][:300]}; "
                                   f"slurm: {act['detail']}")
            if self.complete(label):
                st["status"] = "done"
                return "done"
            if len(st["refused"]) <= self.spec.node_retries:
                return "again"
            nodes = ", ".join(r["node"] for r in st["refused"])
            self.record_missing(label, None, f"not run: the gate refused node(s) {nodes} and slurm.node_retries "
                                             f"({self.spec.node_retries}) resubmissions are spent", jid, node)
            st["status"] = "failed"
            return "failed"
        if self.complete(label):
            st["status"] = "done"
            self.emit("config", label=label, what=f"job {jid} done ({end.describe()})")
            return "done"
        why = end.describe()
        tail = self.output_tail(label, jid)
        st["ended"].append({"job_id": jid, "why": why, "output": tail})
        self.emit("note", text=f"{label}: {why} before every level was recorded" + (f"; its output: {tail}"
                                                                                      if tail else ""))
        if self.camp.on_crash == "restart" and st["restarts"] < 1:
            st["restarts"] += 1
            return "again"
        self.record_missing(label, why + (f"; job output: {tail}" if tail else ""), None, jid, end.node)
        st["status"] = "failed"
        return "failed"

    def refusal(self, label: str, jid: str) -> dict | None:
        path = self.dir / "jobs" / label / "refused.json"
        try:
            r = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        ok = isinstance(r, dict) and str(r.get("job_id")) == jid and isinstance(r.get("node"), str)
        return r if ok and isinstance(r.get("said"), str) else None

    def output_tail(self, label: str, jid: str) -> str:
        try:
            text = (self.sdir / f"{label}-{jid}.out").read_text(errors="replace")
        except OSError:
            return ""
        lines = [x.strip() for x in text.splitlines() if x.strip()]
        return " | ".join(lines[-3:])[:500]

    def record_missing(self, label: str, crash: str | None, skip: str | None, jid: str, node: str | None) -> None:
        """Levels no job recorded: the first `crashed` with Slurm's reason (a job Slurm ended), the rest skipped."""
        have = self.store.keys()
        self.store.provenance_stamp = {"slurm": {"node": node, "job_id": jid}}
        try:
            for lv in self.levels(label):
                if lv.key in have:
                    continue
                if crash:
                    rec = {**lv.spec.head(), "status": CRASHED, "completed": 0, "error": crash}
                    crash, skip = None, f"not run: {crash}"
                else:
                    rec = skipped_record(lv, skip)
                    rec["status"] = ERROR if skip.startswith("not run: the gate refused") else rec["status"]
                self.emit("level_done", record=self.store.append(rec))
        finally:
            self.store.provenance_stamp = {}


def run_slurm_campaign(path: str, out_dir: str, *, resume: bool = False, submit: bool = True,
                       on_event: Callable[..., None] | None = None) -> dict:
    """Load a campaign and run it as Slurm jobs (one per configuration) from this machine; counts by status."""
    camp = load(path)
    if camp.is_remote:
        raise ConfigError(f"--slurm runs each configuration on the node Slurm gives it: the campaign's target must be "
                          f"local, not {camp.target}", path=camp.path, line=camp.target_line)
    check_gate_profile(camp, None)
    return SlurmCampaign(camp, out_dir, on_event=on_event, submit=submit).run(resume)
