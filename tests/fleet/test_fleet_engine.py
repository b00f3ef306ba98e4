"""The fleet engine: bounded concurrency, per-host isolation, unreachable as its own status, real snapshots."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from gpudoctor.errors import HostUnreachable, InputError
from gpudoctor.fleet import check_fleet, select_hosts

from fleet_helpers import replay_check


def test_parallelism_is_bounded_and_every_host_is_checked():
    live, peak, cond = [0], [0], threading.Condition()

    def check(name):
        with cond:
            live[0] += 1
            peak[0] = max(peak[0], live[0])
            cond.notify_all()
            cond.wait_for(lambda: live[0] >= 8 or peak[0] > 8, timeout=5)  # hold until the batch is full
        result = replay_check("h200-healthy")
        with cond:
            live[0] -= 1
        return result

    names = [f"n{i:02d}" for i in range(40)]
    res = check_fleet(None, names, parallel=8, check_fn=check)
    assert peak[0] == 8  # all 8 ran at once, never more
    assert [r.host for r in res.records] == names
    assert res.counts()["ok"] == 40 and res.exit_code == 0


def test_failed_unreachable_and_crashing_hosts_never_spoil_the_others():
    def check(name):
        if name == "down":
            raise HostUnreachable("ssh 10.0.0.9:22: connection refused")
        if name == "buggy":
            raise KeyError("driver")
        return replay_check(name)

    names = ["h200-healthy", "down", "h200-uvm-blocked", "buggy", "h200-uvmtools-000"]
    res = check_fleet(None, names, parallel=3, check_fn=check)
    by = {r.host: r for r in res.records}
    assert by["down"].status == "unreachable" and "connection refused" in by["down"].error
    assert by["buggy"].status == "error" and by["buggy"].error == "KeyError: 'driver'"
    assert by["h200-healthy"].status == "ok"
    assert by["h200-uvm-blocked"].status == "fail"
    assert by["h200-uvm-blocked"].root_cause.key == "devices.node.major[/dev/nvidia-uvm]"
    assert by["h200-uvmtools-000"].status == "warn"
    assert res.exit_code == 2  # the worst host decides: fail beats unknown
    doc = res.to_json()
    assert doc["summary"] == {"ok": 1, "warn": 1, "fail": 1, "unknown": 0, "unreachable": 1, "error": 1}
    rec = doc["hosts"][2]
    assert rec["root_cause"]["key"] == "devices.node.major[/dev/nvidia-uvm]"
    assert rec["check"]["schema"] == "gpudoctor.check/1"
    assert "check" not in doc["hosts"][1] and doc["hosts"][1]["status"] == "unreachable"


def test_unreachable_only_fleet_exits_unknown():
    def check(name):
        raise HostUnreachable("no route")

    res = check_fleet(None, ["a", "b"], parallel=4, check_fn=check)
    assert res.exit_code == 3 and {r.status for r in res.records} == {"unreachable"}


def test_a_hung_host_is_abandoned_at_its_deadline_and_the_rest_go_on():
    release = threading.Event()

    def check(name):
        if name == "hangs":
            release.wait(30)
        else:
            time.sleep(0.05)
        return replay_check("h200-healthy")

    names = ["hangs"] + [f"n{i}" for i in range(6)]
    t = time.monotonic()
    res = check_fleet(None, names, parallel=2, check_fn=check, host_timeout=0.5)
    took = time.monotonic() - t
    release.set()
    by = {r.host: r for r in res.records}
    assert by["hangs"].status == "unreachable" and by["hangs"].error == "did not answer in 0.5 s"
    assert all(by[f"n{i}"].status == "ok" for i in range(6))
    assert took < 10.0  # not 30 s: the hung host was abandoned at its deadline


def test_progress_callback_sees_every_host():
    seen = []
    check_fleet(None, ["h200-healthy", "h200-ctl-blocked"], parallel=2, check_fn=replay_check,
                on_done=lambda r: seen.append((r.host, r.status)))
    assert sorted(seen) == [("h200-ctl-blocked", "fail"), ("h200-healthy", "ok")]


def test_select_hosts():
    inv = SimpleNamespace(path="inventory.yaml", hosts={"ct200": {}, "ct201": {}, "ct202": {}},
                          groups={"h200": ["ct201", "ct200"], "spare": ["ct202"]})
    assert select_hosts(inv, all_hosts=True) == ["ct200", "ct201", "ct202"]
    assert select_hosts(inv, groups=["h200"], hosts=["ct200", "ct202"]) == ["ct201", "ct200", "ct202"]
    with pytest.raises(InputError, match="unknown group 'nope' \\(groups: h200, spare\\)"):
        select_hosts(inv, groups=["nope"])
    with pytest.raises(InputError, match="unknown host 'ct9'"):
        select_hosts(inv, hosts=["ct9"])
