"""#24 item 1 (and 4, 5 under the real thing): the project's own units from systemd/, byte for byte, under systemd 252
as PID 1 (tests/systemdlab.py): Type=notify readiness only after the first cycle's READY=1, /metrics, the kernel log
the shipped unit lets the daemon read (and a sandbox that hides it is never ok), no child's datagram on the daemon's
notify socket over 3 cycles, the watchdog restarting a stopped daemon, a serving unit's DevicePolicy=closed with a stale
rule refused by systemd's own device program until `gpudoctor fix --unit` writes its drop-in, and the daemon started
at boot after `systemctl reboot` (nspawn exits 133 and is started again).

Real: systemd 252 PID 1, journald, systemctl, systemd-run, systemd-analyze, the kernel's cgroup2 device programs
(bpftool shows them), the vcs driver behind the uvm stand-in node, gpudoctor installed as the tests run it.
Stand-ins: the NVIDIA driver's files and tools (the LXC lab's; tests/systemdlab.py says which).
"""

from __future__ import annotations

import json
import re
import sys
import time

DAEMON = "gpudoctor.service"
STATE = "/var/lib/gpudoctor/daemon.json"
RECOVERY = "/var/lib/gpudoctor/recovery.json"
GATE_INVENTORY = "/etc/gpudoctor/gate-lab.yaml"
DROPIN_DIR = "/run/systemd/system/gpudoctor.service.d"  # runtime drop-ins the tests add and remove
REJECTED = re.compile(r"Got notification message from PID \d+, but reception only permitted for main PID")


def _state(lab) -> dict:
    r = lab.sh(f"cat {STATE}", check=False)
    return json.loads(r.stdout) if r.returncode == 0 and r.stdout.strip() else {}


def _wait(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def _wait_cycles(lab, n, timeout=90):
    return _wait(lambda: _state(lab).get("cycles", 0) >= n, timeout, f"{n} daemon cycles")


def _findings(lab) -> dict:
    hosts = _state(lab).get("hosts") or {}
    assert len(hosts) == 1, hosts
    return next(iter(hosts.values()))["findings"]


def _restart_with(lab, dropin: str | None):
    lab.sh(f"rm -rf {DROPIN_DIR}")
    if dropin:
        lab.sh(f"mkdir -p {DROPIN_DIR} && printf '%s' '{dropin}' > {DROPIN_DIR}/lab.conf")
    lab.systemctl("daemon-reload")
    lab.sh(f"rm -f {STATE}")
    lab.systemctl("restart", DAEMON)  # Type=notify: returns once READY=1 came


def test_the_daemon_is_ready_only_after_its_first_cycle_and_serves_metrics(sdlab):
    lab = sdlab
    seen = []
    lab.systemctl("start", "--no-block", DAEMON)
    while True:
        s = lab.show(DAEMON, "ActiveState", "StatusText", "MainPID")
        if not seen or seen[-1] != s["ActiveState"]:
            seen.append(s["ActiveState"])
            if s["ActiveState"] == "activating":
                assert _state(lab).get("cycles", 0) == 0  # not ready before the first cycle ends
        if s["ActiveState"] != "activating" or len(seen) > 5:
            break
        time.sleep(0.05)
    assert seen[0] == "activating" and seen[-1] == "active", seen
    assert _state(lab)["cycles"] >= 1 and "next check in 120 s" in s["StatusText"], s
    assert _state(lab)["pid"] == int(s["MainPID"])
    body = lab.sh(f"{sys.executable} -c \"import urllib.request as u; "
                  f"print(u.urlopen('http://127.0.0.1:9835/metrics', timeout=10).read().decode())\"").stdout
    assert "gpudoctor_host_status{" in body and "gpudoctor_daemon_cycles_total" in body


def test_the_shipped_unit_lets_the_daemon_read_the_kernel_log_and_a_sandbox_is_never_ok(sdlab):
    lab = sdlab
    _restart_with(lab, None)
    assert _findings(lab)["driver.xid"] == "ok"  # read: records there, no Xid
    _restart_with(lab, "[Service]\nProtectKernelLogs=yes\n")  # what the unit shipped with before
    try:
        assert _findings(lab)["driver.xid"] == "info"  # "could not read the kernel log": never ok
    finally:
        _restart_with(lab, None)


def test_kmsg_in_a_protectkernellogs_unit_is_not_the_kernel_log(sdlab):
    """systemd hides /dev/kmsg behind one of its inaccessible nodes (an empty regular file, or the 0:0 character
    device where it could make one): what the probe reads there is nothing, which driver.xid must not take for ok."""
    r = sdlab.run_unit(["/bin/sh", "-c", "stat -c '%F %t:%T %a' /dev/kmsg; head -c 100 /dev/kmsg | wc -c"],
                       properties=("ProtectKernelLogs=yes",))
    seen = sdlab.run_unit(["/bin/sh", "-c", "stat -c '%F %t:%T %a' /dev/kmsg"])
    assert seen.stdout.strip() == "character special file 1:b 644", seen.stdout + seen.stderr  # 1:11, the real one
    kind, numbers, mode, *rest = r.stdout.split("\n")[0].rsplit(" ", 2) + r.stdout.split("\n")[1:]
    inaccessible = (("regular empty file", "0:0", "0"), ("character special file", "0:0", "0"))
    assert (kind, numbers, mode) in inaccessible, r.stdout
    assert rest[0].strip() == "0", r.stdout + r.stderr
    # gpudoctor's probe in such a unit, with the daemon's bounding set less CAP_SYSLOG (what ProtectKernelLogs= does)
    chk = sdlab.run_unit(["gpudoctor", "check", "--only", "driver", "--json", "--timeout", "60"],
                         properties=("ProtectKernelLogs=yes",))
    [x] = [f for f in json.loads(chk.stdout)["findings"] if f["id"] == "driver.xid"]
    assert x["status"] == "info" and "Xids were not checked" in x["summary"], x
    assert "ProtectKernelLogs=yes" in x["summary"] and x["evidence"][0].startswith("/dev/kmsg → "), x


def test_no_child_of_the_daemon_speaks_on_its_notify_socket_over_3_cycles(sdlab):
    lab = sdlab
    _restart_with(lab, None)
    start = _state(lab)["cycles"]
    for i in range(3):
        lab.systemctl("kill", "--kill-whom=main", "--signal=SIGUSR1", DAEMON)  # "check now"
        _wait_cycles(lab, start + i + 1)
    log = lab.journal(DAEMON)
    assert not REJECTED.findall(log), log[-3000:]
    assert lab.show(DAEMON, "StatusErrno")["StatusErrno"] == "0"


def test_a_child_that_inherits_notify_socket_is_rejected_so_the_test_above_can_fail(sdlab):
    """Control: a main process whose child kept NOTIFY_SOCKET and sends what `systemctl is-enabled` of a missing
    unit sends (ERRNO=2), still running when systemd reads it (a child that is gone is only "ignored")."""
    child = ("import os, socket, time; s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); "
             "s.sendto(b'ERRNO=2', os.environ['NOTIFY_SOCKET']); time.sleep(1)")
    main = (f"import subprocess, os, socket, sys; subprocess.run([sys.executable, '-c', {child!r}]); "
            f"socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto(b'READY=1', os.environ['NOTIFY_SOCKET'])")
    r = sdlab.run_unit([sys.executable, "-c", main], properties=("Type=notify", "NotifyAccess=main"))
    assert r.returncode == 0, r.stderr
    assert REJECTED.search(sdlab.journal()), sdlab.journal()[-3000:]


def test_the_watchdog_restarts_a_stopped_daemon(sdlab):
    lab = sdlab
    _restart_with(lab, "[Service]\nWatchdogSec=4s\nRestartSec=1s\n")  # the shipped 120 s/10 s, shortened
    try:
        before = lab.show(DAEMON, "MainPID", "NRestarts")
        lab.sh(f"kill -STOP {before['MainPID']}")
        after = _wait(lambda: (lambda s: s if s["ActiveState"] == "active" and s["MainPID"] not in
                               ("0", before["MainPID"]) else None)(lab.show(DAEMON, "MainPID", "NRestarts",
                                                                               "ActiveState")), 60, "a restart")
        assert int(after["NRestarts"]) == int(before["NRestarts"]) + 1
        assert "Watchdog timeout" in lab.journal(DAEMON)
    finally:
        _restart_with(lab, None)


def test_a_stale_device_allow_is_refused_by_systemd_named_by_check_and_fixed_by_the_dropin(sdlab):
    lab = sdlab
    unit = "sglang.service"
    shown = [ln.split("=", 1)[1] for ln in lab.systemctl("show", unit, "--property=DeviceAllow").stdout.splitlines()]
    assert shown == ["/dev/char/510:1 rw", "/dev/char/510:0 rw", "/dev/nvidia0 rw", "/dev/nvidiactl rw"]  # reversed
    lab.systemctl("start", unit, check=False)  # Type=exec: the job may end before the server's open does
    _wait(lambda: lab.show(unit, "ActiveState")["ActiveState"] == "failed", 30, f"{unit} to fail")
    assert "/dev/nvidia-uvm: Operation not permitted" in lab.journal(unit)  # systemd's device program: EPERM
    chk = lab.run_unit(["gpudoctor", "check", "--unit", unit, "--json", "--timeout", "60"], env=lab.standin_env())
    d = json.loads(chk.stdout)
    assert d["root_cause"]["id"] == "boundary.systemd.device_allow", (d["root_cause"], chk.stderr)
    assert d["root_cause"]["subject"] == f"{unit}:/dev/nvidia-uvm" and "EPERM" in d["root_cause"]["summary"]
    fx = lab.run_unit(["gpudoctor", "fix", "--unit", unit, "--only", "systemd.device_allow", "--apply", "--yes",
                       "--timeout", "60"], env=lab.standin_env())
    assert "APPLIED  systemd.device_allow" in fx.stdout, fx.stdout + fx.stderr
    drop = lab.sh(f"cat /etc/systemd/system/{unit}.d/50-gpudoctor-devices.conf").stdout
    assert "DeviceAllow=char-nvidia-uvm rw" in drop
    assert lab.show(unit, "NeedDaemonReload")["NeedDaemonReload"] == "no"  # the remedy reloaded systemd
    lab.systemctl("restart", unit)
    try:
        _wait(lambda: "serving: /dev/nvidia-uvm opened" in lab.journal(unit), 20, "the server's open")
        progs = lab.bpf_programs()
        mine = [k for k in progs if k.endswith(f"system.slice/{unit}")]
        assert mine and "cgroup_device" in progs[mine[0]], progs  # systemd's program, attached and letting it open
    finally:
        lab.systemctl("stop", unit)


def test_the_gate_in_execstartpre_blocks_the_server_until_the_host_is_ready(sdlab):
    """systemd/examples/sglang.service.d/gpudoctor.conf as shipped: gpudoctor-gate.service once per boot, and
    `gate --profile benchmark --model /dev/shm/models/Qwen3-32B` before every start, in the server's own cgroup.
    The model is not staged: systemd never runs the server; staged (gpudoctor model stage), it starts."""
    from tests.systemdlab import MODEL, REPO

    lab, unit = sdlab, "sglang.service"
    lab.systemctl("stop", DAEMON)  # no daemon: the gate moves the recovery ladder itself (docs/recovery.md)
    lab.sh(f"rm -f {RECOVERY}")
    lab.write(f"/etc/systemd/system/{unit}.d/gpudoctor.conf",
              (REPO / "systemd/examples/sglang.service.d/gpudoctor.conf").read_text())
    lab.write(GATE_INVENTORY, "hosts:\n  lab: {address: 127.0.0.1}\npolicy:\n  verify: {deep: 'off', serving: 'off', "
                              "commands: [['true']]}\n")
    for u in (unit, "gpudoctor-gate.service"):
        lab.write(f"/etc/systemd/system/{u}.d/lab-standins.conf",
                  lab.standin_dropin() + f"Environment=GPUDOCTOR_INVENTORY={GATE_INVENTORY}\n")
    lab.systemctl("daemon-reload")
    lab.sh(f"rm -rf {MODEL}")
    served = lab.journal(unit).count("serving: /dev/nvidia-uvm opened")
    try:
        assert lab.systemctl("start", unit, check=False).returncode != 0
        log = lab.journal(unit)
        assert f"BLOCK workload.model.staged_this_boot[{MODEL}]" in log, log[-3000:]
        assert lab.show(unit, "ActiveState")["ActiveState"] == "failed"
        assert lab.show("gpudoctor-gate.service", "ActiveState", "Result") == {"ActiveState": "active",
                                                                               "Result": "success"}
        assert log.count("serving: /dev/nvidia-uvm opened") == served  # ExecStart= never ran
        st = lab.run_unit(["gpudoctor", "model", "stage", "--from", lab.model_source(), "--to", MODEL, "--apply"],
                          env=lab.standin_env())
        assert st.returncode == 0, st.stdout + st.stderr
        started = lab.systemctl("start", unit, check=False)
        assert started.returncode == 0, lab.journal(unit)[-3000:] + lab.journal("gpudoctor-gate.service")[-2000:]
        _wait(lambda: lab.journal(unit).count("serving: /dev/nvidia-uvm opened") == served + 1, 20, "the server")
        assert lab.show(unit, "ActiveState")["ActiveState"] == "active"
    finally:
        lab.systemctl("stop", unit, check=False)
        lab.sh(f"rm -f /etc/systemd/system/{unit}.d/gpudoctor.conf && systemctl daemon-reload")


def test_the_daemon_starts_at_boot_after_a_reboot(sdlab):
    lab = sdlab
    lab.systemctl("enable", DAEMON)
    old = lab.show(DAEMON, "MainPID")["MainPID"]
    lab.reboot()
    assert lab.exits[-1:] == [133] and lab.boots >= 2
    s = _wait(lambda: (lambda s: s if s["ActiveState"] == "active" else None)(
        lab.show(DAEMON, "ActiveState", "MainPID", "UnitFileState")), 90, "gpudoctor.service active after boot")
    assert s["UnitFileState"] == "enabled" and s["MainPID"] != old
    assert "Startup finished" in lab.journal()  # the journal of the new boot


def _ladder(lab) -> dict:
    r = lab.sh(f"cat {RECOVERY}", check=False)
    hosts = json.loads(r.stdout)["hosts"] if r.returncode == 0 and r.stdout.strip() else {}
    return next(iter(hosts.values())) if hosts else {}


def _moves(lab) -> list[tuple[str, str]]:
    """The ladder's transitions the daemon logged (recovery.moved), in order, this boot."""
    out = []
    for line in lab.journal(DAEMON).splitlines():
        if '"event": "recovery.moved"' in line:
            ev = json.loads(line[line.index("{"):])
            out.append((ev["before"], ev["after"]))
    return out


def test_the_recovery_arc_of_the_shipped_daemon_unit(sdlab):
    """The shipped gpudoctor.service under systemd 252 (a drop-in adds the inventory, a 2 s interval and the tmpfs
    model): the model wiped -> the daemon restages it (model.stage) -> verifying -> the verification (policy verify:
    commands, a flag file) fails, then passes -> ready; the same fault three times -> needs-inspection, no heal;
    a person restages and `gpudoctor release` verifies and releases; a daemon restart in verifying neither releases
    early nor forgets."""
    from tests.systemdlab import MODEL

    lab = sdlab
    inv, flag = "/etc/gpudoctor/recovery-lab.yaml", "/var/lib/gpudoctor-lab/verify-passes"
    lab.sh(f"mkdir -p /var/lib/gpudoctor-lab && rm -f {flag} {RECOVERY}")
    lab.write(inv, "hosts:\n  lab: {address: 127.0.0.1}\npolicy:\n  auto_apply: [model.stage]\n"
                   "  budgets: {backoff_s: 0, max_changes_per_hour: 100}\n"
                   "  recovery: {clean_cycles: 1, retry_s: 0}\n"
                   f"  verify: {{deep: 'off', serving: 'off', commands: [[test, -e, {flag}]]}}\n")
    stage = ["gpudoctor", "model", "stage", "--from", lab.model_source(), "--to", MODEL, "--apply"]
    st = lab.run_unit(stage, env=lab.standin_env())
    assert st.returncode == 0, st.stdout + st.stderr
    env = " ".join(f'"{k}={v}"' for k, v in lab.standin_env().items())
    _restart_with(lab, f"[Service]\nEnvironment={env}\nExecStart=\nExecStart=/usr/local/bin/gpudoctor daemon "
                       f"-i {inv} --interval 2 --model {MODEL} --no-xid\n")
    try:
        led = _wait(lambda: (lambda d: d if d.get("last_verification") else None)(_ladder(lab)), 60,
                    "the first verification")
        assert led["state"] == "verifying" and "verification failed (commands: test -e" in led["reason"], led
        lab.sh(f"touch {flag}")
        _wait(lambda: _ladder(lab).get("state") == "ready", 60, "ready")

        # the fault: the tmpfs model wiped; the verification fails once after the heal, then passes
        lab.sh(f"rm -f {flag} && rm -rf {MODEL}")
        led = _wait(lambda: (lambda d: d if d.get("state") == "verifying" and d.get("verify_failures") else None)(
            _ladder(lab)), 60, "a failed verification after the heal")
        assert "verification failed" in led["reason"]
        assert lab.sh(f"test -e {MODEL}/config.json", check=False).returncode == 0  # restaged by the daemon
        lab.sh(f"touch {flag}")
        _wait(lambda: _ladder(lab).get("state") == "ready", 60, "ready after the heal")
        moves = _moves(lab)
        assert ("ready", "failing") in moves and ("failing", "healing") in moves and ("healing", "verifying") in moves
        assert moves[-1] == ("verifying", "ready")

        # twice more: the third time is needs-inspection, and the daemon stops healing it
        lab.sh(f"rm -rf {MODEL}")
        _wait(lambda: _ladder(lab).get("state") == "ready" and len(_ladder(lab)["onsets"]) == 2, 60, "healed again")
        lab.sh(f"rm -rf {MODEL}")
        led = _wait(lambda: (lambda d: d if d.get("state") == "needs-inspection" else None)(_ladder(lab)), 60,
                    "needs-inspection")
        assert led["reason"].startswith("needs inspection: came back 2 times (3 failures)")
        cycles = _state(lab)["cycles"]
        _wait_cycles(lab, cycles + 2)
        assert lab.sh(f"test -e {MODEL}/config.json", check=False).returncode != 0  # no unattended heal
        body = lab.sh(f"{sys.executable} -c \"import urllib.request as u; "
                      f"print(u.urlopen('http://127.0.0.1:9835/metrics', timeout=10).read().decode())\"").stdout
        assert re.search(r'gpudoctor_remedies_skipped_total\{[^}]*reason="needs_inspection"[^}]*\} [1-9]', body), body
        assert re.search(r'gpudoctor_recovery_state\{[^}]*state="needs-inspection"[^}]*\} 1\.0', body)
        assert re.search(r'gpudoctor_ready\{[^}]*\} 0\.0', body)
        assert _ladder(lab)["state"] == "needs-inspection"

        # a person restages and releases: the release verifies first
        assert lab.run_unit(stage, env=lab.standin_env()).returncode == 0
        _wait(lambda: not _ladder(lab).get("failing_now"), 60, "a passing check")
        lab.sh(f"rm -f {flag}")
        rel = lab.run_unit(["gpudoctor", "release", "local", "-i", inv], env=lab.standin_env())
        assert rel.returncode == 1 and "verification failed" in rel.stderr, rel.stdout + rel.stderr
        assert _ladder(lab)["state"] == "needs-inspection"
        lab.sh(f"touch {flag}")
        rel = lab.run_unit(["gpudoctor", "release", "local", "-i", inv, "--json"], env=lab.standin_env())
        assert rel.returncode == 0 and json.loads(rel.stdout)["released"], rel.stdout + rel.stderr
        assert _ladder(lab)["state"] == "ready"

        # a restart in the middle of verifying: not ready after it, same transition time, then verified
        lab.sh(f"rm -f {flag} && rm -rf {MODEL}")
        led = _wait(lambda: (lambda d: d if d.get("state") == "verifying" and d.get("verify_failures") else None)(
            _ladder(lab)), 60, "verifying again")
        lab.systemctl("restart", DAEMON)
        after = _ladder(lab)
        assert after["state"] == "verifying" and after["since"] == led["since"], (led, after)
        lab.sh(f"touch {flag}")
        _wait(lambda: _ladder(lab).get("state") == "ready", 60, "ready after the restart")
    finally:
        _restart_with(lab, None)
        lab.sh(f"rm -f {RECOVERY}")


# What a unit's [Service] says about running it rather than sandboxing it: not passed to the transient copy.
_NOT_SANDBOX = {"Type", "ExecStart", "ExecReload", "Restart", "RestartSec", "TimeoutStartSec", "TimeoutStopSec",
                "WatchdogSec", "RemainAfterExit", "NotifyAccess", "Environment", "StateDirectory", "StateDirectoryMode"}


def _sandbox(unit: str) -> tuple[str, ...]:
    """Every hardening setting of the shipped unit, as systemd-run --property= arguments."""
    from tests.daemon.test_systemd_units import UNITS, read_unit

    svc = read_unit(UNITS / unit)["Service"]
    return tuple(f"{k}={v}" for k, v in svc.items() if k not in _NOT_SANDBOX)


def _statuses(r) -> dict:
    """{check[subject]: status}; the transient unit's own name (run-uN.service, a subject of the checks of the unit
    gpudoctor runs in) made one name."""
    assert r.stdout.strip(), r.stderr[-3000:]
    return {re.sub(r"run-u\d+\.service", "run-uN.service", f"{f['id']}[{f.get('subject') or ''}]"): f["status"]
            for f in json.loads(r.stdout)["findings"]}


def test_the_hardened_units_let_every_check_see_what_it_sees_outside_any_sandbox(sdlab):
    """#40: the daemon unit (no CAP_SYS_MODULE, ProtectKernelModules, a syscall deny list, ...) and the gate unit
    (strict, no fixing capabilities) both at systemd-analyze security <= 5.0: `gpudoctor check` under each one's
    exact hardening gives every check the status it has in a unit with no hardening at all (a transient unit too,
    so that the checks of the unit gpudoctor runs in see the same kind of place)."""
    lab = sdlab
    env = lab.standin_env()
    argv = ["gpudoctor", "check", "--json", "--timeout", "60"]
    plain = _statuses(lab.run_unit(argv, env=env))
    for must in ("driver.xid[", "host.driver.loaded["):  # the stand-in driver and the kernel log are seen at all
        assert [v for k, v in plain.items() if k.startswith(must)] == ["ok"], plain
    for unit in ("gpudoctor.service", "gpudoctor-gate.service"):
        props = _sandbox(unit)
        assert any(p.startswith("SystemCallFilter=") for p in props) and any(p.startswith("Capab") for p in props)
        inside = _statuses(lab.run_unit(argv, env=env, properties=props))
        diff = {k: (plain.get(k), inside.get(k)) for k in plain.keys() | inside.keys() if plain.get(k) != inside.get(k)}
        assert diff == {}, f"{unit}: checks that see otherwise under its sandbox: {diff}"
