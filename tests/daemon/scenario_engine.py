"""A daemon Engine driven by a JSON scenario file, loaded by the real daemon process through --engine.

The scenario is re-read on every check, so a test changes the host's faults by rewriting it; hosts and policy are
read when the engine is built (start and SIGHUP), as the real engine reads its inventory. Every apply() is appended
to the scenario's `log` file with the fake clock's time, so tests can count reboots and measure backoff gaps.

    {"hosts": ["ct200"], "local_host": null, "policy": {"daemon": {...}},
     "findings": {"ct200": [{"id": "cuda.init", "status": "fail", "summary": "...", "remedy": "lxc.reboot"}]},
     "unreachable": [], "remedies": {"lxc.reboot": {"reboot": true, "result": "ok"}},
     "facts": {"ct200": {"host": {"boot_id": "b1"}}},   optional: the diagnosis' facts (boot id, driver version)
     "log": "/tmp/.../applied.jsonl", "clock": "/tmp/.../clock",
     "child": ["/path/to/python", "child.py"]}   optional: run on every check through gpudoctor's LocalHost, as a
                                                 check runs its probes (a daemon child)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from gpudoctor.daemon.engine import Action, Outcome
from gpudoctor.errors import ConfigError, HostUnreachable
from gpudoctor.findings import Finding, worst


@dataclass
class Diagnosis:
    findings: list = field(default_factory=list)
    facts: dict = field(default_factory=dict)  # e.g. {"host": {"boot_id": ...}, "driver": {"driver_version": ...}}

    @property
    def root_causes(self):
        return [f for f in self.findings if f.status.value == "fail" and not f.blocked_by]

    @property
    def verdict(self):
        return worst(f.status for f in self.findings)


class ScenarioEngine:
    def __init__(self, cfg):
        self.path = Path(cfg.inventory)
        try:
            sc = json.loads(self.path.read_text())
        except ValueError as exc:
            raise ConfigError(f"not JSON: {exc}", path=str(self.path)) from exc
        self.hosts = list(cfg.hosts) or list(sc["hosts"])
        self.local_host = sc.get("local_host")
        self.policy = sc.get("policy") or {}

    def _sc(self) -> dict:
        return json.loads(self.path.read_text())

    def check(self, host):
        sc = self._sc()
        if host in sc.get("unreachable", []):
            raise HostUnreachable(f"{host}: connection refused (scenario)")
        if sc.get("child"):
            from gpudoctor.host.local import LocalHost

            LocalHost().run(sc["child"], timeout=10)
        return Diagnosis([Finding(**f) for f in sc.get("findings", {}).get(host, [])],
                         dict(sc.get("facts", {}).get(host, {})))

    def plan(self, host, diagnosis):
        sc = self._sc()
        out = []
        for f in diagnosis.root_causes:
            if f.remedy:
                spec = sc.get("remedies", {}).get(f.remedy, {})
                out.append(Action(remedy=f.remedy, finding=f.key, summary=f"fix {f.key}",
                                  reboot=bool(spec.get("reboot"))))
        return out

    def apply(self, host, action):
        sc = self._sc()
        spec = sc.get("remedies", {}).get(action.remedy, {})
        now = float(Path(sc["clock"]).read_text()) if sc.get("clock") else None
        with open(sc["log"], "a") as fh:
            fh.write(json.dumps({"host": host, "remedy": action.remedy, "finding": action.finding, "at": now}) + "\n")
        if spec.get("result") == "raise":
            raise RuntimeError("remedy crashed (scenario)")
        return Outcome(ok=spec.get("result", "ok") == "ok", message=spec.get("message", ""))

    def verify(self, host):
        """The real verification (policy verify: from the scenario, re-read now) on this machine: its site commands
        run through gpudoctor's LocalHost, so a test makes it pass or fail with a flag file."""
        from gpudoctor.recovery.verify import verify_policy_of
        from gpudoctor.recovery.verify import run_verification
        from gpudoctor.target import open_target

        policy = verify_policy_of(self._sc().get("policy") or None, path=str(self.path))
        target = open_target(None, None, search=False)
        try:
            return run_verification(target, policy)
        finally:
            target.close()

    def close(self):
        pass


def factory(cfg):
    return ScenarioEngine(cfg)
