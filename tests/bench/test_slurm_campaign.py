"""`gpudoctor bench run --slurm` against a real Slurm 22.05 cluster (tests/slurmlab.py's cluster shape: slurmctld and
three slurmd, each node its own network namespace, GPUs as gres), the stand-in as the server: every configuration a job on the node
it lands on, a node refused by its gate drained and avoided, an admin's node never touched, resume after SIGKILL,
Ctrl-C cancelling only the campaign's own jobs, a job Slurm killed recorded with Slurm's reason."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.bench.campaigns import write
from tests.bench.conftest import REPO, env

GPUDOCTOR = Path(sys.executable).with_name("gpudoctor")  # the installed console script, as a user runs it
SNAPS = REPO / "tests" / "fixtures" / "snapshots"
METHODS = """\
methods:
  baseline: {baseline: true}
  eagle3: {args: [--accept-length, "3", --decode-tok-s, "900"]}
  ngram: {args: [--accept-length, "2", --decode-tok-s, "600"]}
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from tests.slurmlab import SlurmLab, need_lab

    need_lab()
    c = SlurmLab(tmp_path_factory.mktemp("slurmcluster"), nodes=3, gpus=2)
    c.start()
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def lab(cluster):
    cluster.reset()
    yield cluster
    cluster.reset()


def campaign(tmp_path, *, slurm: str = "", gate: str = '"true"', methods: str = METHODS, extra: str = "",
             tp: str = "[1, 2]", poll_s: float = 0.3):
    path, _ = write(tmp_path, methods, gate=gate, extra=f"slurm:\n  poll_s: {poll_s}\n{slurm}" + extra)
    path.write_text(path.read_text().replace("tp: [1]\n", f"tp: {tp}\n"))
    return path


def bench(lab, *args, timeout=180, **kw):
    return lab.run([str(GPUDOCTOR), "bench", *args], env=env(), timeout=timeout, **kw)


def tree(d):
    """Every file under d: its bytes and mtime (a file written or replaced changes either)."""
    out = {}
    for p in sorted(Path(d).rglob("*")):
        if p.is_file():
            out[str(p.relative_to(d))] = (p.read_bytes(), p.stat().st_mtime_ns)
    return out


def slurm_jobs(lab) -> list[str]:
    """Every job slurmctld still holds (MinJobAge: 5 minutes after it ended), one `scontrol -o` line each."""
    return [x for x in lab.run(["scontrol", "-o", "show", "jobs"]).stdout.splitlines() if x.startswith("JobId=")]


def records(out):
    p = Path(out) / "results.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


def keys(recs):
    return [(r["label"], r["workload"], r["concurrency"], r["trial"]) for r in recs]


EXPECTED = sorted((f"{m}-tp{tp}", "chat:short:out24", c, 0) for m in ("baseline", "eagle3", "ngram")
                  for tp in (1, 2) for c in (1, 2))


def test_six_configurations_each_a_job_every_level_once(lab, tmp_path):
    path = campaign(tmp_path)
    out = tmp_path / "out"
    p = bench(lab, "run", str(path), "--out", str(out), "--slurm")
    assert p.returncode == 0, p.stderr[-3000:]
    recs = records(out)
    assert sorted(keys(recs)) == EXPECTED  # every level recorded, once
    assert all(r["status"] == "ok" and r["output_tok_per_s"] > 0 for r in recs)
    state = json.loads((out / "slurm" / "state.json").read_text())
    jobs = {label: st["jobs"] for label, st in state["configs"].items()}
    assert len(jobs) == 6 and all(len(j) == 1 for j in jobs.values())  # one job per configuration
    for r in recs:
        s = r["provenance"]["slurm"]
        assert s["job_id"] == jobs[r["label"]][0] and s["node"] in lab.nodes
    assert len({r["provenance"]["slurm"]["node"] for r in recs}) >= 2  # spread over the cluster
    script = (out / "slurm" / "eagle3-tp2.sh").read_text()
    assert "#SBATCH --gpus=2\n" in script and "#SBATCH --exclusive\n" in script
    assert f"exec {GPUDOCTOR} bench job {path} --out {out} --config eagle3-tp2\n" in script
    assert "--tp-size 2" in (out / "jobs" / "eagle3-tp2" / "logs" / "eagle3-tp2.log").read_text()


def test_a_node_refused_by_its_gate_is_drained_and_the_configuration_runs_elsewhere(lab, tmp_path):
    snaps = tmp_path / "snaps"
    snaps.mkdir()
    for n in lab.nodes:  # n2's snapshot is the stale uvm major; the others are healthy
        src = "h200-uvm-blocked.json" if n == "n2" else "h200-healthy.json"
        (snaps / f"{n}.json").write_text((SNAPS / src).read_text())
    gate = f"[sh, -c, 'exec {GPUDOCTOR} gate --snapshot {snaps}/$SLURMD_NODENAME.json']"
    path = campaign(tmp_path, gate=gate, slurm="  partition: lab\n", tp="[1]",
                    methods=METHODS + "  m4: {args: [--decode-tok-s, '500']}\n  m5: {args: [--decode-tok-s, '700']}\n")
    out = tmp_path / "out"
    p = bench(lab, "run", str(path), "--out", str(out), "--slurm")
    assert p.returncode == 0, p.stderr[-3000:]
    recs = records(out)
    assert len(recs) == 10 and len(set(keys(recs))) == 10 and all(r["status"] == "ok" for r in recs)
    assert "n2" not in {r["provenance"]["slurm"]["node"] for r in recs}
    info = lab.info("n2")
    assert "DRAIN" in info.state and info.reason.startswith(  # the gate's own first words
        "gpudoctor: bench gate: BLOCK devices.node.major[/dev/nvidia-uvm]: /dev/nvidia-uvm is 1:3, but the live "
        "nvidia-uvm device is 238:0")
    state = json.loads((out / "slurm" / "state.json").read_text())
    refused = [r for st in state["configs"].values() for r in st["refused"]]
    assert len(refused) == 1 and refused[0]["node"] == "n2" and state["excluded"] == ["n2"], refused
    assert refused[0]["drain"]["action"] == "drained", refused  # by the job, while it still held n2
    # no second job ever started on the refused node: of all the campaign's jobs, Slurm ran one on n2 (#50.3)
    ids = {j for st in state["configs"].values() for j in st["jobs"]}
    on_n2 = [x for x in slurm_jobs(lab) if x.split()[0].split("=")[1] in ids and " NodeList=n2 " in f"{x} "]
    assert len(on_n2) == 1, on_n2
    assert "node n2 refused by the gate" in p.stderr
    rep = bench(lab, "report", str(out), "--no-plots")
    assert rep.returncode == 0, rep.stderr
    text = (out / "report.md").read_text()
    assert "## Nodes refused by the gate" in text and "n2" in text and "/dev/nvidia-uvm" in text


def test_an_admin_drained_node_is_never_used_or_touched(lab, tmp_path):
    lab.scontrol("update", "nodename=n3", "state=drain", "reason=bad DIMM, ticket 4711")
    before = lab.scontrol("show", "node", "n3")
    path = campaign(tmp_path, tp="[1]")
    out = tmp_path / "out"
    p = bench(lab, "run", str(path), "--out", str(out), "--slurm")
    assert p.returncode == 0, p.stderr[-3000:]
    recs = records(out)
    assert len(recs) == 6 and "n3" not in {r["provenance"]["slurm"]["node"] for r in recs}
    info = lab.info("n3")
    assert info.reason == "bad DIMM, ticket 4711" and "DRAIN" in info.state
    assert _reason_line(lab.scontrol("show", "node", "n3")) == _reason_line(before)  # same reason, user and time


def _reason_line(text):
    return next(x.strip() for x in text.splitlines() if x.strip().startswith("Reason="))


def test_sigkill_of_the_submitter_then_resume_no_duplicate_no_loss(lab, tmp_path):
    path = campaign(tmp_path, slurm="  max_jobs: 2\n")
    path.write_text(path.read_text().replace('--decode-tok-s, "400"', '--decode-tok-s, "100"'))
    out = tmp_path / "out"
    proc = lab.popen([str(GPUDOCTOR), "bench", "run", str(path), "--out", str(out), "--slurm"], env=env(),
                     stdout=open(tmp_path / "first.out", "w"), stderr=open(tmp_path / "first.err", "w"))
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not records(out):
        time.sleep(0.1)
    assert records(out), (tmp_path / "first.err").read_text()[-2000:]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = records(out)
    running = lab.jobs()
    assert running  # the killed submitter left jobs queued or running
    p = bench(lab, "run", str(path), "--out", str(out), "--slurm", "--resume")
    assert p.returncode == 0, p.stderr[-3000:]
    after = records(out)
    assert sorted(keys(after)) == EXPECTED
    assert after[: len(before)] == before
    state = json.loads((out / "slurm" / "state.json").read_text())
    assert all(len(st["jobs"]) == 1 for st in state["configs"].values()), state  # nothing submitted twice
    assert "is still" in p.stderr  # a job of the killed submitter was watched, not resubmitted


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"])
def test_ctrl_c_cancels_only_the_campaigns_jobs(lab, tmp_path, sig, code):
    # another user's job named exactly like one of the campaign's jobs: neither cancelled by the interrupted run nor
    # adopted by --resume (#50.4: jobs are the ids recorded at submit, of this user)
    path = campaign(tmp_path, slurm="  time_limit: '10'\n")
    out = tmp_path / "out"
    proc = lab.popen([str(GPUDOCTOR), "bench", "run", str(path), "--out", str(out), "--slurm"], env=env(),
                     stdout=open(tmp_path / "o", "w"), stderr=open(tmp_path / "e", "w"))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any("gpd-" in j for j in lab.jobs()):
        time.sleep(0.1)
    cid = json.loads((out / "slurm" / "state.json").read_text())["campaign_id"]
    stranger = lab.as_user(65534, ["sbatch", "--parsable", f"--job-name=gpd-{cid}-baseline-tp1", "-o", "/dev/null",
                                   "--wrap", "sleep 300"]).stdout.strip()
    assert stranger.isdigit()
    time.sleep(1)
    proc.send_signal(sig)
    assert proc.wait(60) == code, (tmp_path / "e").read_text()[-2000:]
    err = (tmp_path / "e").read_text()
    assert "cancelled this campaign's" in err and "--resume" in err
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any("gpd-" in j and "nobody" not in j for j in lab.jobs()):
        time.sleep(0.2)
    jobs = lab.jobs()
    assert [j.split()[0] for j in jobs if "gpd-" in j] == [stranger], (jobs, err[-1500:], lab.run(["scontrol", "show", "job", stranger]).stdout)  # the stranger's survives, alone
    before = records(out)
    p = bench(lab, "run", str(path), "--out", str(out), "--slurm", "--resume")  # the cancelled ones run again
    assert p.returncode == 0, p.stderr[-3000:]
    after = records(out)
    assert sorted(keys(after)) == EXPECTED and after[: len(before)] == before
    assert "was cancelled by an interrupted run: submitted again" in p.stderr
    state = json.loads((out / "slurm" / "state.json").read_text())
    assert all(stranger not in st["jobs"] for st in state["configs"].values())  # never adopted
    assert any(j.split()[0] == stranger and j.split()[-1] == "nobody" for j in lab.jobs()), (
        lab.run(["scontrol", "show", "job", stranger]).stdout.replace("\n", " "))  # never cancelled
    lab.run(["scancel", stranger])


@pytest.mark.parametrize("on_crash", ["skip", "restart"])
def test_a_job_slurm_kills_is_recorded_with_slurms_reason(lab, tmp_path, on_crash):
    # the node under a running job goes DOWN (as a node failure does): Slurm ends the job NODE_FAIL
    path = campaign(tmp_path, tp="[1]", methods="methods:\n  slow: {baseline: true}\n", extra=f"on_crash: {on_crash}\n")
    out = tmp_path / "out"
    proc = lab.popen([str(GPUDOCTOR), "bench", "run", str(path), "--out", str(out), "--slurm"], env=env(),
                     stdout=open(tmp_path / "o", "w"), stderr=open(tmp_path / "e", "w"))
    node = None  # downed as soon as the job runs: seconds before gpudoctor on the node has started its server
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and node is None:
        running = [j.split() for j in lab.jobs() if "RUNNING" in j]
        node = running[0][3] if running else None
        time.sleep(0.05)
    assert node, (tmp_path / "e").read_text()[-2000:]
    lab.scontrol("update", f"nodename={node}", "state=down", "reason=PSU lost")
    assert proc.wait(90) == (1 if on_crash == "skip" else 0), (tmp_path / "e").read_text()[-3000:]
    recs = records(out)
    err = (tmp_path / "e").read_text()
    assert f"NODE_FAIL on {node}" in err
    if on_crash == "restart":  # submitted once more (n1 may be back: ReturnToService=2 and a live slurmd)
        jobs = json.loads((out / "slurm" / "state.json").read_text())["configs"]["slow-tp1"]["jobs"]
        assert [r["status"] for r in recs] == ["ok", "ok"] and len(jobs) == 2, recs
        assert {r["provenance"]["slurm"]["job_id"] for r in recs} == {jobs[1]}
        return
    assert [r["status"] for r in recs] == ["crashed", "skipped"], recs
    assert "NODE_FAIL" in recs[0]["error"] and f"Slurm job" in recs[0]["error"] and node in recs[0]["error"]
    assert recs[0]["provenance"]["slurm"]["node"] == node and recs[0]["provenance"]["slurm"]["job_id"]
    assert "not run: Slurm job" in recs[1]["error"]


STABLE = ("schema", "label", "method", "tp", "workload", "concurrency", "trial", "max_tokens", "status", "requests",
          "completed", "failed", "output_tokens", "prompt_tokens_mean", "accept_length", "error")


def test_the_same_campaign_with_target_local_gives_the_same_records_minus_node_and_job(lab, tmp_path):
    path = campaign(tmp_path, tp="[1]")
    local, slurm = tmp_path / "local", tmp_path / "slurm"
    # the campaign named relative to the current directory on both sides: one canonical path recorded (#50.2)
    p = subprocess.run([str(GPUDOCTOR), "bench", "run", path.name, "--out", str(local)], capture_output=True,
                       text=True, env=env(), timeout=120, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    p = bench(lab, "run", path.name, "--out", str(slurm), "--slurm", cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    a, b = records(local), records(slurm)
    assert sorted(keys(a)) == sorted(keys(b)) and len(a) == 6
    b_by = {k: r for k, r in zip(keys(b), b)}
    for k, ra in zip(keys(a), a):
        rb = b_by[k]
        assert sorted(ra) == sorted(rb)  # the same fields
        assert {f: ra.get(f) for f in STABLE} == {f: rb.get(f) for f in STABLE}
        pa, pb = dict(ra["provenance"]), dict(rb["provenance"])
        assert set(pb) - set(pa) == {"slurm"} and sorted(pb["slurm"]) == ["job_id", "node"]
        for f in ("campaign", "server", "gpudoctor"):
            assert pa.get(f) == pb.get(f), f
        assert pa["campaign"]["path"] == str(path.resolve())


def test_sbatch_only_recipe(lab, tmp_path):
    path = campaign(tmp_path, tp="[1]")
    out = tmp_path / "out"
    p = bench(lab, "run", str(path), "--out", str(out), "--slurm", "--no-submit")
    assert p.returncode == 1 and records(out) == [] and not lab.jobs(), p.stderr[-2000:]
    scripts = sorted((out / "slurm").glob("*.sh"))
    assert [s.name for s in scripts] == ["baseline-tp1.sh", "eagle3-tp1.sh", "ngram-tp1.sh"]
    assert f"not complete: sbatch {out / 'slurm' / 'eagle3-tp1.sh'}" in p.stderr
    for s in scripts:  # as a person submits them
        r = lab.run(["sbatch", str(s)])
        assert r.returncode == 0, r.stderr
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and lab.jobs():
        time.sleep(0.3)
    p = bench(lab, "run", str(path), "--out", str(out), "--slurm", "--no-submit", "--resume")
    assert p.returncode == 0, p.stderr[-2000:]
    recs = records(out)
    assert len(recs) == 6 == len(set(keys(recs))) and all(r["status"] == "ok" for r in recs)
    assert all(r["provenance"]["slurm"]["job_id"] for r in recs)


def test_a_job_slurm_refuses_stops_the_campaign_in_one_line(lab, tmp_path):
    path = campaign(tmp_path, slurm="  partition: nope\n", tp="[1]")
    out = tmp_path / "out"
    p = bench(lab, "run", str(path), "--out", str(out), "--slurm")
    assert p.returncode == 2, p.stderr[-2000:]
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("gpudoctor: cannot submit baseline-tp1: $ sbatch --parsable") and "partition" in last
    assert "Traceback" not in p.stderr and not lab.jobs() and records(out) == []


def test_resume_with_another_campaign_is_refused_and_submits_and_writes_nothing(lab, tmp_path):
    # #50.1: the same name (`name: test`), other methods: refused by content hash, before any sbatch or write
    first = campaign(tmp_path, tp="[1]", methods="methods:\n  baseline: {baseline: true}\n")
    out = tmp_path / "out"
    p = bench(lab, "run", str(first), "--out", str(out), "--slurm")
    assert p.returncode == 0, p.stderr[-2000:]
    before, held = tree(out), slurm_jobs(lab)
    (tmp_path / "other").mkdir()
    other = campaign(tmp_path / "other", tp="[1]")
    p = bench(lab, "run", str(other), "--out", str(out), "--slurm", "--resume")
    assert p.returncode == 3, p.stderr[-2000:]
    err = p.stderr.strip()
    assert "\n" not in err and "Traceback" not in err, err
    assert err.startswith(f"gpudoctor: {out}: holds another campaign") and str(other) in err, err
    assert tree(out) == before and slurm_jobs(lab) == held and not lab.jobs()  # nothing written or submitted


def test_a_refused_node_takes_no_second_job_even_with_no_submitter_watching(lab, tmp_path):
    # #50.3: the refused job drains its own node before it ends, so Slurm never starts a next job there — here the
    # scripts are submitted by hand (--no-submit: no gpudoctor watches the queue to drain anything afterwards)
    snaps = tmp_path / "snaps"
    snaps.mkdir()
    for n in lab.nodes:
        src = "h200-uvm-blocked.json" if n == "n2" else "h200-healthy.json"
        (snaps / f"{n}.json").write_text((SNAPS / src).read_text())
    gate = f"[sh, -c, 'exec {GPUDOCTOR} gate --snapshot {snaps}/$SLURMD_NODENAME.json']"
    path = campaign(tmp_path, gate=gate, slurm="  partition: lab\n", tp="[1]",
                    methods=METHODS + "  m4: {args: [--decode-tok-s, '500']}\n  m5: {args: [--decode-tok-s, '700']}\n")
    out = tmp_path / "out"
    p = bench(lab, "run", str(path), "--out", str(out), "--slurm", "--no-submit")
    assert p.returncode == 1, p.stderr[-2000:]
    ids = []
    for s in sorted((out / "slurm").glob("*.sh")):  # five jobs for three nodes: two wait for a node to free
        r = lab.run(["sbatch", "--parsable", str(s)])
        assert r.returncode == 0, r.stderr
        ids.append(r.stdout.strip())
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and lab.jobs():
        time.sleep(0.3)
    assert not lab.jobs()
    ran = {x.split()[0].split("=")[1]: next(f.split("=")[1] for f in x.split() if f.startswith("NodeList="))
           for x in slurm_jobs(lab) if x.split()[0].split("=")[1] in ids}
    assert sorted(ran) == sorted(ids), ran
    assert list(ran.values()).count("n2") == 1, ran  # the refused job only
    info = lab.info("n2")
    assert "DRAIN" in info.state and info.reason.startswith("gpudoctor: bench gate: BLOCK devices.node.major")
    refused = [json.loads(f.read_text()) for f in (out / "jobs").glob("*/refused.json")]
    assert len(refused) == 1 and refused[0]["node"] == "n2" and refused[0]["drain"]["action"] == "drained"
