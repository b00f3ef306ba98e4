"""The auto-heal daemon: check on a schedule, heal within budgets, report via sd_notify, /metrics and /healthz.

Modules: clock (wall and test clocks), policy (what may be healed, budgets), budget (ledgers, circuit breaker),
state (atomic state file), sdnotify (systemd protocol), metrics (Prometheus + HTTP), xid (NVML XID watcher),
engine (what is checked and healed), loop (the daemon itself).
"""

from gpudoctor.daemon.engine import Action, EngineConfig, Outcome
from gpudoctor.daemon.loop import Daemon, DaemonConfig

__all__ = ["Action", "Daemon", "DaemonConfig", "EngineConfig", "Outcome"]
