"""What the daemon drives: an Engine checks a host, plans remedies for it and applies one.

The daemon owns timing, budgets and bookkeeping; the Engine owns diagnosis and change. The default engine wires
gpudoctor's check pipeline and remedy engine; tests may pass another with the hidden `--engine module:factory`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Protocol

from gpudoctor.errors import ConfigError


@dataclass
class Action:
    """One remedy the engine proposes: its id, the finding key it should clear, and whether it reboots something."""

    remedy: str
    finding: str
    summary: str = ""
    reboot: bool = False
    data: dict = field(default_factory=dict)  # engine-private (e.g. the planned Change)

    def to_json(self) -> dict:
        return {"remedy": self.remedy, "finding": self.finding, "summary": self.summary, "reboot": self.reboot}


@dataclass
class Outcome:
    """What applying one Action did. ok means applied and verified by the engine."""

    ok: bool
    message: str = ""


class Engine(Protocol):
    hosts: list[str]  # host names to watch, in order
    local_host: str | None  # the name that is this machine (XID events belong to it), or None
    policy: object  # the inventory's policy: a mapping or inventory.Policy (auto_apply, never_apply, budgets)

    def check(self, host: str):
        """A Diagnosis (findings, root_causes, verdict). Transport failure raises HostError."""

    def plan(self, host: str, diagnosis) -> list[Action]:
        """Remedies for the diagnosis' root causes, in the order they should be applied."""

    def apply(self, host: str, action: Action) -> Outcome:
        """Apply one planned remedy and verify it."""

    def verify(self, host: str):
        """The active verification (gpudoctor.recovery.verify.Verification) of the host, per policy verify:."""

    def close(self) -> None:
        ...


@dataclass
class EngineConfig:
    """What an engine factory gets: the daemon's command-line view of the world."""

    inventory: str | None = None
    hosts: tuple[str, ...] = ()
    timeout: float = 30.0
    state_dir: str | None = None  # where the remedy engine keeps its audit log, locks and backups
    models: tuple[str, ...] = ()  # model paths to check on every host (a campaign's model), besides the inventory's


def load_factory(spec: str):
    """'module:attr' -> the factory callable; bad specs raise ConfigError."""
    mod, sep, attr = spec.partition(":")
    if not sep:
        raise ConfigError(f"engine must be module:factory, got {spec!r}")
    try:
        return getattr(importlib.import_module(mod), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot load engine {spec!r}: {exc}") from exc


class PipelineEngine:
    """The real engine: gpudoctor.pipeline for checks, gpudoctor.remedy for plan/apply/verify.

    Without --host it watches this machine (named by its host name, as in `gpudoctor check`); with --host it
    reaches inventory hosts through the inventory's transports (one connection per host, reused across cycles).
    """

    def __init__(self, cfg: EngineConfig):
        import socket

        self.cfg = cfg
        self.inventory = None
        self.policy = {}
        if cfg.inventory:
            try:
                from gpudoctor.inventory import load_inventory
            except ImportError:
                raise ConfigError("this build cannot read inventories (gpudoctor.inventory is missing)",
                                  path=cfg.inventory) from None
            self.inventory = load_inventory(cfg.inventory)
            self.policy = getattr(self.inventory, "policy", None) or {}  # inventory.Policy (has as_dict)
        elif cfg.hosts:
            raise ConfigError("--host needs --inventory (the daemon watches this machine without one)")
        self.local_host = None if cfg.hosts else socket.gethostname()
        self.hosts = list(cfg.hosts) or [self.local_host]
        for h in cfg.hosts:
            if self.inventory is not None and h not in (getattr(self.inventory, "hosts", None) or {}):
                raise ConfigError(f"unknown host {h!r}: not in the inventory", path=cfg.inventory)
        self._targets = {}

    def _target(self, name: str):
        """The host's Target, opened once and kept: SSH connections are reused across cycles."""
        if name not in self._targets:
            from gpudoctor.target import live, open_target

            # only the inventory given with -i: a healing policy is never picked up implicitly; a live target only
            # (the daemon moves its ladder and heals it)
            self._targets[name] = live(open_target(None if name == self.local_host else name, self.inventory,
                                                   timeout=self.cfg.timeout, search=False), "watch a host")
            if self.cfg.models:
                ctx = self._targets[name].context
                ctx.model_paths = list(dict.fromkeys([*ctx.model_paths, *self.cfg.models]))
        return self._targets[name]

    def check(self, host: str):
        from gpudoctor.pipeline import check_host

        try:
            return check_host(self._target(host))
        except Exception:
            self._drop(host)  # a broken transport is rebuilt at the next cycle
            raise

    def _remedy_engine(self, host: str, reboot: bool = False):
        """gpudoctor.remedy.Engine over this host (and its Proxmox node), audit log and locks in the state dir."""
        from gpudoctor import remedies
        from gpudoctor.remedy import AuditLog, Engine, RemedyContext, default_paths

        from gpudoctor.target import live

        target = live(self._target(host), "heal")  # the door: heals and restages act on live targets only
        paths = default_paths(self.cfg.state_dir)
        rctx = RemedyContext(hosts={host: target.host, **target.hosts()}, backup_dir=paths["backup_dir"],
                             reboot=reboot, timeout=self.cfg.timeout)
        return Engine(remedies.all_remedies(), rctx, audit_log=AuditLog(paths["audit_log"]),
                      lock_dir=paths["lock_dir"])

    def plan(self, host: str, diagnosis) -> list[Action]:
        """The remedy engine's changes that address a bad finding of this diagnosis, in its order."""
        bad = {f.key for f in diagnosis.findings if f.bad}
        out = []
        plan = self._remedy_engine(host).plan(diagnosis.facts)
        for change in plan.changes:
            hit = [k for k in change.fixes if k in bad]
            if not hit:
                continue
            out.append(Action(remedy=change.remedy, finding=hit[0], summary=change.summary,
                              reboot=bool(change.needs_reboot), data={"change": change}))
        for r in plan.refusals:  # a remedy a bad finding declares would not act: the daemon says why, once a cycle
            hit = [f.key for f in diagnosis.findings if f.bad and f.remedy == r.remedy and f.remediable]
            if hit:
                out.append(Action(remedy=r.remedy, finding=hit[0], summary=r.reason, data={"refused": r.reason}))
        return out

    def apply(self, host: str, action: Action) -> Outcome:
        """Apply, verify (and roll back on failure) through the remedy engine; a reboot only when asked."""
        from gpudoctor.remedy import Plan

        engine = self._remedy_engine(host, reboot=action.reboot)
        res = engine.apply(Plan(changes=[action.data["change"]]))[0]
        ok = res.ok and (not action.reboot or (res.reboot is not None and res.reboot.done))
        msg = res.detail + (f"; {res.reboot.message}" if res.reboot is not None else "")
        return Outcome(ok=ok, message=msg)

    def verify(self, host: str):
        """The active verification on the host, through the same Target its checks use (policy verify:)."""
        from gpudoctor.recovery.verify import verify_policy_of
        from gpudoctor.recovery.verify import run_verification

        policy = verify_policy_of(self.policy or None, path=self.cfg.inventory)
        return run_verification(self._target(host), policy)

    def _drop(self, name: str) -> None:
        target = self._targets.pop(name, None)
        if target is not None:
            target.close()

    def close(self) -> None:
        for name in list(self._targets):
            self._drop(name)


def pipeline_engine(cfg: EngineConfig) -> PipelineEngine:
    return PipelineEngine(cfg)
