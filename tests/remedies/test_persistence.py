"""driver.persistence with stand-in systemctl and nvidia-smi that model the real tools (unit state, persistence mode,
--no-persistence-mode, permission errors). Contract: plan → apply → plan is None; a failed verify rolls back."""

import json

from gpudoctor.remedies.persistence import Persistence
from gpudoctor.remedy import AuditLog, Engine, RemedyContext

from .hostroot import NAME

UNIT_TEXT = """[Unit]
Description=NVIDIA Persistence Daemon
Wants=syslog.target

[Service]
Type=forking
ExecStart=/usr/bin/nvidia-persistenced --user nvidia-persistenced --verbose
ExecStopPost=/bin/rm -rf /var/run/nvidia-persistenced

[Install]
WantedBy=multi-user.target
"""


def setup(make_root, unit=UNIT_TEXT, systemd=True, pm="Disabled", **kw):
    r = make_root(uvm_major=238, **kw).healthy_nodes(238)
    if unit is not None:
        r.write("/lib/systemd/system/nvidia-persistenced.service", unit)
    if systemd:
        (r.path("/run/systemd/system")).mkdir(parents=True)
    r.write("/standin-state/pm", pm + "\n")
    return r


def engine(r, allow=(), wait=1.0):
    ctx = RemedyContext(hosts={NAME: r.host()}, timeout=5,
                        options={"allow": list(allow), "persistence_wait_s": wait})
    return Engine([Persistence()], ctx, audit_log=AuditLog(str(r.root.parent / "audit.jsonl")),
                  lock_dir=str(r.root.parent / "locks"))


def facts(r):
    return r.facts(only=("host", "devices", "tools", "driver"))


def unit_state(r):
    return json.loads(r.read("/standin-state/systemd.json"))["nvidia-persistenced.service"]


def test_enable_and_start_nvidia_persistenced(make_root):
    r = setup(make_root)
    f = facts(r)
    assert f["tools"]["units"]["nvidia-persistenced.service"]["enabled"] == "disabled"
    eng = engine(r)
    plan = eng.plan(f)
    (change,) = plan.changes
    assert change.commands == ["systemctl enable --now nvidia-persistenced.service"] and change.risk == "medium"
    assert "-00000000:00:06.0  persistence_mode = Disabled, expected Enabled" in change.diff
    assert "+nvidia-persistenced.service  enabled, active" in change.diff
    assert not [c for c in r.calls("systemctl") if c[1] not in ("is-enabled", "is-active")]  # plan ran no change
    (out,) = eng.apply(plan)
    assert out.result == "applied", out.detail
    assert unit_state(r) == {"enabled": "enabled", "active": "active"}
    assert ["systemctl", "enable", "--now", "nvidia-persistenced.service"] in r.calls("systemctl")
    assert eng.plan(facts(r)).changes == []
    assert eng.apply(plan)[0].result == "unchanged"
    assert r.calls("systemctl").count(["systemctl", "enable", "--now", "nvidia-persistenced.service"]) == 1
    assert not r.calls("nvidia-smi") or all("-pm" not in c for c in r.calls("nvidia-smi"))


def test_failed_verify_disables_and_stops_the_daemon_again(make_root):
    r = setup(make_root)
    r.fault("pm-stuck-off")  # the daemon starts but the GPU never reports persistence on
    eng = engine(r, wait=0.5)
    (out,) = eng.apply(eng.plan(facts(r)))
    assert out.result == "rolled_back" and "still off" in out.verify.summary
    assert unit_state(r) == {"enabled": "disabled", "active": "inactive"}
    assert out.applied["rollback"]["restored"] == ["systemctl disable nvidia-persistenced.service",
                                                   "systemctl stop nvidia-persistenced.service"]


def test_no_persistence_mode_in_the_unit_is_refused_with_the_reason(make_root):
    r = setup(make_root, unit=UNIT_TEXT.replace("--verbose", "--no-persistence-mode --verbose"))
    plan = engine(r).plan(facts(r))
    (ref,) = plan.refusals
    assert "--no-persistence-mode" in ref.reason and "--allow nvidia-smi-pm" in ref.reason


def test_without_a_unit_it_refuses_unless_nvidia_smi_pm_is_allowed(make_root):
    r = setup(make_root, unit=None)
    (ref,) = engine(r).plan(facts(r)).refusals
    assert "no nvidia-persistenced.service unit file" in ref.reason and "--allow nvidia-smi-pm" in ref.reason
    eng = engine(r, allow=["nvidia-smi-pm"])
    plan = eng.plan(facts(r))
    (change,) = plan.changes
    assert change.commands[0].endswith("nvidia-smi -i 00000000:00:06.0 -pm 1") and "resets at reboot" in change.summary
    (out,) = eng.apply(plan)
    assert out.result == "applied", out.detail
    assert r.read("/standin-state/pm").strip() == "Enabled"
    assert eng.plan(facts(r)).changes == []
    assert eng.apply(plan)[0].result == "unchanged"
    assert len([c for c in r.calls("nvidia-smi") if "-pm" in c]) == 1


def test_nvidia_smi_pm_refused_by_the_driver_is_a_failure_with_its_message(make_root):
    r = setup(make_root, unit=None)
    r.fault("pm-denied")
    eng = engine(r, allow=["nvidia-smi-pm"])
    (out,) = eng.apply(eng.plan(facts(r)))
    assert out.result == "failed" and "Insufficient Permissions" in out.detail and "rc 4" in out.detail


def test_nvidia_smi_route_rolls_back_with_pm_0(make_root):
    r = setup(make_root, unit=None)
    eng = engine(r, allow=["nvidia-smi-pm"], wait=0.3)
    plan = eng.plan(facts(r))
    r.fault("pm-stuck-off")
    (out,) = eng.apply(plan)
    assert out.result == "rolled_back"
    assert [c[1:] for c in r.calls("nvidia-smi") if "-pm" in c] == [["-i", "00000000:00:06.0", "-pm", "1"],
                                                                    ["-i", "00000000:00:06.0", "-pm", "0"]]
    assert r.read("/standin-state/pm").strip() == "Disabled"


def test_in_a_container_the_daemon_belongs_on_the_host(make_root):
    r = setup(make_root, container="lxc", userns=True)
    (ref,) = engine(r).plan(facts(r)).refusals
    assert "LXC container" in ref.reason and "belongs on the host" in ref.reason


def test_persistence_already_on_plans_nothing(make_root):
    r = setup(make_root, pm="Enabled")
    plan = engine(r).plan(facts(r))
    assert plan.changes == [] and plan.refusals == [] and plan.nothing == ["driver.persistence"]
