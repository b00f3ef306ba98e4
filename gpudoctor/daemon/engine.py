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
    policy: dict  # the inventory's `policy` mapping

    def check(self, host: str):
        """A Diagnosis (findings, root_causes, verdict). Transport failure raises HostError."""

    def plan(self, host: str, diagnosis) -> list[Action]:
        """Remedies for the diagnosis' root causes, in the order they should be applied."""

    def apply(self, host: str, action: Action) -> Outcome:
        """Apply one planned remedy and verify it."""

    def close(self) -> None:
        ...


@dataclass
class EngineConfig:
    """What an engine factory gets: the daemon's command-line view of the world."""

    inventory: str | None = None
    hosts: tuple[str, ...] = ()
    timeout: float = 30.0


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
    """The real engine: gpudoctor.pipeline for checks, gpudoctor.remedy for plan/apply/verify."""

    def __init__(self, cfg: EngineConfig):
        self.cfg = cfg
        self.inventory = None
        self.policy = {}
        if cfg.inventory:
            from gpudoctor.inventory import load_inventory

            self.inventory = load_inventory(cfg.inventory)
            self.policy = dict(getattr(self.inventory, "policy", None) or {})
        self.hosts = list(cfg.hosts) or ["localhost"]
        self.local_host = "localhost" if "localhost" in self.hosts else None
        self._hosts = {}

    def _host(self, name: str):
        if name not in self._hosts:
            if name == "localhost" and (self.inventory is None or name not in self.inventory.hosts):
                from gpudoctor.host.local import LocalHost

                self._hosts[name] = LocalHost()
            else:
                from gpudoctor.host.factory import host_for

                self._hosts[name] = host_for(self.inventory, name)
        return self._hosts[name]

    def _ctx(self, name: str):
        from gpudoctor.gather.context import GatherContext

        return GatherContext(name=name, timeout=self.cfg.timeout)

    def check(self, host: str):
        from gpudoctor.pipeline import check_host

        return check_host(self._host(host), self._ctx(host))

    def plan(self, host: str, diagnosis) -> list[Action]:
        from gpudoctor import remedy

        out = []
        for change in remedy.plan_all(diagnosis, policy=self.policy):
            out.append(Action(remedy=change.remedy, finding=change.finding, summary=change.summary,
                              reboot=bool(getattr(change, "reboot", False)), data={"change": change}))
        return out

    def apply(self, host: str, action: Action) -> Outcome:
        from gpudoctor import remedy

        res = remedy.apply_change(self._host(host), action.data["change"])
        return Outcome(ok=bool(res.ok), message=getattr(res, "message", ""))

    def close(self) -> None:
        for h in self._hosts.values():
            try:
                h.close()
            except Exception:
                pass
        self._hosts.clear()


def pipeline_engine(cfg: EngineConfig) -> PipelineEngine:
    return PipelineEngine(cfg)
