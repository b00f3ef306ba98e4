"""A replay never acts: `gate --snapshot FILE` with --slurm, --recovery or --npd, `fix --snapshot --apply`, and every
action door given a ReplayTarget change nothing on this machine (docs/security.md "A replay cannot act").

The CLI runs as a user runs it, with a logging stand-in `scontrol` first on PATH and a private state directory
($STATE_DIRECTORY, where the recovery ladder's file lives): no `scontrol update` is logged, no file is written there,
and the output says what a live gate would have done. The unit tests below hold the doors by type: each action given
a ReplayTarget (or anything that is not a LiveTarget) refuses before it runs a command or writes a file.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from gate_harness import SHOW_NODE, SNAPS, run_gate

from gpudoctor.integrations.slurm import make_reason

BAD = str(SNAPS / "h200-uvm-blocked.json")
GOOD = str(SNAPS / "h200-healthy.json")
ROOT_CAUSE = "/dev/nvidia-uvm is 1:3, but the live nvidia-uvm device is 238:0"


def gate(slurm, tmp_path, *args):
    return run_gate(*args, cwd=tmp_path, path_prepend=slurm.bin, env={**slurm.env, "SLURMD_NODENAME": "gpu01"})


def nothing_changed(slurm, tmp_path):
    assert not [c for c in slurm.calls() if c[:1] == ["update"]], slurm.calls()
    state = tmp_path / "state"
    assert not state.exists() or not any(state.iterdir()), list(state.iterdir())


@pytest.mark.parametrize("flags", [["--slurm"], ["--recovery"], ["--slurm", "--recovery"]])
def test_a_failing_replay_drains_nothing_and_moves_no_ladder(slurm, tmp_path, flags):
    r = gate(slurm, tmp_path, "--snapshot", BAD, *flags)
    assert r.returncode == 2, r.stdout + r.stderr  # the snapshot's own verdict: a failure
    nothing_changed(slurm, tmp_path)
    assert f"BLOCK devices.node.major[/dev/nvidia-uvm]: {ROOT_CAUSE}" in r.stdout
    assert ("recovery: a snapshot of vm recorded" in r.stderr and "moves no recovery ladder (a live gate would "
            f"record a failing check ({ROOT_CAUSE}) for vm): not judged" in r.stderr), r.stderr
    if "--slurm" in flags:
        assert f"slurm: a replay changes no node: would drain gpu01: {make_reason(ROOT_CAUSE)}" in r.stderr
        assert slurm.calls() == []  # not even a read: a replay is about no node


def test_a_passing_replay_resumes_nothing_and_is_not_ready(slurm, tmp_path):
    """A node gpudoctor drained stays drained: a snapshot that passes is not this node passing. The ladder is
    unknown for a replay, so the gate cannot decide (exit 3), never passes."""
    slurm.node("gpu01", "IDLE+DRAIN", f"gpudoctor: {ROOT_CAUSE}")
    r = gate(slurm, tmp_path, "--snapshot", GOOD, "--slurm", "--json")
    assert r.returncode == 3, r.stdout + r.stderr
    nothing_changed(slurm, tmp_path)
    doc = json.loads(r.stdout)
    assert doc["slurm"]["action"] == "dry" and doc["slurm"]["argv"] is None
    assert "on a live check that passes, gpu01 would be resumed if gpudoctor had drained it" in doc["slurm"]["detail"]
    assert doc["recovery"]["moved_by"] == "replay" and doc["recovery"]["ready"] is False
    assert doc["blockers"][0]["key"] == "recovery.ladder" and doc["blockers"][0]["status"] == "unknown"
    r = gate(slurm, tmp_path, "--snapshot", GOOD, "--recovery")
    assert r.returncode == 3 and r.stdout.startswith("BLOCK recovery.ladder: a snapshot of "), r.stdout
    nothing_changed(slurm, tmp_path)


@pytest.mark.parametrize("snap", [GOOD, BAD])
def test_npd_of_a_replay_is_unknown_and_says_so(slurm, tmp_path, snap):
    r = gate(slurm, tmp_path, "--npd", "--snapshot", snap)
    assert r.returncode == 2, r.stdout  # NPD's Unknown: never this node's OK or NonOK
    (line,) = r.stdout.splitlines()
    assert line.startswith("replay, not this node: ") and len(line.encode()) <= 80, line
    nothing_changed(slurm, tmp_path)


def test_fix_apply_of_a_snapshot_is_refused_and_changes_nothing(tmp_path):
    """`fix --snapshot FILE --apply` plans from recorded facts: applying them would change this machine on another
    moment's word. One line, exit 3, the file the plan names unchanged, no audit record; the dry run still plans."""
    import subprocess
    import sys

    from tests.proxmox.conftest import CONFIGS, DEV511

    from gpudoctor.gather.boundary import gather_lxc
    from gpudoctor.host.local import LocalHost

    (tmp_path / "pve").mkdir()
    conf = tmp_path / "pve/200.conf"
    conf.write_bytes((CONFIGS / "200-seed.conf").read_bytes())
    b = gather_lxc(LocalHost(), 200, config=str(conf), devices=str(DEV511), ask_status=False, stat_nodes=False,
                   read_running=False)
    snap = tmp_path / "snap.json"
    snap.write_text(json.dumps({"schema": "gpudoctor.snapshot/1", "host": "ct200",
                                "facts": {"schema": "gpudoctor.facts/1", "boundary": b}}))
    state = ["--backup-dir", tmp_path / "backups", "--audit-log", tmp_path / "audit.jsonl",
             "--lock-dir", tmp_path / "locks"]
    before = conf.read_bytes()

    def fix(*args):
        return subprocess.run([sys.executable, "-m", "gpudoctor", "fix", "--snapshot", str(snap), *map(str, args),
                               *map(str, state)], capture_output=True, text=True, timeout=60, cwd=tmp_path)

    r = fix("--only", "lxc.cgroup_allow")
    assert r.returncode == 1 and "PLAN  lxc.cgroup_allow on localhost" in r.stdout, r.stdout + r.stderr
    r = fix("--only", "lxc.cgroup_allow", "--apply", "--yes")
    assert r.returncode == 3, r.stdout + r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert "will not apply fixes from a snapshot of ct200: a replay is read-only" in line, line
    assert "nothing was changed; drop --apply to see its plan, or drop --snapshot" in line, line
    assert conf.read_bytes() == before and not (tmp_path / "audit.jsonl").exists()


# --- the doors, by type --------------------------------------------------------------------------------------------

class Recording:
    """A Host that records what it is asked to run and runs nothing."""

    name = "here"

    def __init__(self):
        self.ran = []

    def run(self, argv, **kw):
        self.ran.append(argv)
        raise AssertionError(f"ran {argv}")


@pytest.fixture
def replay():
    from gpudoctor.target import open_target

    t = open_target(snapshot=BAD, search=False)
    yield t
    t.close()


def test_every_action_door_refuses_a_replay_by_type(replay, tmp_path):
    from gpudoctor.gate import gate_target
    from gpudoctor.integrations import slurm
    from gpudoctor.recovery import gates
    from gpudoctor.recovery.store import RecoveryStore
    from gpudoctor.remedy import RemedyContext, fix
    from gpudoctor.target import LiveTarget, ReplayRefused, ReplayTarget, Target, live, open_target

    assert type(replay) is ReplayTarget
    with open_target(None, search=False) as here:
        assert type(here) is LiveTarget and live(here, "act") is here
    for t in (replay, Target(replay.name, None, replay.context)):  # a bare Target is not live either
        with pytest.raises(ReplayRefused, match="will not drain a node from"):
            live(t, "drain a node")
    result = gate_target(replay, None)
    assert result.replayed and not result.passed
    host = Recording()
    with pytest.raises(ReplayRefused, match="will not drain or resume a Slurm node from a snapshot of vm recorded "):
        slurm.apply(result, host, node="gpu01")
    assert host.ran == []
    assert slurm.apply(SimpleNamespace(passed=True, headline="ok"), _Answers(), node="gpu01").action == "none"
    store = RecoveryStore(tmp_path / "state" / "recovery.json")
    v = gates.judge(replay, result, store)
    assert v.moved_by == "replay" and not v.ready and not (tmp_path / "state").exists()
    with pytest.raises(ReplayRefused, match="will not run the active verification"):
        gates._verifier(replay)  # release's and the gate's verification
    with pytest.raises(ReplayRefused, match="will not apply fixes"):
        fix(replay, [], RemedyContext(), apply=True, lock_dir=str(tmp_path / "locks"))
    assert not (tmp_path / "locks").exists()


def test_the_daemons_heals_take_only_a_live_target(replay, tmp_path):
    """The daemon opens live targets only; were a replay ever in its cache, healing it is refused at the door."""
    from gpudoctor.daemon.engine import EngineConfig, PipelineEngine
    from gpudoctor.target import ReplayRefused

    eng = PipelineEngine(EngineConfig(state_dir=str(tmp_path)))
    eng._targets[eng.local_host] = replay
    with pytest.raises(ReplayRefused, match="will not heal from a snapshot of vm recorded "):
        eng._remedy_engine(eng.local_host)


class _Answers:
    """scontrol's answers for a node in service: a live verdict that passes changes nothing."""

    name = "here"

    def run(self, argv, **kw):
        out = SHOW_NODE.format(node="gpu01", state="IDLE", reason_line="") if argv[:2] == ["scontrol", "show"] \
            and argv[2] == "node" else "No reservations in the system\n"
        return SimpleNamespace(ok=True, stdout=out, stderr="", describe=lambda: "exit 0")
