"""The real daemon process: sd_notify over a real socket, /metrics and /healthz over real HTTP, budgets on a fake clock."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

from daemon_harness import T0

CUDA_FAIL = {"id": "cuda.init", "status": "fail", "summary": "cuInit returned 999 (CUDA_ERROR_UNKNOWN)",
             "remedy": "lxc.cgroup_allow"}
UVM_FAIL = {"id": "devices.uvm.open", "status": "fail", "summary": "open(/dev/nvidia-uvm) -> EPERM",
            "subject": "/dev/nvidia-uvm", "remedy": "devices.uvm_node"}
OK = {"id": "driver.nvml.init", "status": "ok", "summary": "NVML initialised"}


def scenario(findings, *, heal=(), remedies=None, **budgets):
    return {"hosts": ["ct200"], "local_host": None,
            "policy": {"auto_apply": list(heal), "budgets": budgets},
            "findings": {"ct200": findings}, "remedies": remedies or {}}


def test_ready_status_watchdog_metrics_healthz_and_clean_stop(daemon_factory):
    d = daemon_factory(scenario([OK, CUDA_FAIL]), watchdog_usec=100_000).start()
    ready = d.wait_datagram(lambda m: "READY=1" in m.split("\n"))
    assert "STATUS=ct200 fail (cuInit returned 999" in ready
    assert "next check in 60 s" in ready
    d.wait_datagram(lambda m: m == "WATCHDOG=1")

    m = d.metrics()
    assert m[("gpudoctor_check_status", frozenset({("host", "ct200"), ("check", "cuda.init"), ("subject", "")}))] == 2
    assert m[("gpudoctor_check_status", frozenset({("host", "ct200"), ("check", "driver.nvml.init"),
                                                   ("subject", "")}))] == 0
    assert m[("gpudoctor_host_status", frozenset({("host", "ct200")}))] == 2
    assert m[("gpudoctor_host_up", frozenset({("host", "ct200")}))] == 1
    assert m[("gpudoctor_last_run_timestamp_seconds", frozenset({("host", "ct200")}))] == T0
    assert m[("gpudoctor_breaker_state", frozenset({("host", "ct200")}))] == 0
    assert m[("gpudoctor_daemon_cycles_total", frozenset())] == 1

    code, body = d.get("/healthz")
    assert code == 200
    h = json.loads(body)
    assert h["status"] == "ok" and h["hosts"]["ct200"]["verdict"] == "fail"
    assert d.get("/nope")[0] == 404

    # the fault clears: the next cycle (clock + interval) shows it on /metrics
    d.write_scenario(findings={"ct200": [OK, dict(CUDA_FAIL, status="ok")]})
    d.step()
    m = d.metrics()
    assert m[("gpudoctor_host_status", frozenset({("host", "ct200")}))] == 0
    assert m[("gpudoctor_last_run_timestamp_seconds", frozenset({("host", "ct200")}))] == T0 + 60
    d.wait_datagram(lambda m: m.startswith("STATUS=ct200 ok"))

    n = len(d.datagrams)
    assert d.stop() == 0
    d.wait_datagram(lambda m: m == "STOPPING=1", start=n)
    assert d.read_state()["pid"] is None


def test_abstract_notify_socket(daemon_factory):
    d = daemon_factory(scenario([OK]), abstract_socket=True, watchdog_usec=None).start()
    assert d.notify_addr.startswith("@")
    assert "STATUS=ct200 ok" in d.wait_datagram(lambda m: "READY=1" in m)
    assert d.stop() == 0


def test_reboot_budget_at_most_once_per_hour_across_a_restart(daemon_factory):
    """A persistent fault whose remedy reboots the container: over 5 simulated hours, never two reboots within
    an hour, even when the daemon is restarted in between; the state file remembers."""
    sc = scenario([CUDA_FAIL], heal=["lxc.cgroup_allow", "lxc.cgroup_allow.reboot"],
                  remedies={"lxc.cgroup_allow": {"reboot": True, "result": "ok"}},
                  max_attempts_per_hour=10, breaker_threshold=100, backoff_s=1)
    d = daemon_factory(sc, interval=300).start()
    for _ in range(6):  # 30 minutes
        d.step()
    assert d.stop() == 0
    d.start()  # restart half-way through the hour: the budget survives
    for _ in range(54):  # 4.5 more hours
        d.step()
    times = [a["at"] for a in d.applied()]
    assert times[0] == T0
    assert all(b - a >= 3600 for a, b in zip(times, times[1:])), times
    assert 5 <= len(times) <= 6  # once an hour over 5 hours, and no more
    m = d.metrics()
    assert m[("gpudoctor_remedies_skipped_total",
              frozenset({("host", "ct200"), ("remedy", "lxc.cgroup_allow"), ("reason", "hourly_cap")}))] > 0
    st = d.read_state()["hosts"]["ct200"]["remedies"]["lxc.cgroup_allow"]
    assert st["last_result"] == "ineffective" and st["consecutive_failures"] >= 4


def test_a_change_that_needs_a_restart_waits_unless_restarts_are_allowed(daemon_factory):
    sc = scenario([CUDA_FAIL], heal=["lxc.*"], remedies={"lxc.cgroup_allow": {"reboot": True, "result": "ok"}})
    sc["policy"]["never_apply"] = ["*.reboot"]
    d = daemon_factory(sc).start()
    d.step()
    assert d.applied() == []
    assert d.metrics()[("gpudoctor_remedies_skipped_total", frozenset({
        ("host", "ct200"), ("remedy", "lxc.cgroup_allow"), ("reason", "reboot_not_allowed")}))] == 2


def test_backoff_grows_then_breaker_opens_then_reset(daemon_factory):
    sc = scenario([UVM_FAIL], heal=["devices.*"], remedies={"devices.uvm_node": {"result": "fail"}},
                  max_attempts_per_hour=50, backoff_s=60, backoff_factor=2, breaker_threshold=4,
                  breaker_cooldown_s=1800)
    d = daemon_factory(sc, interval=30).start()
    for _ in range(40):  # 20 minutes in 30 s steps
        d.step()
    times = [a["at"] - T0 for a in d.applied()]
    # attempts at 0, then after 60, 120, 240 s of backoff: gaps grow; the 4th failure opens the breaker
    assert times == [0, 60, 180, 420], times
    m = d.metrics()
    host = ("host", "ct200")
    assert m[("gpudoctor_breaker_state", frozenset({host}))] == 1
    assert m[("gpudoctor_remedies_applied_total",
              frozenset({host, ("remedy", "devices.uvm_node"), ("result", "failed")}))] == 4
    assert m[("gpudoctor_remedies_skipped_total",
              frozenset({host, ("remedy", "devices.uvm_node"), ("reason", "backoff")}))] >= 5
    assert m[("gpudoctor_remedies_skipped_total",
              frozenset({host, ("remedy", "devices.uvm_node"), ("reason", "breaker")}))] >= 10
    assert "breaker open" in d.datagrams[-1] or any("breaker open" in x for x in d.datagrams[-3:])
    code, body = d.get("/healthz")
    assert code == 200 and json.loads(body)["hosts"]["ct200"]["breaker"] == "open"

    # cool-down passes (1800 s after opening at 420): one half-open attempt, it fails, the breaker reopens
    for _ in range(36):  # to 2280 s
        d.step()
    times = [a["at"] - T0 for a in d.applied()]
    assert times[4:] == [2220], times
    assert d.read_state()["hosts"]["ct200"]["breaker"]["state"] == "open"

    # `gpudoctor daemon --reset-breaker` signals the running daemon; healing resumes at the next cycle
    r = subprocess.run([sys.executable, "-m", "gpudoctor", "daemon", "--state", str(d.state), "--reset-breaker"],
                       env=d.env(), capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and "asked the running daemon" in r.stdout
    end = time.monotonic() + 10
    while time.monotonic() < end and d.read_state()["hosts"]["ct200"]["breaker"]["state"] != "closed":
        time.sleep(0.02)
    assert d.read_state()["hosts"]["ct200"]["breaker"]["state"] == "closed"
    assert d.metrics()[("gpudoctor_breaker_state", frozenset({host}))] == 0
    d.step(3600)  # past any backoff
    assert len(d.applied()) == 6


def test_remedy_credited_only_when_the_next_check_confirms(daemon_factory):
    sc = scenario([UVM_FAIL], heal=["devices.uvm_node"], remedies={"devices.uvm_node": {"result": "ok"}})
    d = daemon_factory(sc).start()
    assert len(d.applied()) == 1
    assert d.read_state()["hosts"]["ct200"]["pending_verify"] == {"devices.uvm_node": "devices.uvm.open[/dev/nvidia-uvm]"}
    d.write_scenario(findings={"ct200": [dict(UVM_FAIL, status="ok")]})
    d.step()
    led = d.read_state()["hosts"]["ct200"]["remedies"]["devices.uvm_node"]
    assert led["last_result"] == "ok" and led["consecutive_failures"] == 0
    assert d.read_state()["hosts"]["ct200"]["pending_verify"] == {}


def test_policy_gates_healing_and_sighup_reloads_it(daemon_factory):
    sc = scenario([UVM_FAIL], heal=[], remedies={"devices.uvm_node": {"result": "ok"}})
    d = daemon_factory(sc).start()
    d.step()
    assert d.applied() == []
    m = d.metrics()
    # no allow-list at all: healing is off, nothing is even planned
    assert not any(k[0] == "gpudoctor_remedies_skipped_total" for k in m)

    d.write_scenario(policy={"auto_apply": ["lxc.*"]})  # allows something else
    n = len(d.datagrams)
    d.signal(signal.SIGHUP)
    d.wait_datagram(lambda m: m.startswith("RELOADING=1"), start=n)
    d.wait_datagram(lambda m: "READY=1" in m, start=n)
    d.step()
    assert d.applied() == []
    m = d.metrics()
    assert m[("gpudoctor_remedies_skipped_total", frozenset({("host", "ct200"), ("remedy", "devices.uvm_node"),
                                                             ("reason", "policy")}))] == 1

    d.write_scenario(policy={"auto_apply": ["devices.*"], "never_apply": ["devices.uvm_*"]})  # never wins
    d.signal(signal.SIGHUP)
    d.step()
    assert d.applied() == []
    assert d.metrics()[("gpudoctor_remedies_skipped_total", frozenset({("host", "ct200"),
                       ("remedy", "devices.uvm_node"), ("reason", "policy")}))] == 2

    d.write_scenario(policy={"auto_apply": ["devices.*"], "never_apply": ["devices.other"]})
    d.signal(signal.SIGHUP)
    d.step()
    assert [a["remedy"] for a in d.applied()] == ["devices.uvm_node"]

    # a broken policy on reload keeps the old one and says so on /healthz and in STATUS
    d.write_scenario(policy={"auto_apply": "devices.uvm_node"})
    n = len(d.datagrams)
    d.signal(signal.SIGHUP)
    d.wait_datagram(lambda m: "reload failed" in m, start=n)
    code, body = d.get("/healthz")
    assert code == 200 and "policy.auto_apply must be a list" in json.loads(body)["reload_error"]
    assert d.proc.poll() is None


def test_unreachable_host_is_its_own_status_and_sigusr1_checks_now(daemon_factory):
    sc = scenario([OK])
    sc["hosts"] = ["ct200", "ct201"]
    sc["findings"]["ct201"] = [OK]
    sc["unreachable"] = ["ct201"]
    d = daemon_factory(sc).start()
    m = d.metrics()
    assert m[("gpudoctor_host_up", frozenset({("host", "ct201")}))] == 0
    assert m[("gpudoctor_host_status", frozenset({("host", "ct201")}))] == 3
    assert m[("gpudoctor_host_status", frozenset({("host", "ct200")}))] == 0
    assert d.read_state()["hosts"]["ct201"]["verdict"] == "unreachable"
    d.write_scenario(unreachable=[])
    before = d.cycles()
    d.signal(signal.SIGUSR1)  # no clock change: SIGUSR1 alone triggers a cycle
    d.wait_cycles(before + 1)
    assert d.metrics()[("gpudoctor_host_up", frozenset({("host", "ct201")}))] == 1


def test_once_exits_with_the_verdict_and_keeps_budgets(daemon_factory):
    sc = scenario([UVM_FAIL], heal=["devices.uvm_node"], remedies={"devices.uvm_node": {"result": "fail"}},
                  backoff_s=600)
    d = daemon_factory(sc)
    r = d.run_once()
    assert r.returncode == 2, r.stderr
    r = d.run_once()  # same clock: inside the backoff, nothing applied
    assert r.returncode == 2
    assert len(d.applied()) == 1
    d.write_scenario(findings={"ct200": [OK]})
    assert d.run_once().returncode == 0


def test_crashing_remedy_counts_as_failure_and_daemon_survives(daemon_factory):
    sc = scenario([UVM_FAIL], heal=["devices.uvm_node"], remedies={"devices.uvm_node": {"result": "raise"}},
                  breaker_threshold=1)
    d = daemon_factory(sc).start()
    assert d.read_state()["hosts"]["ct200"]["breaker"]["state"] == "open"
    d.step()
    assert d.proc.poll() is None and len(d.applied()) == 1
