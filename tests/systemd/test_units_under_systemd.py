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
    lab.write(f"/etc/systemd/system/{unit}.d/gpudoctor.conf",
              (REPO / "systemd/examples/sglang.service.d/gpudoctor.conf").read_text())
    for u in (unit, "gpudoctor-gate.service"):
        lab.write(f"/etc/systemd/system/{u}.d/lab-standins.conf", lab.standin_dropin())
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
        lab.systemctl("start", unit)
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
