"""The daemon's state file: budgets, breakers and last verdicts that must survive a restart.

Small JSON, rewritten atomically (gpudoctor.files.atomic) after every cycle and before every remedy, so a crash or a
reboot in the middle of healing never forgets an attempt. An unreadable file is moved aside, never trusted.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from gpudoctor.files.atomic import atomic_write
from gpudoctor.host import ops as fs  # the mutation seam (tests/crash)
from gpudoctor.daemon.budget import Breaker, RemedyLedger
from gpudoctor.log import get_logger

SCHEMA = "gpudoctor.daemon-state/1"


@dataclass
class HostState:
    """Per host: last run, verdict, finding statuses, breaker, one ledger per remedy, remedies awaiting proof."""

    last_run: float | None = None
    verdict: str | None = None
    root_cause: str | None = None
    findings: dict = field(default_factory=dict)  # finding key -> status
    breaker: Breaker = field(default_factory=Breaker)
    remedies: dict = field(default_factory=dict)  # remedy id -> RemedyLedger
    pending_verify: dict = field(default_factory=dict)  # remedy id -> finding key it claimed to fix

    def ledger(self, remedy_id: str) -> RemedyLedger:
        return self.remedies.setdefault(remedy_id, RemedyLedger())

    def to_json(self) -> dict:
        return {"last_run": self.last_run, "verdict": self.verdict, "root_cause": self.root_cause,
                "findings": self.findings, "breaker": self.breaker.to_json(),
                "remedies": {k: v.to_json() for k, v in sorted(self.remedies.items())},
                "pending_verify": self.pending_verify}

    @classmethod
    def from_json(cls, d: dict) -> "HostState":
        return cls(last_run=d.get("last_run"), verdict=d.get("verdict"), root_cause=d.get("root_cause"),
                   findings=dict(d.get("findings") or {}), breaker=Breaker.from_json(d.get("breaker") or {}),
                   remedies={k: RemedyLedger.from_json(v) for k, v in (d.get("remedies") or {}).items()},
                   pending_verify=dict(d.get("pending_verify") or {}))


@dataclass
class DaemonState:
    """Everything the daemon remembers."""

    hosts: dict = field(default_factory=dict)  # name -> HostState
    cycles: int = 0
    pid: int | None = None
    started_at: float | None = None
    metrics_addr: str | None = None
    xid: list = field(default_factory=list)  # critical XID events of the current boot
    boot_id: str | None = None

    def host(self, name: str) -> HostState:
        return self.hosts.setdefault(name, HostState())

    def to_json(self) -> dict:
        return {"schema": SCHEMA, "pid": self.pid, "started_at": self.started_at, "metrics_addr": self.metrics_addr,
                "cycles": self.cycles, "boot_id": self.boot_id, "xid": self.xid,
                "hosts": {k: v.to_json() for k, v in sorted(self.hosts.items())}}

    @classmethod
    def from_json(cls, d: dict) -> "DaemonState":
        if d.get("schema") != SCHEMA:
            raise ValueError(f"schema {d.get('schema')!r}, expected {SCHEMA!r}")
        return cls(hosts={k: HostState.from_json(v) for k, v in (d.get("hosts") or {}).items()},
                   cycles=int(d.get("cycles", 0)), pid=d.get("pid"), started_at=d.get("started_at"),
                   metrics_addr=d.get("metrics_addr"), xid=list(d.get("xid") or []), boot_id=d.get("boot_id"))


class StateStore:
    """Loads and saves the state file."""

    def __init__(self, path: str | os.PathLike | None):
        self.path = Path(path) if path else None
        self.log = get_logger("gpudoctor.daemon", state=str(self.path))

    def load(self) -> DaemonState:
        if self.path is None or not self.path.exists():
            return DaemonState()
        try:
            return DaemonState.from_json(json.loads(self.path.read_text()))
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
            try:
                fs.fs_rename(self.path, aside)
            except OSError:
                aside = None
            self.log.error("daemon.state_unreadable", error=str(exc), moved_to=str(aside) if aside else None)
            return DaemonState()

    def save(self, state: DaemonState) -> None:
        if self.path is None:
            return
        fs.fs_makedirs(str(self.path.parent))
        atomic_write(self.path, json.dumps(state.to_json(), indent=1, sort_keys=True) + "\n", mode=0o600)


def read_state_file(path: str | os.PathLike) -> dict | None:
    """The raw state of a (possibly running) daemon, or None when there is none."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
