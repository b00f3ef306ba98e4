"""The daemon's parts: budget arithmetic, breaker, policy parsing, state file, sd_notify, XID watcher."""

from __future__ import annotations

import json
import os
import socket
import stat
import time
from types import SimpleNamespace

import pytest

from gpudoctor.daemon.budget import Breaker, RemedyLedger
from gpudoctor.daemon.engine import Action, Outcome
from gpudoctor.daemon.loop import Daemon, DaemonConfig
from gpudoctor.daemon.policy import Budget, parse_policy
from gpudoctor.daemon.sdnotify import Notifier, WatchdogPinger
from gpudoctor.daemon.state import DaemonState, StateStore
from gpudoctor.daemon.xid import XidWatcher, xid_findings
from gpudoctor.errors import ConfigError
from gpudoctor.findings import Finding


def test_backoff_grows_exponentially_and_is_capped():
    b = Budget(backoff_s=60, backoff_factor=2, backoff_max_s=300)
    assert [b.backoff_after(n) for n in range(6)] == [0, 60, 120, 240, 300, 300]


def test_ledger_hourly_cap_and_backoff():
    b = Budget(max_attempts_per_hour=2, backoff_s=100)
    led = RemedyLedger()
    assert led.decide(b, 0) == (True, None, 0)
    led.record_attempt(0)
    led.record_result(False, 0)
    assert led.decide(b, 50) == (False, "backoff", 100)
    led.record_attempt(100)
    led.record_result(False, 100)
    allowed, reason, retry = led.decide(b, 400)
    assert (allowed, reason, retry) == (False, "hourly_cap", 3600)
    assert led.decide(b, 3600)[0] is True  # the first attempt left the window
    assert RemedyLedger().decide(Budget(max_attempts_per_hour=0), 0)[1] == "disabled"


def test_breaker_opens_half_opens_and_closes():
    br = Breaker()
    assert not br.record(False, 10, 3) and not br.record(False, 20, 3)
    assert br.record(False, 30, 3) and br.state == "open"
    assert not br.allows(100, 600) and br.reopens_at(600) == 630
    assert br.allows(630, 600) and br.state == "half_open"
    assert br.record(False, 640, 3) and br.state == "open" and br.times_opened == 2  # the half-open try failed
    assert br.allows(1240, 600)
    br.record(True, 1250, 3)
    assert br.state == "closed" and br.consecutive_failures == 0
    br.record(False, 1, 1)
    br.reset()
    assert br.state == "closed"
    assert Breaker.from_json({"state": "garbage"}).state == "open"  # unreadable errs on the side of not healing


def test_policy_parsing_and_reboot_caps():
    p = parse_policy({"auto_apply": ["devices.*", "lxc.*"], "never_apply": ["lxc.cgroup_allow"],
                      "budgets": {"max_changes_per_hour": 5, "backoff_s": 30, "breaker_threshold": 2,
                                  "max_reboots_per_day": 2, "some_other_tools_budget": 7}})
    assert p.allows("devices.node.create") and p.allows("lxc.reboot")
    assert not p.allows("lxc.cgroup_allow") and not p.allows("model.stage")  # never_apply wins; unlisted is off
    b = p.budget_for("devices.node.create")
    assert (b.max_attempts_per_hour, b.max_attempts_per_day, b.backoff_s) == (5, None, 30)
    rb = p.budget_for("lxc.reboot", reboot=True)
    assert (rb.max_attempts_per_hour, rb.max_attempts_per_day) == (1, 2)
    assert p.breaker_threshold == 2
    assert parse_policy(None).allow == () and parse_policy({}).allow == ()
    obj = SimpleNamespace(as_dict=lambda: {"auto_apply": ["x.*"], "never_apply": [], "budgets": {}, "checks": {}})
    assert parse_policy(obj).allows("x.y")


def test_daily_cap():
    b = Budget(max_attempts_per_hour=1, max_attempts_per_day=2, backoff_s=0)
    led = RemedyLedger()
    for t in (0, 3600):
        assert led.decide(b, t)[0]
        led.record_attempt(t)
    assert led.decide(b, 7200) == (False, "daily_cap", 86400)
    assert led.decide(b, 86400)[0]


@pytest.mark.parametrize("policy, msg", [
    ({"auto_apply": "x"}, "policy.auto_apply must be a list of remedy-id patterns"),
    ({"never_apply": [1]}, "policy.never_apply must be a list"),
    ({"budgets": []}, "policy.budgets must be a mapping"),
    ({"budgets": {"max_changes_per_hour": -1}}, "policy.budgets.max_changes_per_hour must be an integer >= 0"),
    ({"budgets": {"max_changes_per_hour": 1.5}}, "must be an integer >= 0"),
    ({"budgets": {"backoff_s": "60"}}, "policy.budgets.backoff_s must be a number >= 0"),
    ({"budgets": {"backoff_factor": 0.5}}, "backoff_factor must be >= 1"),
    ({"budgets": {"breaker_threshold": 0}}, "breaker_threshold must be >= 1"),
    ([], "policy must be a mapping"),
])
def test_bad_policies(policy, msg):
    with pytest.raises(ConfigError) as ei:
        parse_policy(policy, path="inv.yaml")
    assert msg in ei.value.one_line() and ei.value.one_line().startswith("inv.yaml: ")


def test_state_round_trip_mode_and_no_temp_files(tmp_path):
    store = StateStore(tmp_path / "d" / "state.json")
    st = DaemonState()
    st.host("ct200").ledger("lxc.reboot").record_attempt(5.0)
    st.host("ct200").breaker.record(False, 5.0, 1)
    store.save(st)
    back = store.load()
    assert back.hosts["ct200"].remedies["lxc.reboot"].attempts == [5.0]
    assert back.hosts["ct200"].breaker.state == "open"
    assert stat.S_IMODE(os.stat(store.path).st_mode) == 0o600
    assert os.listdir(store.path.parent) == ["state.json"]


@pytest.mark.parametrize("text", ["{not json", json.dumps({"schema": "other/9"}), json.dumps([1, 2])])
def test_unreadable_state_is_moved_aside_not_trusted(tmp_path, text):
    p = tmp_path / "state.json"
    p.write_text(text)
    st = StateStore(p).load()
    assert st.hosts == {} and not p.exists()
    aside = [x for x in os.listdir(tmp_path) if x.startswith("state.json.corrupt-")]
    assert len(aside) == 1 and (tmp_path / aside[0]).read_text() == text


def _dgram(path_or_abstract):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path_or_abstract)
    s.settimeout(2)
    return s


def test_notifier_path_and_abstract_sockets(tmp_path):
    srv = _dgram(str(tmp_path / "n.sock"))
    n = Notifier({"NOTIFY_SOCKET": str(tmp_path / "n.sock")})
    assert n.ready("up") and srv.recv(4096).decode().split("\n")[:2] == ["READY=1", "STATUS=up"]
    name = f"gpudoctor-unit-{os.getpid()}"
    srv2 = _dgram("\0" + name)
    n2 = Notifier({"NOTIFY_SOCKET": "@" + name})
    assert n2.watchdog() and srv2.recv(4096) == b"WATCHDOG=1"
    assert n2.reloading() and srv2.recv(4096).decode().startswith("RELOADING=1\nMONOTONIC_USEC=")
    assert Notifier({}).ready() is False  # outside systemd: a silent no-op
    assert Notifier({"NOTIFY_SOCKET": str(tmp_path / "gone.sock")}).status("x") is False


def test_watchdog_settings_and_stall():
    assert Notifier({"WATCHDOG_USEC": "30000000"}).watchdog_s == 30.0
    other = str(os.getpid() + 1)  # never "1": pytest is PID 1 when it is a container's first process
    assert Notifier({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": other}).watchdog_s is None  # for another pid
    assert Notifier({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}).watchdog_s == 30.0
    assert Notifier({"WATCHDOG_USEC": "0"}).watchdog_s is None
    p = WatchdogPinger(Notifier({}), stall_s=0.05)
    p.beat()
    time.sleep(0.08)
    assert p.stalled
    p.idle()
    time.sleep(0.08)
    assert not p.stalled  # waiting between cycles is not a stall


def test_watchdog_pings_stop_when_a_step_hangs(tmp_path):
    srv = _dgram(str(tmp_path / "w.sock"))
    srv.settimeout(5)
    n = Notifier({"NOTIFY_SOCKET": str(tmp_path / "w.sock"), "WATCHDOG_USEC": "40000"})
    p = WatchdogPinger(n, stall_s=0.2)
    p.beat()
    p.start()
    try:
        assert srv.recv(100) == b"WATCHDOG=1"
        time.sleep(0.3)  # the step is now stuck past stall_s
        while True:  # drain pings sent before the stall
            try:
                srv.settimeout(0.15)
                srv.recv(100)
            except socket.timeout:
                break
        with pytest.raises(socket.timeout):
            srv.recv(100)
    finally:
        p.stop()


class FakeNVML:
    """Just enough of pynvml's event API to feed the watcher: one XID 79 on GPU 0, then timeouts."""

    class NVMLError(Exception):
        pass

    class NVMLError_Timeout(NVMLError):  # noqa: N801 - pynvml's name
        pass

    nvmlEventTypeXidCriticalError = 8

    def __init__(self, xids):
        self.xids = list(xids)
        self.shutdown = False

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        self.shutdown = True

    def nvmlEventSetCreate(self):
        return "set"

    def nvmlEventSetFree(self, s):
        pass

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return f"h{i}"

    def nvmlDeviceRegisterEvents(self, h, types, s):
        if h == "h1":
            raise self.NVMLError("Not Supported")

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(busId=b"00000000:18:00.0")

    def nvmlDeviceGetIndex(self, dev):
        return int(dev[1:])

    def nvmlEventSetWait(self, s, ms):
        if self.xids:
            return SimpleNamespace(device="h0", eventType=8, eventData=self.xids.pop(0))
        time.sleep(ms / 1000)
        raise self.NVMLError_Timeout()


def test_xid_watcher_delivers_events_and_shuts_down():
    got = []
    nv = FakeNVML([79, 13])
    w = XidWatcher(got.append, nvml=nv, wait_ms=10)
    w.start()
    deadline = time.monotonic() + 5
    while len(got) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert w.running
    w.stop()
    assert [(e.gpu, e.xid, e.bus_id, e.critical) for e in got] == [(0, 79, "00000000:18:00.0", True),
                                                                  (0, 13, "00000000:18:00.0", False)]
    assert nv.shutdown and not w.running


def test_xid_watcher_without_a_driver_ends_quietly():
    """The real pynvml on a machine without the NVIDIA driver: the watcher stops with a reason, never raises."""
    w = XidWatcher(lambda e: None)
    w.start()
    w._thread.join(10)
    assert not w.running and w.reason and w.reason.startswith("NVML unavailable")


def test_xid_findings_keep_critical_ones_per_gpu():
    ev = [{"gpu": 0, "xid": 79, "bus_id": "00000000:18:00.0", "at": 100.0},
          {"gpu": 0, "xid": 79, "bus_id": "00000000:18:00.0", "at": 200.0},
          {"gpu": 1, "xid": 13, "bus_id": None, "at": 150.0},
          {"gpu": 1, "xid": 48, "bus_id": None, "at": 160.0}]
    fs = xid_findings(ev)
    assert [(f.id, f.subject, f.status.value) for f in fs] == [("driver.xid", "gpu0:xid79", "fail"),
                                                               ("driver.xid", "gpu1:xid48", "fail")]
    assert "fallen off the bus" in fs[0].summary and "2 this boot" in fs[0].evidence[0]
    assert fs[0].hint


class LocalEngine:
    hosts = ["gpu-node"]
    local_host = "gpu-node"
    policy = {}

    def check(self, host):
        return SimpleNamespace(findings=[Finding("cuda.init", "ok", "cuInit 0")], root_causes=[])

    def plan(self, host, d):
        return []

    def apply(self, host, a: Action):
        return Outcome(True)

    def close(self):
        pass


def test_critical_xid_becomes_a_finding_of_the_local_host_until_the_next_boot(tmp_path):
    from gpudoctor.daemon.clock import SystemClock
    from gpudoctor.daemon.xid import XidEvent

    store = StateStore(tmp_path / "s.json")
    d = Daemon(DaemonConfig(), engine_factory=lambda cfg: LocalEngine(), clock=SystemClock(), store=store)
    d.load()
    d.prepare()
    assert d.run_cycle() == 0
    d.on_xid(XidEvent(gpu=0, bus_id=None, xid=13, at=1.0))  # not critical
    d.on_xid(XidEvent(gpu=0, bus_id=None, xid=79, at=2.0))
    assert d._run_now  # a critical XID asks for a cycle now
    assert d.run_cycle() == 2
    hs = store.load().hosts["gpu-node"]
    assert hs.verdict == "fail" and hs.findings["driver.xid[gpu0:xid79]"] == "fail"
    assert hs.root_cause.startswith("Xid 79 ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS on GPU 0")
    # a new boot clears them
    raw = json.loads(store.path.read_text())
    raw["boot_id"] = "some-older-boot"
    store.path.write_text(json.dumps(raw))
    d2 = Daemon(DaemonConfig(), engine_factory=lambda cfg: LocalEngine(), clock=SystemClock(), store=store)
    d2.load()
    d2.prepare()
    assert d2.run_cycle() == 0
