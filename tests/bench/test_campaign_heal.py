"""A campaign that loses its target mid-run heals and resumes by itself (the seed's arc, without LXC).

Real: the campaign runner, the stand-in server processes (one dies mid-level with CUDA's 999 in its log while the
"GPU is gone"), the daemon's healing loop with its budgets, breaker and state file, the gate's judgement, the result
store, report.md. Stands in: the host being judged — HostModel below answers the daemon's Engine protocol (check,
plan, apply) from one file on disk: while it exists the GPU is gone (cuda.init fails, and the stand-in server is armed
to die), the remedy removes it; for a few checks after the crash the host does not answer (a reboot). The arc on
real LXC, with the real pipeline and remedies, is tests/e2e/test_seed_arc.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from gpudoctor.campaign.runner import CampaignStopped, run_campaign
from gpudoctor.daemon.engine import Action, Outcome
from gpudoctor.diagnose import diagnose
from gpudoctor.errors import HostUnreachable
from tests.bench.campaigns import write

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "serverlogs"


class HostModel:
    """The target as the healer sees it: GPU gone while `fault` exists; unreachable for `down` checks after that."""

    def __init__(self, fault: Path, down: int = 2):
        self.fault, self.down = fault, down
        self.hosts, self.local_host, self.policy = ["gpu1"], None, {}
        self.checks = 0
        self.applied: list[str] = []

    def check(self, host):
        self.checks += 1
        if self.fault.exists() and self.down > 0:
            self.down -= 1
            raise HostUnreachable(f"{host}: connection refused (rebooting)")
        facts = {"host": {}, "driver": {}, "devices": {}, "cuda": {}}
        diag = diagnose(facts)  # a real Diagnosis; the findings below are what such a host shows
        from gpudoctor.findings import Finding, Status

        status = Status.FAIL if self.fault.exists() else Status.OK
        diag.findings = [Finding(id="cuda.init", layer="cuda", status=status,
                                 summary="cuInit → 999 CUDA_ERROR_UNKNOWN" if self.fault.exists() else "cuInit ok",
                                 hint="gpudoctor fix --only devices.node.create --apply", remedy="devices.node.create")]
        diag.root_causes = [f for f in diag.findings if f.status == Status.FAIL]
        return diag

    def plan(self, host, diagnosis):
        return [Action(remedy="devices.node.create", finding="cuda.init", summary="recreate /dev/nvidia-uvm")
                for f in diagnosis.findings if f.bad]

    def apply(self, host, action):
        self.applied.append(action.remedy)
        self.fault.unlink(missing_ok=True)
        return Outcome(ok=True, message="node recreated")

    def close(self):
        pass


def campaign(tmp_path, fault: Path, heal: str) -> Path:
    sig = LOGS / "cuda-unknown-error.log"
    body = ("methods:\n  baseline: {baseline: true}\n"
            f"  eagle: {{args: [--fail-mode, die-mid-level, --fail-after-requests, '7', --fail-if-exists, '{fault}',"
            f" --death-log, '{sig}']}}\n")
    path, _ = write(tmp_path, body, concurrency="[1, 2, 4]", extra=heal)
    return path


def records(out):
    return [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]


def test_a_broken_target_mid_campaign_is_healed_and_the_campaign_completes_with_every_record_once(tmp_path):
    fault = tmp_path / "gpu-gone"
    fault.write_text("")
    path = campaign(tmp_path, fault, "heal: {allow: [devices.node.create], wait_s: 30, profile: default}\n")
    out = tmp_path / "out"
    notes: list[str] = []
    model = HostModel(fault)
    counts = run_campaign(str(path), str(out), heal_engine_factory=lambda cfg: model,
                          on_event=lambda kind, **kw: notes.append(kw.get("text", "")) if kind == "note" else None)
    recs = records(out)
    keys = [(r["label"], r["workload"], r["concurrency"], r["trial"]) for r in recs]
    assert len(keys) == len(set(keys)) == 6, keys  # 2 methods x 3 levels, each exactly once
    assert all(r["status"] == "ok" for r in recs), [(r["label"], r["concurrency"], r["status"]) for r in recs]
    assert counts["ok"] == 6 and model.applied == ["devices.node.create"]
    retracted = [json.loads(x) for x in (out / "retracted.jsonl").read_text().splitlines()]
    assert [r["status"] for r in retracted] == ["crashed"] and retracted[0]["cause"] == "cuda-unknown-error"
    assert retracted[0]["retracted"].startswith("heal 1: the server crashed during")
    healed = [r for r in recs if r.get("heal")]
    eagle = sorted((r["concurrency"], bool(r.get("heal"))) for r in recs if r["label"] == "eagle-tp1")
    # c=1 ran before the heal (warm-up 2 + 4 requests); the 7th request kills the server in c=2; c=2 and c=4 after it
    assert eagle == [(1, False), (2, True), (4, True)], eagle
    assert all(r["heal"]["n"] == 1 and r["heal"]["actions"] == ["devices.node.create"] for r in healed)
    assert any("waiting for gpu1 to answer:" in n and "s left" in n for n in notes), notes
    (heal,) = [json.loads(x) for x in (out / "heals.jsonl").read_text().splitlines()]
    assert heal["healthy"] and heal["broken"] and heal["root_cause"].startswith("cuda.init: cuInit → 999")
    assert [k[:4] for k in heal["retracted"]] == [["eagle-tp1", "chat:short:out24", 2, 0]]
    from gpudoctor.bench.records.report import write_report

    write_report(str(out), plots=False)
    md = (out / "report.md").read_text()
    assert "## Heals" in md and "devices.node.create (ok)" in md and "| healed | 2 |" in md


def test_healing_disallowed_stops_with_one_line_naming_the_cause_and_the_command(tmp_path):
    fault = tmp_path / "gpu-gone"
    fault.write_text("")
    path = campaign(tmp_path, fault, "heal: {allow: [], wait_s: 30, profile: default}\n")
    out = tmp_path / "out"
    model = HostModel(fault, down=0)
    with pytest.raises(CampaignStopped) as e:
        run_campaign(str(path), str(out), heal_engine_factory=lambda cfg: model)
    line = e.value.one_line()
    assert "\n" not in line and model.applied == []
    assert "the server crashed during workload chat:short:out24 at concurrency 2 (eagle-tp1)" in line
    assert "cuda.init: cuInit → 999 CUDA_ERROR_UNKNOWN" in line
    assert "run: gpudoctor fix --only devices.node.create --apply" in line
    assert f"gpudoctor bench run {path} --out {out} --resume" in line
    recs = records(out)  # what ran is kept, the crash too: nothing is retracted without a heal
    assert [(r["label"], r["concurrency"], r["status"]) for r in recs if r["label"] == "eagle-tp1"] == [
        ("eagle-tp1", 1, "ok"), ("eagle-tp1", 2, "crashed")]


def test_a_target_the_ladder_holds_for_inspection_is_not_healed_by_a_campaign(tmp_path, monkeypatch):
    """Recovery ladder (docs/recovery.md): no unattended heal in needs-inspection — a campaign's healer neither."""
    from gpudoctor.recovery.ladder import INSPECT, HostLadder
    from gpudoctor.recovery.store import RecoveryStore, default_path

    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "state"))
    with RecoveryStore(default_path()).edit() as hosts:
        hosts["gpu1"] = HostLadder(state=INSPECT, since=100.0, reason="needs inspection: came back 2 times")
    fault = tmp_path / "gpu-gone"
    fault.write_text("")
    path = campaign(tmp_path, fault, "heal: {allow: [devices.node.create], wait_s: 30, profile: default}\n")
    out = tmp_path / "out"
    model = HostModel(fault, down=0)
    with pytest.raises(CampaignStopped) as e:
        run_campaign(str(path), str(out), heal_engine_factory=lambda cfg: model)
    line = e.value.one_line()
    assert model.applied == [] and fault.exists()  # nothing was healed
    assert "\n" not in line and "gpudoctor release gpu1" in line, line
    with RecoveryStore(default_path()).edit() as hosts:  # a released host heals as before
        hosts["gpu1"] = HostLadder(state="ready", since=200.0, reason="")
    model = HostModel(fault, down=0)
    run_campaign(str(path), str(tmp_path / "out2"), heal_engine_factory=lambda cfg: model)
    assert model.applied == ["devices.node.create"]


def test_a_crash_on_a_healthy_target_is_the_methods_own_and_stays_a_result(tmp_path):
    fault = tmp_path / "armed"  # the server is armed to die, but the host model shows nothing wrong
    fault.write_text("")
    path = campaign(tmp_path, fault, "heal: {allow: [devices.node.create], wait_s: 30, profile: default}\n")
    out = tmp_path / "out"

    class Healthy(HostModel):
        def check(self, host):
            diag = super().check(host)
            for f in diag.findings:
                from gpudoctor.findings import Status
                f.status, f.summary = Status.OK, "cuInit ok"
            diag.root_causes = []
            return diag

    model = Healthy(fault, down=0)
    run_campaign(str(path), str(out), heal_engine_factory=lambda cfg: model)
    eagle = [(r["concurrency"], r["status"]) for r in records(out) if r["label"] == "eagle-tp1"]
    assert eagle == [(1, "ok"), (2, "crashed"), (4, "skipped")] and model.applied == []
    assert not (out / "retracted.jsonl").exists()


def test_heal_section_is_validated(tmp_path):
    from tests.bench.conftest import run_cli

    fault = tmp_path / "f"
    path = campaign(tmp_path, fault, "heal: {allow: lxc.cgroup_allow, rounds: 0}\n")
    p = run_cli("bench", "run", str(path), "--out", str(tmp_path / "o"))
    assert p.returncode == 3 and "heal.rounds must be an integer >= 1" in p.stderr, p.stderr
    assert sys.executable  # the CLI ran in a real subprocess
