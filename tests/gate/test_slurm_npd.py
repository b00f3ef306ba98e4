"""--slurm and --npd through the real CLI, with a stand-in `scontrol` on PATH that records its arguments: on a live
host (gate_harness.Live: its verdict turned by one mknod), since a replayed snapshot acts on nothing
(tests/gate/test_replay_acts_on_nothing.py)."""

from __future__ import annotations

import socket

import pytest
from gate_harness import LIVE_CAUSE, SNAPS, Live, run_gate

from gpudoctor.integrations.slurm import make_reason, parse_show_node

GOOD = str(SNAPS / "h200-healthy.json")  # a replay: only where nothing acts (bad input, the NPD line's format)
ROOT_CAUSE = LIVE_CAUSE
BAD, PASS = "bad", "good"


_LIVES: dict = {}


@pytest.fixture(autouse=True)
def verified(tmp_path):
    """The live gpu01 in ./inventory.yaml (as the gate finds it), whose verification passes while the flag file
    exists: --slurm and --npd pass only after a passing verification (docs/recovery.md)."""
    flag = tmp_path / "verify-passes"
    flag.touch()
    _LIVES[tmp_path] = Live(tmp_path, flag)
    yield flag
    del _LIVES[tmp_path]


def ladder(tmp_path) -> dict:
    import json

    return json.loads((tmp_path / "state" / "recovery.json").read_text())["hosts"]


def gate_slurm(slurm, tmp_path, verdict, *extra, env=None):
    """`gate --slurm` on the live gpu01, made to fail (BAD) or pass (PASS) first."""
    live = _LIVES[tmp_path]
    (live.bad if verdict == BAD else live.good)()
    return run_gate(*live.args, "--slurm", *extra, cwd=tmp_path, path_prepend=slurm.bin, rooted=True,
                    env={**slurm.env, **live.env, "SLURMD_NODENAME": "gpu01", **(env or {})})


def npd_live(tmp_path, verdict):
    """`gate --npd` on the live gpu01, made to fail (BAD) or pass (PASS) first."""
    live = _LIVES[tmp_path]
    (live.bad if verdict == BAD else live.good)()
    return run_gate(*live.args, "--npd", cwd=tmp_path, rooted=True, env=live.env)


def gate_live(tmp_path, verdict, *extra):
    live = _LIVES[tmp_path]
    (live.bad if verdict == BAD else live.good)()
    return run_gate(*live.args, *extra, cwd=tmp_path, rooted=True, env=live.env)


def test_failure_drains_with_a_gpudoctor_reason(slurm, tmp_path):
    r = gate_slurm(slurm, tmp_path, BAD)
    assert r.returncode == 2
    assert slurm.calls()[0] == ["show", "node", "gpu01"]
    assert slurm.updates() == [["update", "nodename=gpu01", "state=drain", f"reason=gpudoctor: {ROOT_CAUSE}"]]
    assert "slurm: gpu01 drained: gpudoctor: /dev/nvidia-uvm is 509:0" in r.stderr


def test_failure_on_a_node_drained_by_an_admin_leaves_their_reason(slurm, tmp_path):
    slurm.node("gpu01", "IDLE+DRAIN", "bad DIMM, ticket 4711")
    r = gate_slurm(slurm, tmp_path, BAD)
    assert r.returncode == 2
    assert slurm.updates() == []
    assert ("left as is: drained by someone else (State=IDLE+DRAIN, Reason=bad DIMM, ticket 4711); gpudoctor changes "
            "only a node in service or one it drained itself") in r.stderr


def test_same_failure_again_does_not_redrain(slurm, tmp_path):
    slurm.node("gpu01", "IDLE+DRAIN", f"gpudoctor: {ROOT_CAUSE}")
    assert gate_slurm(slurm, tmp_path, BAD).returncode == 2
    assert slurm.updates() == []


def test_new_failure_updates_our_own_reason(slurm, tmp_path):
    slurm.node("gpu01", "IDLE+DRAIN", "gpudoctor: something older")
    gate_slurm(slurm, tmp_path, BAD)
    assert slurm.updates()[0][-1] == f"reason=gpudoctor: {ROOT_CAUSE}"


def test_success_resumes_only_a_node_gpudoctor_drained(slurm, tmp_path):
    slurm.node("gpu01", "IDLE+DRAIN", "gpudoctor: cuInit 999")
    r = gate_slurm(slurm, tmp_path, PASS)
    assert r.returncode == 0
    assert slurm.updates() == [["update", "nodename=gpu01", "state=resume"]]


@pytest.mark.parametrize("state, reason", [("IDLE+DRAIN", "maintenance: gpudoctor said fine but keep out"),
                                           ("MIXED+DRAIN", "Kill task failed"),
                                           ("IDLE", None)])
def test_success_never_undrains_someone_elses_drain(slurm, tmp_path, state, reason):
    slurm.node("gpu01", state, reason)
    r = gate_slurm(slurm, tmp_path, PASS)
    assert r.returncode == 0
    assert slurm.updates() == []


def test_node_name_falls_back_to_short_hostname(slurm, tmp_path):
    r = gate_slurm(slurm, tmp_path, BAD, env={"SLURMD_NODENAME": ""})
    assert r.returncode == 2
    short = socket.gethostname().split(".")[0]
    assert slurm.calls()[0] == ["show", "node", short]
    assert slurm.updates()[0][1] == f"nodename={short}"


def test_scontrol_update_failure_is_reported_and_gate_still_closed(slurm, tmp_path):
    r = gate_slurm(slurm, tmp_path, BAD, env={"SCONTROL_UPDATE_RC": "1"})
    assert r.returncode == 2
    assert "slurm: could not drain gpu01" in r.stdout and "Invalid node state" in r.stdout


def test_parse_show_node_and_reason():
    info = parse_show_node("NodeName=n1 Arch=x86_64\n   State=DOWN+DRAIN+NOT_RESPONDING ThreadsPerCore=1\n"
                           "   Reason=gpudoctor: cuInit → 999 [root@2024-05-02T09:00:00]\n")
    assert info.drained and info.ours and info.reason == "gpudoctor: cuInit → 999"
    assert parse_show_node("NodeName=n1\n   State=IDLE\n   Reason=(null)\n").reason is None
    long = make_reason("x" * 500)
    assert long.startswith("gpudoctor: x") and len(long) <= 200


def npd(tmp_path, *args):
    return run_gate("--npd", *args, cwd=tmp_path)


def _npd_line(r) -> str:
    """NPD's view: the whole stdout, trimmed, cut at max_output_length (80) bytes; the line must fit by itself."""
    assert r.stdout.count("\n") == 1 and r.stdout.endswith("\n"), r.stdout
    line = r.stdout.strip()
    assert len(line.encode()) <= 80, (len(line.encode()), line)
    return line


def test_npd_ok_problem_unknown_each_exactly_one_line_within_80_bytes(tmp_path):
    r = npd_live(tmp_path, PASS)
    assert (r.returncode, _npd_line(r)) == (0, "ok (gpudoctor gate, profile nodes)")
    r = npd_live(tmp_path, BAD)
    assert r.returncode == 1 and _npd_line(r) == ROOT_CAUSE  # the cause first, nothing before it
    r = npd(tmp_path, "--snapshot", str(tmp_path / "nope.json"))
    assert r.returncode == 2 and _npd_line(r).startswith("no such snapshot file") and "(nope.json)" in r.stdout
    (tmp_path / "inventory.yaml").write_text("profiles: [\n")
    r = npd(tmp_path, "--snapshot", GOOD)
    line = _npd_line(r)
    assert r.returncode == 2 and line.startswith("YAML syntax error") and line.endswith("(inventory.yaml:2)"), line
    r = npd(tmp_path, "--snapshot", GOOD, "--no-such-flag")
    assert r.returncode == 2 and "No such option" in _npd_line(r)
    assert "Traceback" not in r.stdout + r.stderr


def test_npd_line_is_cut_by_gpudoctor_on_a_character_not_by_npd_in_a_sentence():
    from gpudoctor.integrations.npd import fit

    long = "cuInit → 999 CUDA_ERROR_UNKNOWN: " + "ä" * 100
    line = fit(long, " (+2 more)")
    assert len(line.encode()) <= 80 and line.endswith("… (+2 more)") and line.startswith("cuInit → 999")
    line.encode().decode("utf-8")  # whole characters only
    assert fit("short", " (+1 more)") == "short (+1 more)"


def test_npd_unreachable_host_is_unknown(tmp_path):
    # --host names no inventory host: the gate cannot check it, NPD hears "unknown" in one line
    r = npd(tmp_path, "--host", "ct999", "--inventory", str(tmp_path / "inv.yaml"))
    assert r.returncode == 2 and r.stdout.count("\n") == 1


# --- the recovery ladder on these paths: no release without a passing verification ---------------------------------
def test_slurm_keeps_its_drain_until_the_verification_passes(slurm, tmp_path, verified):
    verified.unlink()
    assert gate_slurm(slurm, tmp_path, BAD).returncode == 2
    slurm.node("gpu01", "IDLE+DRAIN", f"gpudoctor: {ROOT_CAUSE}")
    r = gate_slurm(slurm, tmp_path, PASS)  # the checks pass; the verification fails: still drained, reason updated
    assert r.returncode == 2, r.stderr
    reason = slurm.updates()[-1][-1]
    assert reason.startswith("reason=gpudoctor: verifying: verification failed (commands: test -e ")
    assert "retry in 300 s" in reason and "state=resume" not in sum(slurm.updates(), [])
    assert "BLOCK recovery.ladder: verifying: verification failed" in r.stdout
    rec = ladder(tmp_path)[Live.name]
    assert rec["state"] == "verifying" and rec["verify_failures"] == 1
    slurm.node("gpu01", "IDLE+DRAIN", reason[len("reason="):])
    verified.touch()
    r = gate_slurm(slurm, tmp_path, PASS)  # within the backoff: not retried yet, still drained, nothing changed
    assert r.returncode == 2 and "already drained by gpudoctor for this reason" in r.stderr
    import json  # the backoff has passed:

    path = tmp_path / "state" / "recovery.json"
    doc = json.loads(path.read_text())
    doc["hosts"][Live.name]["next_verify_at"] = 0
    path.write_text(json.dumps(doc))
    r = gate_slurm(slurm, tmp_path, PASS)
    assert r.returncode == 0, r.stdout + r.stderr
    assert slurm.updates()[-1] == ["update", "nodename=gpu01", "state=resume"]
    assert f"recovery: {Live.name} ready (verified; ladder moved by the gate)" in r.stderr
    assert ladder(tmp_path)[Live.name]["state"] == "ready"


def test_a_reboot_since_the_last_verification_blocks_slurm_and_npd(slurm, tmp_path, verified):
    assert gate_slurm(slurm, tmp_path, PASS).returncode == 0  # verified on this boot
    import json

    path = tmp_path / "state" / "recovery.json"
    doc = json.loads(path.read_text())
    doc["hosts"][Live.name]["verified_boot"] = "an-earlier-boot"
    path.write_text(json.dumps(doc))
    verified.unlink()
    slurm.node("gpu01", "IDLE", None)
    r = gate_slurm(slurm, tmp_path, PASS)
    assert r.returncode == 2
    assert slurm.updates()[-1][-1].startswith("reason=gpudoctor: verifying: verification failed")
    r = npd_live(tmp_path, PASS)
    assert r.returncode == 1 and _npd_line(r).startswith("verifying: verification failed"), r.stdout
    assert r.stdout.count("\n") == 1 and len(_npd_line(r).encode()) <= 80


def test_npd_passes_only_once_verified(tmp_path, verified):
    verified.unlink()
    r = npd_live(tmp_path, PASS)
    assert r.returncode == 1 and _npd_line(r).startswith("verifying: verification failed (commands: test -e")
    (tmp_path / "state" / "recovery.json").unlink()  # a lost file: never verified, so verify again (and pass)
    verified.touch()
    r = npd_live(tmp_path, PASS)
    assert (r.returncode, _npd_line(r)) == (0, "ok (gpudoctor gate, profile nodes)")


def test_npd_in_needs_inspection_says_so_even_when_the_checks_pass(tmp_path):
    import json

    assert npd_live(tmp_path, PASS).returncode == 0
    path = tmp_path / "state" / "recovery.json"
    doc = json.loads(path.read_text())
    doc["hosts"][Live.name].update(state="needs-inspection", reason="needs inspection: came back 2 times (3 failures)")
    path.write_text(json.dumps(doc))
    r = npd_live(tmp_path, PASS)
    assert r.returncode == 1 and _npd_line(r).startswith("needs inspection: came back 2 times"), r.stdout


def test_an_unreadable_ladder_file_is_set_aside_and_the_gate_verifies_again(slurm, tmp_path, verified):
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "recovery.json").write_text("{garbage")
    verified.unlink()
    slurm.node("gpu01", "IDLE+DRAIN", f"gpudoctor: {ROOT_CAUSE}")
    r = gate_slurm(slurm, tmp_path, PASS)
    assert r.returncode == 2 and "state=resume" not in sum(slurm.updates(), [])
    assert [p.name for p in (tmp_path / "state").iterdir() if p.name.startswith("recovery.json.corrupt-")]


def test_the_execstartpre_gate_passes_only_once_verified_on_this_boot(tmp_path, verified):
    """`gate --recovery` (the shipped ExecStartPre= and gpudoctor-gate.service): blocked until the verification
    passed since the last failure and on this boot; a plain gate (a campaign's) is not."""
    import json

    def recovery_gate(verdict):
        return gate_live(tmp_path, verdict, "--recovery")

    verified.unlink()
    assert gate_live(tmp_path, PASS).returncode == 0  # no --recovery: the checks only
    r = recovery_gate(PASS)
    assert r.returncode == 2 and r.stdout.startswith("BLOCK recovery.ladder: verifying: verification failed"), r.stdout
    verified.touch()
    path = tmp_path / "state" / "recovery.json"
    doc = json.loads(path.read_text())
    doc["hosts"][Live.name]["next_verify_at"] = 0
    path.write_text(json.dumps(doc))
    assert recovery_gate(PASS).returncode == 0
    r = recovery_gate(BAD)  # a failure: blocked by the failure itself
    assert r.returncode == 2 and ROOT_CAUSE in r.stdout
    verified.unlink()
    r = recovery_gate(PASS)  # the checks pass again, the verification has not: blocked
    assert r.returncode == 2 and "BLOCK recovery.ladder: verifying: verification failed" in r.stdout
    verified.touch()
    doc = json.loads(path.read_text())
    doc["hosts"][Live.name].update(next_verify_at=0)
    path.write_text(json.dumps(doc))
    assert recovery_gate(PASS).returncode == 0
    doc = json.loads(path.read_text())
    doc["hosts"][Live.name]["verified_boot"] = "an-earlier-boot"  # as after a reboot
    path.write_text(json.dumps(doc))
    verified.unlink()
    r = recovery_gate(PASS)
    assert r.returncode == 2 and "BLOCK recovery.ladder: verifying: verification failed" in r.stdout
