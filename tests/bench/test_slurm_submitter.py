"""The submitting side of `bench run --slurm` and the job's own exits, decision by decision, against a fake Slurm that
answers sbatch/squeue/scontrol/scancel as Slurm 22.05 does (fast: no lab; the real cluster's tests are
test_slurm_campaign.py). Each test holds one rule that a broken line of gpudoctor/campaign/slurm.py would
break (bench/mutation.py runs these): a refused.json of another job or another node drains nothing; a resubmission
excludes the refused node; node_retries and max_jobs are counted; a crashed job is restarted once; the job exits 4
when its gate refuses; the job script's python fallback runs isolated (-I)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpudoctor.campaign import file as campaign
from gpudoctor.campaign.slurm import JOB_REFUSED, SlurmCampaign, gpudoctor_command
from gpudoctor.host.base import CommandResult
from tests.bench.conftest import env

BASE = """\
name: demo
model: /models/llama
server: {command: /venv/bin/python -m sglang.launch_server}
tp: [1]
methods: {ar: {baseline: true}}
workloads: [{name: chat, max_tokens: [64]}]
concurrency: [1, 2]
gate: {command: false}
"""


class FakeSlurm:
    """sbatch, squeue, scontrol (show job/node/reservation, update), scancel as a Host's run(); each job leaves the
    queue after `stay` squeue calls, having done what `outcome(label, job, node)` says: ok (every level recorded),
    refuse (refused.json, exit 4), crash (nothing recorded, NODE_FAIL)."""

    def __init__(self, out: Path, nodes=("n1", "n2", "n3"), outcome=None, stay: int = 1):
        self.out, self.nodes, self.stay = out, list(nodes), stay
        self.outcome = outcome or (lambda label, job, node: "ok")
        self.jobs: dict[str, dict] = {}
        self.calls: list[list[str]] = []
        self.drained: dict[str, str] = {}
        self.max_queued = 0
        self.camp: SlurmCampaign | None = None
        self.name = "local"

    def res(self, argv, rc=0, out=""):
        return CommandResult(argv, rc, out, "" if rc == 0 else "error")

    def queued(self):
        return [j for j in self.jobs.values() if j["polls"] < self.stay]

    def run(self, argv, timeout=None, **_kw):
        self.calls.append(list(argv))
        cmd = argv[0]
        if cmd == "sbatch":
            return self.sbatch(argv)
        if cmd == "squeue":
            uid = next(a.split("=")[1] for a in argv if a.startswith("--user="))
            lines = []
            for j in self.queued():
                j["polls"] += 1
                if str(j["uid"]) == uid:
                    lines.append(f"{j['id']}|{j['uid']}|{j['name']}|RUNNING|{j['node']}|None")
            return self.res(argv, out="\n".join(lines))
        if cmd == "scancel":
            return self.res(argv)
        if argv[:3] == ["scontrol", "show", "job"]:
            j = self.jobs[argv[3]]
            return self.res(argv, out=f"JobId={j['id']} JobName={j['name']}\n   JobState={j['state']} Reason=None "
                                      f"ExitCode={j['rc']}:0\n   NodeList={j['node']}\n")
        if argv[:3] == ["scontrol", "show", "node"]:
            node = argv[3]
            state = "IDLE+DRAIN" if node in self.drained else "IDLE"
            reason = f"\n   Reason={self.drained[node]} [root@2026-12-07T06:00:00]" if node in self.drained else ""
            return self.res(argv, out=f"NodeName={node} Arch=x86_64\n   State={state} ThreadsPerCore=1\n"
                                      f"   Version=22.05.8{reason}\n")
        if argv[:3] == ["scontrol", "show", "reservation"]:
            return self.res(argv, out="No reservations in the system\n")
        if argv[:2] == ["scontrol", "update"]:
            kv = dict(a.split("=", 1) for a in argv[2:])
            if kv.get("state") == "drain":
                self.drained[kv["nodename"]] = kv["reason"]
            return self.res(argv)
        raise AssertionError(f"unexpected command {argv}")

    def sbatch(self, argv):
        script = Path(argv[-1])
        label = script.stem
        exclude = {n for a in argv if a.startswith("--exclude=") for n in a.split("=", 1)[1].split(",")}
        node = next(n for n in self.nodes if n not in exclude and n not in self.drained)
        jid = str(len(self.jobs) + 1)
        name = re.search(r"--job-name=(\S+)", script.read_text()).group(1)
        what = self.outcome(label, jid, node)
        d = self.out / "jobs" / label
        d.mkdir(parents=True, exist_ok=True)
        state, rc = "COMPLETED", 0
        if what in ("ok", "ok-refuse"):
            from gpudoctor.bench.records.results import ResultStore

            store = ResultStore(d)
            store.provenance_stamp = {"slurm": {"node": node, "job_id": jid}}
            for lv in self.camp.levels(label):
                if lv.key not in store.keys():
                    store.append({**lv.spec.head(), "status": "ok", "completed": 1})
        if what in ("refuse", "ok-refuse") or isinstance(what, dict):  # a dict: refused.json's fields over these
            fields = {"node": node, "job_id": jid, "said": "gate: BLOCK x", "reason": "BLOCK x"}
            fields.update(what if isinstance(what, dict) else {})
            (d / "refused.json").write_text(json.dumps({k: v for k, v in fields.items() if v is not None}))
            state, rc = "FAILED", JOB_REFUSED
        elif what == "crash":
            state = "NODE_FAIL"
            (self.out / "slurm" / f"{label}-{jid}.out").write_text("starting\nready in 1.0 s\nlost\nNODE_FAIL\n")
        self.jobs[jid] = {"id": jid, "uid": os.getuid(), "name": name, "node": node, "state": state, "rc": rc,
                          "polls": 0, "label": label, "argv": list(argv)}
        self.max_queued = max(self.max_queued, len(self.queued()))
        return self.res(argv, out=f"{jid}\n")

    def sbatches(self, label=None):
        return [j for j in self.jobs.values() if label is None or j["label"] == label]


def run(tmp_path, extra="", outcome=None, stay=1, before=None):
    f = tmp_path / "c.yaml"
    f.write_text(BASE + "slurm:\n  poll_s: 0.1\n" + extra)
    out = tmp_path / "out"
    fake = FakeSlurm(out, outcome=outcome, stay=stay)
    sc = SlurmCampaign(campaign.load(str(f)), str(out), host=fake)
    fake.camp = sc
    notes = []
    fake.events = []  # (kind, what was said): the CLI renders each kind its own way

    def emit(kind, **kw):
        notes.append(kw.get("text") or kw.get("what") or "")
        fake.events.append((kind, kw.get("text") or kw.get("what") or kw.get("record")))

    sc.emit = emit
    if before:
        before(out)
    counts = sc.run(resume=before is not None)
    state = json.loads((out / "slurm" / "state.json").read_text())
    return fake, counts, state, notes


def test_a_refusal_resubmits_excluding_the_node_and_drains_it(tmp_path):
    fake, counts, state, notes = run(tmp_path, outcome=lambda label, job, node: "refuse" if node == "n1" else "ok")
    assert "submitted as Slurm job 1" in notes and "submitted as Slurm job 2 (excluding n1)" in notes, notes
    assert any(n.startswith("ar-tp1: the gate refused node n1 (job 1): gate: BLOCK x; slurm: n1 drained") for n in notes)
    assert "job 2 done (Slurm job 2 COMPLETED on n2 ExitCode=0:0)" in notes, notes
    jobs = fake.sbatches()
    assert [j["node"] for j in jobs] == ["n1", "n2"]
    assert "--exclude=n1" in jobs[1]["argv"] and not any(a.startswith("--exclude") for a in jobs[0]["argv"])
    assert fake.drained == {"n1": "gpudoctor: bench gate: BLOCK x"}
    assert counts["ok"] == 2 and state["excluded"] == ["n1"]
    assert [r["node"] for r in state["configs"]["ar-tp1"]["refused"]] == ["n1"]


def test_a_refused_json_of_another_job_drains_nothing(tmp_path):
    def stale(out):  # an earlier job's refusal on the node this job then runs on (a resumed directory)
        d = out / "jobs" / "ar-tp1"
        d.mkdir(parents=True)
        (d / "refused.json").write_text(json.dumps({"node": "n1", "job_id": "999", "said": "old", "reason": "old"}))

    fake, counts, state, _ = run(tmp_path, before=stale)
    assert fake.drained == {} and state["configs"]["ar-tp1"]["refused"] == [] and counts["ok"] == 2
    assert state["configs"]["ar-tp1"]["status"] == "done"


def test_a_refused_json_naming_another_node_than_slurm_drains_nothing(tmp_path):
    def lying(label, job, node):
        d = tmp_path / "out" / "jobs" / label
        d.mkdir(parents=True, exist_ok=True)
        (d / "refused.json").write_text(json.dumps({"node": "n3", "job_id": job, "said": "no", "reason": "no"}))
        return "crash"

    fake, counts, state, notes = run(tmp_path, outcome=lying)
    assert fake.drained == {} and state["configs"]["ar-tp1"]["refused"] == [] and state["excluded"] == []
    assert ("note", "ar-tp1: refused.json names node n3, but Slurm ran job 1 on n1: no node drained") in fake.events, \
        notes
    assert counts["crashed"] == 1 and counts["skipped"] == 1


@pytest.mark.parametrize("retries", [0, 1, 2])
def test_node_retries_resubmissions_then_the_levels_are_errors(tmp_path, retries):
    fake, counts, state, _ = run(tmp_path, extra=f"  node_retries: {retries}\n",
                                 outcome=lambda label, job, node: "refuse", )
    assert len(fake.sbatches()) == retries + 1
    assert counts == {"ok": 0, "crashed": 0, "error": 2, "skipped": 0}
    st = state["configs"]["ar-tp1"]
    assert st["status"] == "failed" and len(st["refused"]) == retries + 1
    recs = [json.loads(x) for x in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    nodes = ", ".join(["n1", "n2", "n3"][:retries + 1])
    assert all(r["error"] == f"not run: the gate refused node(s) {nodes} and slurm.node_retries ({retries}) "
               "resubmissions are spent" for r in recs), recs[0]["error"]


def test_max_jobs_bounds_the_jobs_in_the_queue(tmp_path):
    methods = "methods: {ar: {baseline: true}, b: {}, c: {}, d: {}}\n"
    f_extra = "  max_jobs: 2\n"
    (tmp_path / "x").mkdir()
    global BASE
    saved = BASE
    BASE = BASE.replace("methods: {ar: {baseline: true}}\n", methods)
    try:
        fake, counts, _, _ = run(tmp_path, extra=f_extra, stay=3)
        assert fake.max_queued == 2 and len(fake.sbatches()) == 4 and counts["ok"] == 8
        fake, counts, _, _ = run(tmp_path / "x", stay=3)  # max_jobs 0: all at once
        assert fake.max_queued == 4 and counts["ok"] == 8
    finally:
        BASE = saved


@pytest.mark.parametrize("on_crash,jobs", [("restart", 2), ("skip", 1)])
def test_a_job_slurm_ended_is_submitted_again_once_with_on_crash_restart(tmp_path, on_crash, jobs):
    fake, counts, state, notes = run(tmp_path.joinpath(), extra=f"on_crash: {on_crash}\n",
                                     outcome=lambda label, job, node: "crash")
    assert len(fake.sbatches()) == jobs  # restarted once, never twice
    st = state["configs"]["ar-tp1"]
    assert st["ended"][0]["output"] == "ready in 1.0 s | lost | NODE_FAIL"  # the job output's last lines
    assert ("ar-tp1: Slurm job 1 NODE_FAIL on n1 ExitCode=0:0 before every level was recorded; its output: ready in "
            "1.0 s | lost | NODE_FAIL") in notes, notes
    assert st["restarts"] == jobs - 1 and len(st["ended"]) == jobs and st["status"] == "failed"
    assert counts == {"ok": 0, "crashed": 1, "error": 0, "skipped": 1}
    assert "NODE_FAIL" in st["ended"][-1]["why"]


def test_a_job_crashed_once_then_complete_is_done_with_restart(tmp_path):
    n = []

    def once(label, job, node):
        n.append(job)
        return "crash" if len(n) == 1 else "ok"

    fake, counts, state, _ = run(tmp_path, extra="on_crash: restart\n", outcome=once)
    assert len(fake.sbatches()) == 2 and counts["ok"] == 2 and state["configs"]["ar-tp1"]["status"] == "done"


def test_the_job_exits_4_when_its_gate_refuses_the_node(tmp_path):
    """`bench job` as the job script runs it, gate `false`, a stand-in scontrol on PATH that fails (no Slurm
    here): exit 4 and refused.json naming the node and the job."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "scontrol").write_text("#!/bin/sh\necho 'slurm_load_node error: Unable to contact' >&2\nexit 1\n")
    (bindir / "scontrol").chmod(0o755)
    (tmp_path / "model").mkdir()
    f = tmp_path / "c.yaml"
    f.write_text(BASE.replace("/models/llama", str(tmp_path / "model")).replace("gate: {command: false}",
                                                                                 "gate: {command: 'false'}"))
    out = tmp_path / "out"
    out.mkdir()
    e = {**env(), "PATH": f"{bindir}:{os.environ['PATH']}", "SLURMD_NODENAME": "n7", "SLURM_JOB_ID": "42"}
    p = subprocess.run([sys.executable, "-m", "gpudoctor", "bench", "job", str(f), "--out", str(out), "--config",
                        "ar-tp1"], capture_output=True, text=True, env=e, timeout=120, cwd=tmp_path)
    assert JOB_REFUSED == 4 and p.returncode == 4, p.stderr[-2000:]
    assert "the gate refused node n7 for ar-tp1" in p.stderr
    r = json.loads((out / "jobs" / "ar-tp1" / "refused.json").read_text())
    assert r["node"] == "n7" and r["job_id"] == "42" and r["drain"]["action"] == "failed"


def test_the_job_scripts_python_fallback_is_isolated(tmp_path, monkeypatch):
    py = tmp_path / "python3"  # an interpreter with no gpudoctor console script beside it
    py.symlink_to(sys.executable)
    monkeypatch.setattr(sys, "executable", str(py))
    argv = gpudoctor_command()
    assert argv[0] == str(py) and "-I" in argv and argv[-2:] == ["-m", "gpudoctor"]
    (tmp_path / "gpudoctor").write_text("#!/bin/sh\n")
    (tmp_path / "gpudoctor").chmod(0o755)
    assert gpudoctor_command() == [str(tmp_path / "gpudoctor")]


def test_the_python_fallback_also_when_the_console_script_is_not_executable(tmp_path, monkeypatch):
    py = tmp_path / "python3"
    py.symlink_to(sys.executable)
    (tmp_path / "gpudoctor").write_text("#!/bin/sh\n")  # there, but not executable: not run
    monkeypatch.setattr(sys, "executable", str(py))
    assert gpudoctor_command()[-2:] == ["-m", "gpudoctor"]


@pytest.mark.parametrize("section,want,unwanted", [
    ("", ["--gpus=1", "--exclusive"], ["--gres=gpu:1"]),
    ("  gpu_request: none\n  exclusive: false\n", [], ["--gpus=1", "--gres=gpu:1", "--exclusive"]),
], ids=["defaults", "none-shared"])
def test_the_scripts_gpu_request_and_exclusive(tmp_path, section, want, unwanted):
    from gpudoctor.campaign.slurm import job_script

    f = tmp_path / "c.yaml"
    f.write_text(BASE + "slurm:\n  poll_s: 1\n" + section)
    c = campaign.load(str(f))
    sb = [x.split(" ", 1)[1] for x in job_script(c, c.configs()[0], tmp_path / "o", "j", "i").splitlines()
          if x.startswith("#SBATCH ")]
    assert all(w in sb for w in want) and not any(u in sb for u in unwanted), sb


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("case,message", [
    ("remote", "c.yaml: bench job runs a configuration on this node: the campaign's target must be local"),
    ("label", "no configuration 'nope-tp1' in the campaign (it has ar-tp1)"),
    ("profile", "gate.command: unknown gate profile 'nosuch'"),
    ("other", "holds another campaign"),
    ("model", "does not exist on local"),
])
def test_bench_job_refuses_before_it_writes_anything(tmp_path, case, message):
    from gpudoctor.campaign.slurm import run_job
    from gpudoctor.errors import GpudoctorError

    (tmp_path / "model").mkdir()
    text = BASE.replace("/models/llama", str(tmp_path / "model"))
    if case == "remote":
        text += "target: ct200\n"
    elif case == "profile":
        text = text.replace("gate: {command: false}", "gate: {command: gpudoctor gate --profile nosuch}")
    elif case == "model":
        text = text.replace(str(tmp_path / "model"), str(tmp_path / "gone"))
    f = tmp_path / "c.yaml"
    f.write_text(text)
    out = tmp_path / "out"
    out.mkdir()
    if case == "other":
        (out / "campaign.yaml").write_text(text.replace("name: demo", "name: demo2"))
    before, n = sorted(p.name for p in out.iterdir()), fds()
    with pytest.raises(GpudoctorError) as exc:
        run_job(str(f), str(out), "nope-tp1" if case == "label" else "ar-tp1")
    assert message in exc.value.one_line(), exc.value.one_line()
    assert sorted(p.name for p in out.iterdir()) == before and fds() == n  # nothing written, no fd left open


def test_no_submit_keeps_the_campaign_id_and_copies_the_campaign(tmp_path):
    from gpudoctor.campaign.slurm import run_slurm_campaign

    f = tmp_path / "c.yaml"
    f.write_text(BASE + "slurm:\n  poll_s: 1\n")
    out = tmp_path / "out"
    notes = []
    counts = run_slurm_campaign(str(f), str(out), submit=False, on_event=lambda k, **kw: notes.append(kw))
    assert counts == {"ok": 0, "crashed": 0, "error": 0, "skipped": 0}
    state = json.loads((out / "slurm" / "state.json").read_text())
    cid = state["campaign_id"]
    assert state["configs"]["ar-tp1"]["status"] == "pending" and state["configs"]["ar-tp1"]["jobs"] == []
    assert (out / "campaign.yaml").read_text() == f.read_text() and (out / "campaign.json").exists()
    assert any(n.get("text", "").startswith(f"Slurm campaign {cid}: 1 configuration(s), job scripts in")
               for n in notes), notes
    script = (out / "slurm" / "ar-tp1.sh").read_text()
    run_slurm_campaign(str(f), str(out), submit=False, resume=True)
    assert json.loads((out / "slurm" / "state.json").read_text())["campaign_id"] == cid
    assert (out / "slurm" / "ar-tp1.sh").read_text() == script  # the same job name: the same campaign


def test_a_run_without_resume_into_a_slurm_campaign_is_refused(tmp_path):
    from gpudoctor.campaign.slurm import run_slurm_campaign
    from gpudoctor.errors import InputError

    f = tmp_path / "c.yaml"
    f.write_text(BASE + "slurm:\n  poll_s: 1\n")
    run_slurm_campaign(str(f), str(tmp_path / "out"), submit=False)
    with pytest.raises(InputError) as exc:
        run_slurm_campaign(str(f), str(tmp_path / "out"), submit=False)
    assert exc.value.one_line() == (f"{tmp_path / 'out'}: holds a Slurm campaign (slurm/state.json): pass --resume to "
                                    "continue it, or choose another --out")


@pytest.mark.parametrize("sig,code", [("INT", 130), ("TERM", 143)])
def test_an_interrupted_submitter_cancels_its_own_jobs_only(tmp_path, sig, code):
    import signal as signals

    from gpudoctor.campaign.slurm import Interrupted

    f = tmp_path / "c.yaml"
    f.write_text(BASE + "slurm:\n  poll_s: 0.1\n")
    out = tmp_path / "out"
    fake = FakeSlurm(out, stay=100)
    real = fake.run
    polls = []

    def run(argv, timeout=None, **kw):
        if argv[0] == "squeue":
            polls.append(1)
            if len(polls) == 2:  # the job is running: the user interrupts
                if sig == "INT":
                    raise KeyboardInterrupt
                os.kill(os.getpid(), signals.SIGTERM)
        return real(argv, timeout, **kw)

    fake.run = run
    sc = SlurmCampaign(campaign.load(str(f)), str(out), host=fake)
    fake.camp = sc
    old = signals.getsignal(signals.SIGTERM)
    with pytest.raises(Interrupted) as exc:
        sc.run(resume=False)
    assert signals.getsignal(signals.SIGTERM) == old  # put back
    assert exc.value.exit_code == code and "cancelled this campaign's 1 job(s) (1)" in exc.value.one_line()
    assert [c for c in fake.calls if c[0] == "scancel"] == [["scancel", f"--user={os.getuid()}", "1"]]
    st = json.loads((out / "slurm" / "state.json").read_text())["configs"]["ar-tp1"]
    assert st["status"] == "cancelled"


def test_a_submitted_job_is_on_disk_before_the_submitter_waits(tmp_path):
    """Killed right after its first sbatch (as SIGKILL would, no finally runs), the submitter has already recorded
    the job id: --resume watches that job instead of submitting the configuration twice."""

    class Killed(BaseException):
        pass

    f = tmp_path / "c.yaml"
    f.write_text(BASE + "slurm:\n  poll_s: 0.1\n")
    out = tmp_path / "out"
    fake = FakeSlurm(out, stay=100)
    real = fake.run

    def run_(argv, timeout=None, **kw):
        if argv[0] == "squeue" and fake.jobs:
            raise Killed
        return real(argv, timeout, **kw)

    fake.run = run_
    sc = SlurmCampaign(campaign.load(str(f)), str(out), host=fake)
    fake.camp = sc
    with pytest.raises(Killed):
        sc.run(resume=False)
    st = json.loads((out / "slurm" / "state.json").read_text())["configs"]["ar-tp1"]
    assert st["jobs"] == ["1"] and st["job"] == "1" and st["status"] == "submitted"


def test_an_unknown_gate_profile_stops_the_submitter_before_anything(tmp_path):
    from gpudoctor.campaign.slurm import run_slurm_campaign
    from gpudoctor.errors import ConfigError

    f = tmp_path / "c.yaml"
    f.write_text(BASE.replace("gate: {command: false}", "gate: {command: gpudoctor gate --profile nosuch}")
                 + "slurm:\n  poll_s: 1\n")
    with pytest.raises(ConfigError, match="gate.command: unknown gate profile 'nosuch'"):
        run_slurm_campaign(str(f), str(tmp_path / "out"), submit=False)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("text,message", [("{", "is not JSON"), ('{"x": 1}', "is not a gpudoctor Slurm campaign state")])
def test_a_broken_state_file_is_one_line(tmp_path, text, message):
    from gpudoctor.campaign.slurm import run_slurm_campaign
    from gpudoctor.errors import InputError

    f = tmp_path / "c.yaml"
    f.write_text(BASE + "slurm:\n  poll_s: 1\n")
    out = tmp_path / "out"
    run_slurm_campaign(str(f), str(out), submit=False)
    (out / "slurm" / "state.json").write_text(text)
    with pytest.raises(InputError) as exc:
        run_slurm_campaign(str(f), str(out), submit=False, resume=True)
    assert exc.value.one_line().startswith(f"{out / 'slurm' / 'state.json'}: {message}"), exc.value.one_line()


def test_resume_collects_what_a_hand_submitted_job_recorded_and_submits_nothing(tmp_path):
    from gpudoctor.campaign.slurm import run_slurm_campaign
    from gpudoctor.bench.records.results import ResultStore

    f = tmp_path / "c.yaml"
    f.write_text(BASE + "slurm:\n  poll_s: 0.1\n")
    out = tmp_path / "out"
    run_slurm_campaign(str(f), str(out), submit=False)

    def by_hand(out_):  # a person ran the script: the job's records, no job id in state.json
        fake0 = FakeSlurm(out_)
        sc0 = SlurmCampaign(campaign.load(str(f)), str(out_), host=fake0)
        sc0.configs = {c.label: c for c in sc0.camp.configs()}
        store = ResultStore(out_ / "jobs" / "ar-tp1")
        for lv in sc0.levels("ar-tp1"):
            store.append({**lv.spec.head(), "status": "ok", "completed": 1})

    fake, counts, state, notes = run(tmp_path, before=by_hand)
    assert fake.sbatches() == [] and counts["ok"] == 2 and ("config", "complete, not submitted") in fake.events, notes
    assert state["configs"]["ar-tp1"]["status"] == "done"


def test_resume_watches_a_recorded_job_still_in_the_queue(tmp_path):
    def queued(out_):
        st = json.loads((out_ / "slurm" / "state.json").read_text())
        st["configs"]["ar-tp1"].update(job="1", jobs=["1"], status="submitted")
        (out_ / "slurm" / "state.json").write_text(json.dumps(st))

    f = tmp_path / "c.yaml"
    f.write_text(BASE + "slurm:\n  poll_s: 0.1\n")
    from gpudoctor.campaign.slurm import run_slurm_campaign

    run_slurm_campaign(str(f), str(tmp_path / "out"), submit=False)
    out = tmp_path / "out"
    fake = FakeSlurm(out, stay=2)
    sc = SlurmCampaign(campaign.load(str(f)), str(out), host=fake)
    fake.camp = sc
    queued(out)
    script = (out / "slurm" / "ar-tp1.sh")
    sc.configs = {c.label: c for c in sc.camp.configs()}
    fake.sbatch(["sbatch", "--parsable", str(script)])  # job 1, the killed submitter's, still running
    notes = []
    sc.emit = lambda kind, **kw: notes.append(kw.get("text") or kw.get("what") or "")
    counts = sc.run(resume=True)
    assert len(fake.sbatches()) == 1 and counts["ok"] == 2
    assert "ar-tp1: job 1 is still RUNNING: watched, not submitted again" in notes, notes


def test_a_failed_cancel_says_so(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text(BASE + "slurm:\n  poll_s: 0.1\n")
    out = tmp_path / "out"
    fake = FakeSlurm(out, stay=100)
    real = fake.run
    polls = []

    def run_(argv, timeout=None, **kw):
        if argv[0] == "scancel":
            return fake.res(argv, rc=1)
        if argv[0] == "squeue":
            polls.append(1)
            if len(polls) == 2:
                raise KeyboardInterrupt
        return real(argv, timeout, **kw)

    fake.run = run_
    sc = SlurmCampaign(campaign.load(str(f)), str(out), host=fake)
    fake.camp = sc
    from gpudoctor.campaign.slurm import Interrupted

    with pytest.raises(Interrupted) as exc:
        sc.run(resume=False)
    assert "cancelling jobs 1 failed: $ scancel" in exc.value.one_line(), exc.value.one_line()
    st = json.loads((out / "slurm" / "state.json").read_text())["configs"]["ar-tp1"]
    assert st["status"] == "submitted"  # not cancelled: --resume watches it


def test_sbatch_refusing_stops_the_campaign_naming_the_jobs_that_go_on(tmp_path):
    from gpudoctor.campaign.runner import CampaignStopped

    f = tmp_path / "c.yaml"
    f.write_text(three_methods() + "slurm:\n  poll_s: 0.1\n")
    out = tmp_path / "out"
    fake = FakeSlurm(out, stay=100)
    real = fake.run
    fake.run = lambda argv, timeout=None, **kw: (fake.res(argv, rc=1) if argv[0] == "sbatch" and fake.jobs
                                                 else real(argv, timeout, **kw))
    sc = SlurmCampaign(campaign.load(str(f)), str(out), host=fake)
    fake.camp = sc
    with pytest.raises(CampaignStopped) as exc:
        sc.run(resume=False)
    line = exc.value.one_line()
    assert line.startswith("cannot submit b-tp1: $ sbatch --parsable") and "; the jobs already submitted (ar-tp1) go on" \
        in line and "--resume --slurm watches them" in line, line


# ---- round 8: each rule the mutation survivors of round 7 showed unheld (bench/mutation.py campaign/slurm) -----------
def three_methods():
    return BASE.replace("methods: {ar: {baseline: true}}", "methods: {ar: {baseline: true}, b: {}, c: {}}")


def prepared(tmp_path, text=BASE, edit=None):
    """A campaign written with --no-submit (its state.json, its scripts), state.json then edited as `edit` says:
    the directory a killed or interrupted submitter left behind."""
    from gpudoctor.campaign.slurm import run_slurm_campaign

    f = tmp_path / "c.yaml"
    f.write_text(text + "slurm:\n  poll_s: 0.1\n")
    out = tmp_path / "out"
    run_slurm_campaign(str(f), str(out), submit=False)
    st = json.loads((out / "slurm" / "state.json").read_text())
    if edit:
        edit(st)
    (out / "slurm" / "state.json").write_text(json.dumps(st))
    return f, out, st


def resumed(f, out, fake, before=None):
    sc = SlurmCampaign(campaign.load(str(f)), str(out), host=fake)
    fake.camp = sc
    sc.configs = {c.label: c for c in sc.camp.configs()}
    notes, fake.events = [], []

    def emit(kind, **kw):
        notes.append(kw.get("text") or kw.get("what") or "")
        fake.events.append((kind, kw.get("text") or kw.get("what") or kw.get("record")))

    sc.emit = emit
    if before:
        before(sc)
    counts = sc.run(resume=True)
    return counts, json.loads((out / "slurm" / "state.json").read_text()), notes


def old_job(fake, sc, jid, label, node, state, polls=1, stay=None):
    """A job Slurm ran before this submitter started: in the queue while polls < stay, then ended as `state`."""
    cid = json.loads((fake.out / "slurm" / "state.json").read_text())["campaign_id"]
    fake.jobs[jid] = {"id": jid, "uid": os.getuid(), "name": f"gpd-{cid}-{label}", "node": node, "state": state,
                      "rc": 0, "polls": polls, "label": label, "argv": []}


@pytest.mark.parametrize("on_crash", ["restart", "skip"])
def test_a_job_that_ended_while_no_submitter_watched_is_judged_on_resume(tmp_path, on_crash):
    f, out, _ = prepared(tmp_path, BASE + f"on_crash: {on_crash}\n",
                         lambda st: st["configs"]["ar-tp1"].update(job="1", jobs=["1"], status="submitted"))
    long = "c" * 600
    (out / "slurm" / "ar-tp1-1.out").write_bytes(b"starting\na\nb\xff\n" + long.encode() + b"\n")
    fake = FakeSlurm(out)
    counts, state, notes = resumed(f, out, fake, lambda sc: old_job(fake, sc, "1", "ar-tp1", "n2", "NODE_FAIL"))
    st = state["configs"]["ar-tp1"]
    tail = ("a | b\ufffd | " + long)[:500]
    assert st["ended"][0] == {"job_id": "1", "why": "Slurm job 1 NODE_FAIL on n2 ExitCode=0:0", "output": tail}
    assert ("note", f"ar-tp1: Slurm job 1 NODE_FAIL on n2 ExitCode=0:0 before every level was recorded; its output: "
                    f"{tail}") in fake.events
    if on_crash == "restart":  # submitted once more: the new job records every level
        assert [j["id"] for j in fake.sbatches()] == ["1", "2"] and fake.jobs["2"]["argv"][-1].endswith("ar-tp1.sh")
        assert counts["ok"] == 2 and st["jobs"] == ["1", "2"] and st["restarts"] == 1 and st["status"] == "done"
        return
    assert fake.sbatches() == [fake.jobs["1"]] and st["status"] == "failed" and st["restarts"] == 0
    assert counts == {"ok": 0, "crashed": 1, "error": 0, "skipped": 1}
    recs = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert recs[0]["status"] == "crashed" and recs[0]["completed"] == 0
    assert recs[0]["error"] == f"Slurm job 1 NODE_FAIL on n2 ExitCode=0:0; job output: {tail}"
    assert recs[1]["status"] == "skipped" and recs[1]["error"].startswith("not run: Slurm job 1 NODE_FAIL on n2")
    assert all(r["provenance"]["slurm"] == {"node": "n2", "job_id": "1"} for r in recs)
    assert [k for k, _ in fake.events if k == "level_done"] == ["level_done"] * 2


def test_a_crashed_job_without_output_says_nothing_of_it(tmp_path):
    f, out, _ = prepared(tmp_path, edit=lambda st: st["configs"]["ar-tp1"].update(job="1", jobs=["1"],
                                                                                  status="submitted"))
    fake = FakeSlurm(out)
    counts, state, _ = resumed(f, out, fake, lambda sc: old_job(fake, sc, "1", "ar-tp1", "n2", "NODE_FAIL"))
    assert state["configs"]["ar-tp1"]["ended"][0]["output"] == ""
    recs = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert recs[0]["error"] == "Slurm job 1 NODE_FAIL on n2 ExitCode=0:0"


def test_a_crash_after_some_levels_records_only_the_missing_ones(tmp_path):
    from gpudoctor.bench.records.results import ResultStore

    f, out, _ = prepared(tmp_path, edit=lambda st: st["configs"]["ar-tp1"].update(job="1", jobs=["1"],
                                                                                  status="submitted"))
    fake = FakeSlurm(out)

    def first_level(sc):
        old_job(fake, sc, "1", "ar-tp1", "n2", "NODE_FAIL")
        lv = sc.levels("ar-tp1")[0]
        ResultStore(out / "jobs" / "ar-tp1").append({**lv.spec.head(), "status": "ok", "completed": 1})

    counts, state, _ = resumed(f, out, fake, first_level)
    assert counts == {"ok": 1, "crashed": 1, "error": 0, "skipped": 0}
    recs = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert [(r["concurrency"], r["status"]) for r in recs] == [(1, "ok"), (2, "crashed")]


def test_resume_submits_a_cancelled_configuration_again_and_never_a_failed_one(tmp_path):
    def edit(st):
        st["configs"]["ar-tp1"].update(status="failed")
        st["configs"]["b-tp1"].update(job="1", jobs=["1"], status="cancelled")

    f, out, _ = prepared(tmp_path, three_methods(), edit)
    fake = FakeSlurm(out)
    counts, state, notes = resumed(f, out, fake, lambda sc: old_job(fake, sc, "1", "b-tp1", "n1", "CANCELLED"))
    assert [j["label"] for j in fake.sbatches()[1:]] == ["b-tp1", "c-tp1"]
    assert ("note", "b-tp1: job 1 was cancelled by an interrupted run: submitted again") in fake.events
    assert state["configs"]["ar-tp1"]["status"] == "failed" and state["configs"]["ar-tp1"]["jobs"] == []
    assert state["configs"]["b-tp1"]["jobs"] == ["1", "2"] and counts["ok"] == 4


def test_resume_watches_a_queued_job_and_submits_the_configurations_after_it(tmp_path):
    f, out, _ = prepared(tmp_path, three_methods(),
                         lambda st: st["configs"]["ar-tp1"].update(job="1", jobs=["1"], status="submitted"))
    fake = FakeSlurm(out)
    counts, state, _ = resumed(f, out, fake, lambda sc: old_job(fake, sc, "1", "ar-tp1", "n1", "COMPLETED", 0,
                                                                 fake.stay))
    assert [j["label"] for j in fake.sbatches()[1:]] == ["b-tp1", "c-tp1"]
    assert ("note", "ar-tp1: job 1 is still RUNNING: watched, not submitted again") in fake.events


def test_a_job_still_queued_is_on_disk_as_the_configurations_job_before_the_submitter_waits(tmp_path):
    """A cancel whose job had not left the queue yet (scancel returns first): --resume watches that job, and says so
    in state.json before it waits, so a submitter killed then (SIGKILL: no finally) leaves it watched, not lost."""

    class Killed(BaseException):
        pass

    f, out, _ = prepared(tmp_path, edit=lambda st: st["configs"]["ar-tp1"].update(job=None, jobs=["1"],
                                                                                  status="cancelled"))
    fake = FakeSlurm(out, stay=100)
    real, polls = fake.run, []

    def run_(argv, timeout=None, **kw):
        if argv[0] == "squeue":
            polls.append(1)
            if len(polls) == 2:
                raise Killed
        return real(argv, timeout, **kw)

    fake.run = run_
    with pytest.raises(Killed):
        resumed(f, out, fake, lambda sc: old_job(fake, sc, "1", "ar-tp1", "n1", "COMPLETED", 0))
    st = json.loads((out / "slurm" / "state.json").read_text())["configs"]["ar-tp1"]
    assert st["job"] == "1" and st["status"] == "submitted" and fake.sbatches() == [fake.jobs["1"]]


def test_no_submit_resume_collects_each_record_once_and_says_what_is_left(tmp_path):
    from gpudoctor.campaign.slurm import run_slurm_campaign

    text = BASE.replace("methods: {ar: {baseline: true}}", "methods: {ar: {baseline: true}, b: {}}")
    f, out, _ = prepared(tmp_path, text)
    sc = SlurmCampaign(campaign.load(str(f)), str(out), host=FakeSlurm(out))
    sc.configs = {c.label: c for c in sc.camp.configs()}
    d = out / "jobs" / "ar-tp1"
    d.mkdir(parents=True)
    lines = [json.dumps({**lv.spec.head(), "status": "ok", "completed": 1}) for lv in sc.levels("ar-tp1")]
    (d / "results.jsonl").write_text("\n".join([lines[0], *lines]) + "\n")  # a level written twice by two jobs
    events = []
    counts = run_slurm_campaign(str(f), str(out), submit=False, resume=True,
                                on_event=lambda kind, **kw: events.append((kind, kw.get("label"), kw.get("what"))))
    assert counts == {"ok": 2, "crashed": 0, "error": 0, "skipped": 0}
    assert len((out / "results.jsonl").read_text().splitlines()) == 2
    assert [k for k, _, _ in events].count("level_done") == 2
    assert ("config", "ar-tp1", "complete") in events
    assert ("config", "b-tp1", f"not complete: sbatch {out}/slurm/b-tp1.sh") in events


@pytest.mark.parametrize("name,prefix", [("demo", "demo"), ("my demo/x", "my_demo_x"),
                                         ("a" * 30, "a" * 24)])
def test_the_campaign_id_is_the_name_made_one_word_then_random(tmp_path, name, prefix):
    f, out, st = prepared(tmp_path, BASE.replace("name: demo", f"name: '{name}'"))
    assert re.fullmatch(re.escape(prefix) + "-[0-9a-f]{8}", st["campaign_id"]), st["campaign_id"]
    assert st["configs"]["ar-tp1"] == {"job": None, "jobs": [], "refused": [], "ended": [], "restarts": 0,
                                       "status": "pending"}
    assert (out / "slurm" / "ar-tp1.sh").stat().st_mode & 0o7777 == 0o700


@pytest.mark.parametrize("drain,drains_again", [({"action": "drained", "detail": "n1 drained by the job"}, False),
                                               ({"action": "failed", "detail": "no rights"}, True),
                                               ({"action": "drained"}, True), ("drained", True)])
def test_the_submitter_drains_a_refused_node_only_when_the_job_could_not(tmp_path, drain, drains_again):
    fake, counts, state, notes = run(
        tmp_path, outcome=lambda label, job, node: {"drain": drain} if node == "n1" else "ok")
    r = state["configs"]["ar-tp1"]["refused"]
    assert [x["job_id"] for x in r] == ["1"] and r[0]["node"] == "n1" and r[0]["said"] == "gate: BLOCK x"
    if drains_again:
        assert fake.drained == {"n1": "gpudoctor: bench gate: BLOCK x"} and r[0]["drain"]["action"] == "drained"
    else:
        assert fake.drained == {} and r[0]["drain"] == drain
        assert ("note", "ar-tp1: the gate refused node n1 (job 1): gate: BLOCK x; slurm: n1 drained by the job") \
            in fake.events
        assert ("note", "node n1 refused by the gate for ar-tp1: gate: BLOCK x (n1 drained by the job)") in fake.events
    assert counts["ok"] == 2 and state["excluded"] == ["n1"]


def test_a_refusal_without_the_gates_reason_drains_with_what_it_said(tmp_path):
    fake, _, _, _ = run(tmp_path, outcome=lambda label, job, node: {"reason": None} if node == "n1" else "ok")
    assert fake.drained == {"n1": "gpudoctor: bench gate: gate: BLOCK x"}


def test_a_refused_job_that_recorded_every_level_is_done_not_resubmitted(tmp_path):
    fake, counts, state, _ = run(tmp_path, outcome=lambda label, job, node: "ok-refuse")
    assert len(fake.sbatches()) == 1 and counts["ok"] == 2 and fake.drained.keys() == {"n1"}
    assert state["configs"]["ar-tp1"]["status"] == "done" and state["excluded"] == ["n1"]


def test_the_runs_events_are_of_their_kinds(tmp_path):
    fake, _, state, _ = run(tmp_path)
    cid = state["campaign_id"]
    assert ("note", f"Slurm campaign {cid}: 1 configuration(s), job scripts in {tmp_path / 'out' / 'slurm'}") \
        in fake.events
    assert ("config", "submitted as Slurm job 1") in fake.events
    assert ("config", "job 1 done (Slurm job 1 COMPLETED on n1 ExitCode=0:0)") in fake.events
    assert [k for k, _ in fake.events].count("level_done") == 2


def test_run_slurm_campaign_submits_by_default(tmp_path, monkeypatch):
    from gpudoctor.campaign import slurm
    from gpudoctor.campaign.slurm import run_slurm_campaign

    f = tmp_path / "c.yaml"
    f.write_text(BASE + "slurm:\n  poll_s: 0.1\n")
    fake = FakeSlurm(tmp_path / "out", outcome=lambda label, job, node: "crash")
    monkeypatch.setattr(slurm, "local_host", lambda: fake)
    assert run_slurm_campaign(str(f), str(tmp_path / "out"))["crashed"] == 1 and len(fake.sbatches()) == 1


def test_a_second_sigterm_while_cancelling_does_not_stop_the_cancel(tmp_path):
    import signal as signals

    from gpudoctor.campaign.slurm import Interrupted

    f = tmp_path / "c.yaml"
    f.write_text(BASE + "slurm:\n  poll_s: 0.1\n")
    out = tmp_path / "out"
    fake = FakeSlurm(out, stay=100)
    real, polls = fake.run, []

    def run_(argv, timeout=None, **kw):
        if argv[0] == "squeue":
            polls.append(1)
            if len(polls) == 2:
                os.kill(os.getpid(), signals.SIGTERM)
        if argv[0] == "scancel":  # systemd's stop, or an impatient user: TERM again
            os.kill(os.getpid(), signals.SIGTERM)
        return real(argv, timeout, **kw)

    fake.run = run_
    sc = SlurmCampaign(campaign.load(str(f)), str(out), host=fake)
    fake.camp = sc
    with pytest.raises(Interrupted) as exc:
        sc.run(resume=False)
    assert exc.value.exit_code == 143 and "cancelled this campaign's 1 job(s) (1)" in exc.value.one_line()


def test_an_interrupted_submitter_that_cannot_list_its_jobs_says_so(tmp_path):
    from gpudoctor.campaign.slurm import Interrupted

    f = tmp_path / "c.yaml"
    f.write_text(BASE + "slurm:\n  poll_s: 0.1\n")
    out = tmp_path / "out"
    fake = FakeSlurm(out, stay=100)
    real, polls = fake.run, []

    def run_(argv, timeout=None, **kw):
        if argv[0] == "squeue":
            polls.append(1)
            if len(polls) == 2:
                raise KeyboardInterrupt
            if len(polls) > 2:
                return fake.res(argv, rc=1)
        return real(argv, timeout, **kw)

    fake.run = run_
    sc = SlurmCampaign(campaign.load(str(f)), str(out), host=fake)
    fake.camp = sc
    with pytest.raises(Interrupted) as exc:
        sc.run(resume=False)
    line = exc.value.one_line()
    assert line.startswith("interrupted (SIGINT): could not list this campaign's jobs to cancel them ($ squeue"), line
    assert not [c for c in fake.calls if c[0] == "scancel"]


def test_the_refused_job_drains_its_node_with_the_gates_reason_and_keeps_what_earlier_jobs_recorded(tmp_path):
    """`bench job` into a job directory an earlier job of the configuration wrote (resumed, not refused as "holds
    results"), its gate refusing: the node drained by the job with the gate's reason (a stand-in scontrol that keeps
    the drain), refused.json naming the node, the job, what was said, the reason, the drain and when."""
    import time

    from gpudoctor.bench.records.results import ResultStore

    bindir = tmp_path / "bin"
    bindir.mkdir()
    log, drained = tmp_path / "scontrol.log", tmp_path / "drained"
    (bindir / "scontrol").write_text(f"""#!/bin/sh
echo "$*" >> {log}
case "$1 $2" in
"show node")
  echo "NodeName=n7 Arch=x86_64"
  if [ -e {drained} ]; then echo "   State=IDLE+DRAIN ThreadsPerCore=1"; else echo "   State=IDLE ThreadsPerCore=1"; fi
  echo "   Version=22.05.8"
  if [ -e {drained} ]; then echo "   Reason=$(cat {drained}) [root@2026-12-07T06:00:00]"; fi ;;
"show reservation") echo "No reservations in the system" ;;
"update nodename=n7") for a in "$@"; do case "$a" in reason=*) echo "${{a#reason=}}" > {drained} ;; esac; done ;;
*) exit 1 ;;
esac
""")
    (bindir / "scontrol").chmod(0o755)
    (tmp_path / "model").mkdir()
    f = tmp_path / "c.yaml"
    f.write_text(BASE.replace("/models/llama", str(tmp_path / "model")).replace("gate: {command: false}",
                                                                                 "gate: {command: 'false'}"))
    out = tmp_path / "out"
    out.mkdir()
    argv = [sys.executable, "-m", "gpudoctor", "bench", "job", str(f), "--out", str(out), "--config", "ar-tp1"]
    e = {**env(), "PATH": f"{bindir}:{os.environ['PATH']}", "SLURMD_NODENAME": "n7", "SLURM_JOB_ID": "41"}
    assert subprocess.run(argv, capture_output=True, env=e, timeout=120, cwd=tmp_path).returncode == 4  # job 41
    drained.unlink()
    sc = SlurmCampaign(campaign.load(str(f)), str(out), host=FakeSlurm(out))
    sc.configs = {c.label: c for c in sc.camp.configs()}
    lv = sc.levels("ar-tp1")[0]
    ResultStore(out / "jobs" / "ar-tp1").append({**lv.spec.head(), "status": "ok", "completed": 1})  # job 41's
    t0 = time.time()
    p = subprocess.run(argv, capture_output=True, text=True, env={**e, "SLURM_JOB_ID": "42"}, timeout=120,
                       cwd=tmp_path)
    assert p.returncode == 4, p.stderr[-2000:]
    r = json.loads((out / "jobs" / "ar-tp1" / "refused.json").read_text())
    assert sorted(r) == ["at", "drain", "job_id", "node", "reason", "said"]
    assert r["node"] == "n7" and r["job_id"] == "42" and r["reason"] and r["said"] and r["reason"] != r["said"]
    assert t0 <= r["at"] <= time.time()
    assert r["drain"]["action"] == "drained", r["drain"]
    assert drained.read_text().strip() == f"gpudoctor: bench gate: {r['reason']}"[:200]
    assert f"the gate refused node n7 for ar-tp1: {r['said'].strip()}" in p.stderr
    assert len(ResultStore(out / "jobs" / "ar-tp1").load()) == 1  # job 41's record kept


# ---- a squeue that fails while jobs run (slurmctld restarting, a lost controller) ---------------------------------
def _squeue_failing(fake, times):
    """squeue fails `times` times (all: None) once a job is queued; the other commands answer as before."""
    real, left = fake.run, [times]

    def run(argv, timeout=None, **kw):
        if argv[0] == "squeue" and fake.jobs and (left[0] is None or left[0] > 0):
            if left[0] is not None:
                left[0] -= 1
            return fake.res(argv, rc=1)
        return real(argv, timeout, **kw)

    fake.run = run


def test_a_squeue_that_fails_a_while_is_asked_again_and_the_campaign_completes(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text(BASE + "slurm:\n  poll_s: 0.1\n")
    out = tmp_path / "out"
    fake = FakeSlurm(out)
    _squeue_failing(fake, 3)
    sc = SlurmCampaign(campaign.load(str(f)), str(out), host=fake)
    fake.camp = sc
    notes = []
    sc.emit = lambda kind, **kw: notes.append(kw.get("text") or kw.get("what") or "")
    counts = sc.run(resume=False)
    assert counts["ok"] == 2 and len(fake.sbatches()) == 1, (counts, notes)  # never submitted twice
    failed = [n for n in notes if n.startswith("squeue failed ($ squeue")]
    assert len(failed) == 1 and failed[0].endswith("asking again for up to 60 s"), notes
    assert any(re.fullmatch(r"squeue answers again after \d+\.\d s", n) for n in notes), notes


def test_a_squeue_that_keeps_failing_stops_the_campaign_in_one_line_its_jobs_going_on(tmp_path, monkeypatch):
    from gpudoctor.campaign import slurm
    from gpudoctor.campaign.runner import CampaignStopped

    monkeypatch.setattr(slurm, "SQUEUE_OUTAGE_S", 0.3)
    f = tmp_path / "c.yaml"
    f.write_text(BASE + "slurm:\n  poll_s: 0.1\n")
    out = tmp_path / "out"
    fake = FakeSlurm(out, stay=100)
    _squeue_failing(fake, None)
    sc = SlurmCampaign(campaign.load(str(f)), str(out), host=fake)
    fake.camp = sc
    with pytest.raises(CampaignStopped) as exc:
        sc.run(resume=False)
    line = exc.value.one_line()
    assert re.match(r"squeue has failed for \d+ s \(\$ squeue ", line) and "the jobs submitted (ar-tp1) go on, and " \
        in line and line.endswith("--resume --slurm watches them"), line
    assert not [c for c in fake.calls if c[0] == "scancel"]  # its jobs go on: --resume watches them
    st = json.loads((out / "slurm" / "state.json").read_text())["configs"]["ar-tp1"]
    assert st["status"] == "submitted" and st["job"] == "1"


def test_a_slurm_command_error_is_one_of_gpudoctors_errors():
    """Where no caller handles it (a squeue failing before anything was submitted), the CLI prints it in one line,
    exit 3, as every other error it raises on purpose: never an "internal error"."""
    from gpudoctor.errors import GpudoctorError
    from gpudoctor.exitcodes import EXIT_UNKNOWN
    from gpudoctor.integrations.slurmjobs import SlurmCommandError

    assert issubclass(SlurmCommandError, GpudoctorError) and SlurmCommandError("x").exit_code == EXIT_UNKNOWN
