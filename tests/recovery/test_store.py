"""The ladder's store (one file, a lock, atomic writes, an unreadable file set aside) and advance(): the sequence
every surface uses. Real files, real flock between real processes."""

from __future__ import annotations

import json
import multiprocessing
import os
import time

import pytest

from gpudoctor.errors import ConfigError
from gpudoctor.recovery import advance as A
from gpudoctor.recovery import ladder as L
from gpudoctor.recovery.ladder import HostLadder, RecoveryPolicy
from gpudoctor.inventory_policy import from_policy, parse_recovery_policy
from gpudoctor.recovery.store import SCHEMA, RecoveryStore, state_dir

P = RecoveryPolicy()


class V:
    """What run_verification returns, as far as the ladder reads it."""

    def __init__(self, passed, reason=""):
        self.passed, self.reason = passed, reason

    def to_json(self):
        return {"passed": self.passed, "reason": self.reason}


def test_a_missing_file_is_no_record(tmp_path):
    store = RecoveryStore(tmp_path / "recovery.json")
    assert store.load() == {} and store.get("h") is None


def test_edit_writes_atomically_with_mode_0600(tmp_path):
    path = tmp_path / "sub" / "recovery.json"
    store = RecoveryStore(path)
    with store.edit() as hosts:
        hosts["h"] = HostLadder(state=L.READY, since=5.0, reason="")
    doc = json.loads(path.read_text())
    assert doc["schema"] == SCHEMA and doc["hosts"]["h"]["state"] == "ready"
    assert (path.stat().st_mode & 0o777) == 0o600
    assert [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")] == []
    assert store.get("h").since == 5.0


def test_an_exception_inside_edit_writes_nothing(tmp_path):
    store = RecoveryStore(tmp_path / "recovery.json")
    with store.edit() as hosts:
        hosts["h"] = HostLadder(state=L.READY, since=1.0)
    with pytest.raises(RuntimeError):
        with store.edit() as hosts:
            hosts["h"].state = L.FAILING
            raise RuntimeError("boom")
    assert store.get("h").state == L.READY


@pytest.mark.parametrize("text", ["{not json", json.dumps({"schema": "other/1", "hosts": {}}), "[]",
                                  json.dumps({"schema": SCHEMA, "hosts": {"h": {"state": "sleeping"}}}),
                                  json.dumps({"schema": SCHEMA, "hosts": {"h": ["ready"]}})])
def test_an_unreadable_file_is_set_aside_and_nobody_is_ready(tmp_path, text):
    path = tmp_path / "recovery.json"
    path.write_text(text)
    store = RecoveryStore(path)
    hosts = store.load()
    assert hosts == {}
    assert store.aside and os.path.basename(store.aside).startswith("recovery.json.corrupt-")
    assert open(store.aside).read() == text and not path.exists()
    assert L.view(hosts.get("h"), "b1")[2] is False


def test_state_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("STATE_DIRECTORY", f"{tmp_path}/a:{tmp_path}/b")
    assert state_dir() == tmp_path / "a"
    monkeypatch.delenv("STATE_DIRECTORY")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "x"))
    expect = "/var/lib/gpudoctor" if os.geteuid() == 0 else str(tmp_path / "x" / "gpudoctor")
    assert str(state_dir()) == expect


def _hold_verify_lock(path, ready, release):
    store = RecoveryStore(path)
    with store.verify_lock() as got:
        assert got
        ready.set()
        release.wait(10)


def test_the_verification_lock_is_held_across_processes(tmp_path):
    path = tmp_path / "recovery.json"
    ctx = multiprocessing.get_context("fork")
    ready, release = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_hold_verify_lock, args=(path, ready, release))
    proc.start()
    try:
        assert ready.wait(10)
        store = RecoveryStore(path)
        with store.edit() as hosts:
            hosts["h"] = HostLadder(since=0.0)
        calls = []
        adv = A.advance(store, "h", P, 10.0, passed=True, boot_id="b", verify=lambda: calls.append(1) or V(True))
        assert adv.busy and calls == [] and adv.ladder.state == L.VERIFYING  # nobody verifies twice at once
    finally:
        release.set()
        proc.join(10)
    adv = A.verify_if_due(store, "h", P, lambda: V(True), clock=lambda: 11.0)
    assert adv.ladder.state == L.READY and not adv.busy


def _edit_many(path, n):
    store = RecoveryStore(path)
    for _ in range(n):
        with store.edit() as hosts:
            h = hosts.setdefault("h", HostLadder(since=0.0))
            h.clean_cycles += 1


def test_edits_from_two_processes_never_lose_an_update(tmp_path):
    path = tmp_path / "recovery.json"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_edit_many, args=(path, 50)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    assert RecoveryStore(path).get("h").clean_cycles == 100


# --- advance() ---------------------------------------------------------------------------------------------------
def test_advance_runs_the_verification_when_due_and_records_it(tmp_path):
    store = RecoveryStore(tmp_path / "r.json")
    adv = A.advance(store, "h", P, 100.0, passed=True, boot_id="b1", driver="570", verify=lambda: V(False, "x"),
                    clock=lambda: 105.0)
    assert [s.after for s in adv.steps] == [L.VERIFYING, L.VERIFYING]
    assert adv.verification.reason == "x" and not adv.ready
    rec = store.get("h")
    assert rec.next_verify_at == 405.0 and rec.last_verification == {"passed": False, "reason": "x"}
    adv = A.advance(store, "h", P, 200.0, passed=True, boot_id="b1", verify=lambda: V(True), clock=lambda: 200.0)
    assert adv.verification is None and not adv.ready  # backoff: not due
    adv = A.advance(store, "h", P, 405.0, passed=True, boot_id="b1", verify=lambda: V(True), clock=lambda: 406.0)
    assert adv.ready and store.get("h").verified_at == 406.0


def test_advance_without_a_verifier_never_makes_a_host_ready(tmp_path):
    store = RecoveryStore(tmp_path / "r.json")
    adv = A.advance(store, "h", P, 1.0, passed=True, boot_id="b")
    assert adv.ladder.state == L.VERIFYING and adv.verification is None


def test_a_verifier_that_crashes_is_a_failed_verification(tmp_path):
    store = RecoveryStore(tmp_path / "r.json")

    def boom():
        raise OSError("no such device")

    adv = A.advance(store, "h", P, 1.0, passed=True, boot_id="b", verify=boom, clock=lambda: 2.0)
    assert not adv.ready and not adv.verification.passed
    assert "the verification crashed: OSError: no such device" in store.get("h").reason


def test_advance_on_a_failure_does_not_verify(tmp_path):
    store = RecoveryStore(tmp_path / "r.json")
    calls = []
    adv = A.advance(store, "h", P, 1.0, passed=False, roots=["a"], summary="A", verify=lambda: calls.append(1))
    assert calls == [] and adv.ladder.state == L.FAILING and adv.ladder.since == 1.0


def test_record_heal_and_release(tmp_path):
    store = RecoveryStore(tmp_path / "r.json")
    A.advance(store, "h", P, 1.0, passed=False, roots=["a"], summary="A", boot_id="b")
    assert A.record_heal(store, "h", 2.0, "fix").after == L.HEALING
    adv = A.release(store, "h", lambda: V(False, "diag failed"), boot_id="b", driver=None, clock=lambda: 3.0)
    assert not adv.ready and store.get("h").state == L.HEALING
    A.advance(store, "h", P, 4.0, passed=True, boot_id="b")
    adv = A.release(store, "h", lambda: V(True), boot_id="b", driver=None, clock=lambda: 5.0)
    assert adv.ready and store.get("h").verified_at == 5.0


def test_identity_from_facts():
    facts = {"host": {"boot_id": "b1", "driver_version_file": {"version": "570.1"}}, "driver": {}}
    assert A.identity(facts) == ("b1", "570.1")
    facts["driver"] = {"driver_version": "570.2"}
    assert A.identity(facts) == ("b1", "570.2")
    assert A.identity(None) == (None, None)
    assert A.identity({"host": "x", "driver": []}) == (None, None)


# --- the policy section -------------------------------------------------------------------------------------------
def test_parse_recovery_policy():
    assert parse_recovery_policy(None) == RecoveryPolicy()
    pol = parse_recovery_policy({"clean_cycles": 3, "clean_seconds": 60, "retry_s": 5, "recurrences": 1,
                                 "window_s": 3600, "retry_factor": 1, "retry_max_s": 10})
    assert pol == RecoveryPolicy(3, 60.0, 5.0, 1.0, 10.0, 1, 3600.0)
    assert from_policy({"recovery": {"clean_cycles": 2}}).clean_cycles == 2
    assert from_policy(None) == RecoveryPolicy() and from_policy({}) == RecoveryPolicy()


@pytest.mark.parametrize("spec, msg", [
    ([1], "policy.recovery must be a mapping"),
    ({"clean": 1}, "unknown key 'clean'"),
    ({"clean_cycles": 1.5}, "policy.recovery.clean_cycles must be an integer >= 0, got 1.5"),
    ({"clean_seconds": -1}, "policy.recovery.clean_seconds must be a number >= 0, got -1"),
    ({"retry_s": True}, "policy.recovery.retry_s must be a number >= 0"),
    ({"retry_s": "5"}, "policy.recovery.retry_s must be a number >= 0"),
    ({"retry_factor": 0.5}, "retry_factor must be >= 1"),
    ({"recurrences": 0}, "recurrences must be >= 1"),
])
def test_bad_recovery_policy(spec, msg):
    with pytest.raises(ConfigError, match=msg.replace("(", r"\(").replace(".", r"\.")):
        parse_recovery_policy(spec, path="inv.yaml")


def test_a_reading_gate_waits_only_while_the_daemon_has_something_to_do(tmp_path):
    from gpudoctor.recovery.gates import _read, pending

    assert pending(None, "b1")
    h = HostLadder(state=L.VERIFYING, boot_id="b0")
    assert pending(h, "b1")  # the daemon has not seen this boot yet
    h.boot_id = "b1"
    assert pending(h, "b1")  # a verification is due or running
    h.next_verify_at = 5.0
    assert not pending(h, "b1")  # a failed verification waits for its retry: settled
    h.next_verify_at, h.failing_now = None, True
    assert not pending(h, "b1")
    assert not pending(HostLadder(state=L.INSPECT, boot_id="b1"), "b1")
    store = RecoveryStore(tmp_path / "r.json")
    slept, now = [], [0.0]

    def sleep(s):
        slept.append(s)
        now[0] += s
        if now[0] >= 2:  # the daemon verifies meanwhile
            with store.edit() as hosts:
                hosts["h"] = HostLadder(state=L.READY, since=1.0, reason="", verified_at=1.0, verified_boot="b1",
                                        boot_id="b1")

    lad, state, reason, ready = _read(store, "h", "b1", 10, sleep=sleep, clock=lambda: now[0])
    assert ready and slept == [1.0, 1.0]
    lad, state, reason, ready = _read(store, "x", "b1", 2.5, sleep=sleep, clock=lambda: now[0])
    assert not ready and state == L.FAILING and sum(slept) == 4.5  # gave up after 2.5 s


def test_reading_a_missing_store_creates_nothing(tmp_path):
    store = RecoveryStore(tmp_path / "no" / "recovery.json")
    assert store.load() == {} and not (tmp_path / "no").exists()
