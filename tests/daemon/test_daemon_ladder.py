"""The daemon moves the recovery ladder (docs/recovery.md): the real daemon process, its real /metrics and /healthz,
a fake clock, and the real verification (policy verify: commands, run by gpudoctor.recovery.verify through
gpudoctor's LocalHost) made to fail or pass by a flag file. The daemon path never reports a host ready whose
verification has not passed since its last failure or boot-id change."""

from __future__ import annotations

import json

from daemon_harness import T0

CUDA_FAIL = {"id": "cuda.init", "status": "fail", "summary": "cuInit returned 999 (CUDA_ERROR_UNKNOWN)",
             "remedy": "lxc.cgroup_allow"}
OK = {"id": "driver.nvml.init", "status": "ok", "summary": "NVML initialised"}
H = frozenset({("host", "ct200")})


def scenario(flag, **recovery):
    return {"hosts": ["ct200"], "local_host": None,
            "policy": {"auto_apply": ["lxc.*"], "budgets": {"backoff_s": 0},
                       "recovery": {"clean_cycles": 2, "retry_s": 30, "retry_factor": 1, **recovery},
                       "verify": {"commands": [["test", "-e", str(flag)]], "timeout_s": 20}},
            "findings": {"ct200": [OK]}, "facts": {"ct200": {"host": {"boot_id": "b1"}}},
            "remedies": {"lxc.cgroup_allow": {"result": "ok"}}}


def ladder(d) -> dict:
    m = d.metrics()
    states = {dict(k[1])["state"]: v for k, v in m.items() if k[0] == "gpudoctor_recovery_state"}
    state = [s for s, v in states.items() if v == 1]
    assert len(state) == 1, states
    code, body = d.get("/healthz")
    rec = json.loads(body)["hosts"]["ct200"]["recovery"]
    assert rec["state"] == state[0]
    assert rec["ready"] == (m[("gpudoctor_ready", H)] == 1)
    return {"state": state[0], "ready": m[("gpudoctor_ready", H)],
            "since": m[("gpudoctor_recovery_transition_timestamp_seconds", H)], "reason": rec["reason"], "m": m}


def test_the_daemon_releases_only_after_a_passing_verification(daemon_factory, tmp_path):
    flag = tmp_path / "verify-passes"
    d = daemon_factory(scenario(flag)).start()
    s = ladder(d)  # a new host: never verified
    assert (s["state"], s["ready"], s["since"]) == ("verifying", 0, T0)
    assert s["reason"] == "verifying: clean window 1/2 checks, 0/0 s"
    d.step()  # the window passes; the verification runs and fails (no flag)
    s = ladder(d)
    assert (s["state"], s["ready"], s["since"]) == ("verifying", 0, T0)
    assert s["reason"].startswith("verifying: verification failed (commands: ") and "retry in 30 s" in s["reason"]
    assert f"test -e {flag}" in s["reason"]
    flag.touch()
    d.step()
    s = ladder(d)
    assert (s["state"], s["ready"], s["since"], s["reason"]) == ("ready", 1, T0 + 120, "")
    d.wait_datagram(lambda m: m.startswith("STATUS=ct200 ok, ready"))

    # a fault: failing -> healed -> verifying; not ready until the verification passes again
    d.write_scenario(findings={"ct200": [OK, CUDA_FAIL]})
    d.step()
    s = ladder(d)
    assert (s["state"], s["ready"], s["since"]) == ("healing", 0, T0 + 180)
    assert s["reason"] == "healing: applied lxc.cgroup_allow, waiting for a passing check"
    assert [a["remedy"] for a in d.applied()] == ["lxc.cgroup_allow"]
    d.write_scenario(findings={"ct200": [OK]})
    flag.unlink()
    d.step()
    s = ladder(d)
    assert (s["state"], s["ready"]) == ("verifying", 0)
    d.step()  # window passed: verification fails: still not ready, whatever the passive checks say
    s = ladder(d)
    assert (s["state"], s["ready"]) == ("verifying", 0) and "verification failed" in s["reason"]
    assert s["m"][("gpudoctor_host_status", H)] == 0
    flag.touch()
    d.step()
    s = ladder(d)
    assert (s["state"], s["ready"], s["since"]) == ("ready", 1, T0 + 360)

    # a reboot (new boot id) since the last verification: not ready until verified on this boot
    flag.unlink()
    d.write_scenario(facts={"ct200": {"host": {"boot_id": "b2"}}})
    d.step()
    s = ladder(d)
    assert (s["state"], s["ready"], s["since"]) == ("verifying", 0, T0 + 420)
    d.step()
    assert ladder(d)["ready"] == 0
    flag.touch()
    d.step()
    assert ladder(d)["ready"] == 1
    # time between failures: one failure so far, so no interval yet
    assert s["m"][("gpudoctor_time_between_failures_seconds_count", H)] == 0


def test_recurrence_stops_heals_and_a_restart_neither_replays_nor_forgets(daemon_factory, tmp_path):
    flag = tmp_path / "verify-passes"
    flag.touch()
    d = daemon_factory(scenario(flag, clean_cycles=1)).start()
    assert ladder(d)["state"] == "ready"
    for i in range(2):  # the fault twice, healed and verified each time
        d.write_scenario(findings={"ct200": [OK, CUDA_FAIL]})
        d.step()
        assert ladder(d)["state"] == "healing"
        d.write_scenario(findings={"ct200": [OK]})
        d.step()
        assert ladder(d)["state"] == "ready"
    d.write_scenario(findings={"ct200": [OK, CUDA_FAIL]})  # a third time: came back twice
    d.step()
    s = ladder(d)
    assert (s["state"], s["ready"]) == ("needs-inspection", 0)
    assert s["reason"].startswith("needs inspection: came back 2 times (3 failures) within the window: cuInit")
    assert len(d.applied()) == 2  # no unattended heal in needs-inspection
    skipped = ("gpudoctor_remedies_skipped_total",
               frozenset({("host", "ct200"), ("remedy", "lxc.cgroup_allow"), ("reason", "needs_inspection")}))
    assert s["m"][skipped] == 1
    assert s["m"][("gpudoctor_time_between_failures_seconds_count", H)] == 2
    assert s["m"][("gpudoctor_time_between_failures_seconds_sum", H)] == 240  # 120 s between each onset
    since = s["since"]
    d.write_scenario(findings={"ct200": [OK]})
    d.step()  # passing checks do not leave needs-inspection
    s = ladder(d)
    assert (s["state"], s["ready"], s["since"]) == ("needs-inspection", 0, since)

    # restart: the ladder is read back as it was, the transition time does not move, nothing is replayed
    assert d.stop() == 0
    d.start()
    s = ladder(d)
    assert (s["state"], s["ready"], s["since"]) == ("needs-inspection", 0, since)
    assert len(d.applied()) == 2


def test_a_restart_in_verifying_neither_releases_early_nor_drops_the_verification(daemon_factory, tmp_path):
    flag = tmp_path / "verify-passes"
    d = daemon_factory(scenario(flag, clean_cycles=3)).start()
    d.step()
    s = ladder(d)
    assert (s["state"], s["reason"]) == ("verifying", "verifying: clean window 2/3 checks, 60/0 s")
    assert d.stop() == 0
    rec = json.loads((tmp_path / "recovery.json").read_text())["hosts"]["ct200"]
    assert rec["state"] == "verifying" and rec["clean_cycles"] == 2
    flag.touch()
    d.start()  # the first cycle after the restart completes the window and verifies
    s = ladder(d)
    assert (s["state"], s["ready"], s["since"]) == ("ready", 1, T0 + 60)


def test_where_the_daemon_runs_a_gate_only_reads_its_ladder(daemon_factory, tmp_path):
    """gate --recovery beside a running daemon: the daemon's ladder decides; the gate neither records its own check
    nor runs a verification of its own (its inventory's verification would pass), so the two never disagree."""
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path

    from tests.childenv import pythonpath

    here = socket.gethostname()
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    flag = tmp_path / "verify-passes"
    sc = scenario(flag, clean_cycles=1)
    sc.update(hosts=[here], local_host=here, findings={here: [OK]}, facts={here: {"host": {"boot_id": boot}}})
    d = daemon_factory(sc).start()
    assert json.loads((tmp_path / "recovery.json").read_text())["hosts"][here]["state"] == "verifying"
    work = tmp_path / "gate"
    work.mkdir()
    # a live gate of this machine (a replay moves and reads no ladder): a profile that passes here, as root
    (work / "inventory.yaml").write_text(f"hosts:\n  {here}: {{address: 127.0.0.1}}\npolicy:\n  verify: "
                                         "{deep: 'off', serving: 'off', commands: [['true']]}\n"
                                         "profiles:\n  here: {require: [host.privileges], fail_free: false}\n")
    env = {**os.environ, "HOME": str(work), "STATE_DIRECTORY": str(tmp_path)}
    env.pop("GPUDOCTOR_INVENTORY", None)
    env["PYTHONPATH"] = pythonpath(env=env)

    def gate():
        return subprocess.run([sys.executable, "-m", "gpudoctor", "gate", "--profile", "here", "--recovery",
                               "--json", "--recovery-wait", "30"], cwd=work, env=env, capture_output=True, text=True,
                              timeout=60)

    before = (tmp_path / "recovery.json").read_text()
    r = gate()
    assert r.returncode == 2, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert doc["recovery"]["moved_by"] == "daemon" and doc["recovery"]["verification"] is None
    assert doc["blockers"][0]["key"] == "recovery.ladder"
    assert doc["blockers"][0]["summary"].startswith("verifying: verification failed (commands: test -e")
    assert (tmp_path / "recovery.json").read_text() == before  # read only
    flag.touch()
    d.step()  # the next cycle, past the backoff (30 s): the daemon verifies again and passes
    r = gate()
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["recovery"] == {**json.loads(r.stdout)["recovery"], "state": "ready", "ready": True,
                                                "moved_by": "daemon"}


def test_an_unknown_beside_judged_checks_does_not_block_but_nothing_judged_does(daemon_factory, tmp_path):
    """The ladder's passive check is the default gate's rule (docs/recovery.md): a failure blocks, an unknown finding
    beside checks that judged does not, and a host with nothing judged never verifies."""
    flag = tmp_path / "verify-passes"
    flag.touch()
    unknown = {"id": "driver.xid", "status": "unknown", "summary": "the kernel log is not readable"}
    sc = scenario(flag, clean_cycles=1)
    sc["findings"] = {"ct200": [unknown]}
    d = daemon_factory(sc).start()
    s = ladder(d)
    assert (s["state"], s["ready"]) == ("failing", 0) and "the kernel log is not readable" in s["reason"]
    d.write_scenario(findings={"ct200": [OK, unknown]})
    d.step()
    assert ladder(d)["ready"] == 1
