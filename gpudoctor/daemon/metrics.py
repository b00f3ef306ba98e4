"""The daemon's /metrics (prometheus_client, own registry) and /healthz, served on loopback by default."""

from __future__ import annotations

import json
import threading

from gpudoctor import __version__
from gpudoctor.errors import ConfigError
from gpudoctor.integrations.promfile import _finding_rows, status_value

BREAKER_VALUE = {"closed": 0, "open": 1, "half_open": 2}
# 1 min to 30 days: a flapping fault, an hourly one, a daily one, a monthly one (NVSentinel's MTBI spans 15 min-30 d)
BETWEEN_FAILURES_BUCKETS = (60, 300, 900, 3600, 4 * 3600, 12 * 3600, 86400, 3 * 86400, 7 * 86400, 30 * 86400)


class DaemonMetrics:
    """Every metric the daemon exports. Names match promfile.render where they overlap."""

    def __init__(self):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, disable_created_metrics

        disable_created_metrics()  # no *_created series beside each counter: docs/daemon.md lists every series
        r = self.registry = CollectorRegistry()
        Info("gpudoctor", "gpudoctor build information.", registry=r).info({"version": __version__})
        self.check = Gauge("gpudoctor_check_status", "Check status: 0 ok, 1 warn, 2 fail, 3 unknown.",
                           ["host", "check", "subject"], registry=r)
        self.verdict = Gauge("gpudoctor_host_status", "Host verdict: 0 ok, 1 warn, 2 fail, 3 unknown or unreachable.",
                             ["host"], registry=r)
        self.up = Gauge("gpudoctor_host_up", "1 when gpudoctor could reach and probe the host.", ["host"], registry=r)
        self.last = Gauge("gpudoctor_last_run_timestamp_seconds", "When the host was last checked (Unix time).",
                          ["host"], registry=r)
        self.duration = Gauge("gpudoctor_check_duration_seconds", "Wall time of the last check of the host.",
                              ["host"], registry=r)
        self.cycles = Counter("gpudoctor_daemon_cycles", "Check cycles run since the daemon started.", registry=r)
        self.applied = Counter("gpudoctor_remedies_applied", "Remedies applied, by result (ok, failed).",
                               ["host", "remedy", "result"], registry=r)
        self.skipped = Counter("gpudoctor_remedies_skipped",
                               "Remedies not applied, by reason (policy, breaker, hourly_cap, backoff, disabled).",
                               ["host", "remedy", "reason"], registry=r)
        self.breaker = Gauge("gpudoctor_breaker_state", "Healing circuit breaker: 0 closed, 1 open, 2 half-open.",
                             ["host"], registry=r)
        self.breaker_trips = Gauge("gpudoctor_breaker_trips", "Times the breaker has opened (kept across restarts).",
                                   ["host"], registry=r)
        self.xid = Counter("gpudoctor_xid_events", "NVML XID events seen since the daemon started.",
                           ["gpu", "xid"], registry=r)
        self.xid_watch = Gauge("gpudoctor_xid_watcher_up", "1 while the NVML XID watcher runs.", registry=r)
        self.ready = Gauge("gpudoctor_ready", "1 when the host may serve: its recovery ladder is ready (verified since "
                           "its last failure, reboot and driver change); 0 otherwise.", ["host"], registry=r)
        self.recovery_state = Gauge("gpudoctor_recovery_state", "The host's recovery ladder state: 1 for the current "
                                    "state, 0 for the others.", ["host", "state"], registry=r)
        self.recovery_since = Gauge("gpudoctor_recovery_transition_timestamp_seconds",
                                    "When the host entered its current recovery state (Unix time).", ["host"],
                                    registry=r)
        self.between_failures = Histogram("gpudoctor_time_between_failures_seconds",
                                          "Time from one failure's onset on a host to the next one's.", ["host"],
                                          buckets=BETWEEN_FAILURES_BUCKETS, registry=r)
        self._check_keys: dict[str, set] = {}
        self._lock = threading.Lock()

    def observe_host(self, host: str, status: str, findings, timestamp: float, duration_s: float | None) -> None:
        """Set the gauges of one host from its last check; stale (check, subject) series are removed."""
        reachable = status not in ("unreachable", "error")
        with self._lock:
            self.up.labels(host).set(1 if reachable else 0)
            self.verdict.labels(host).set(status_value(status) if reachable else 3)
            self.last.labels(host).set(timestamp)
            if duration_s is not None:
                self.duration.labels(host).set(duration_s)
            rows = _finding_rows(findings) if reachable else {}
            for old in self._check_keys.get(host, set()) - set(rows):
                try:
                    self.check.remove(host, *old)
                except KeyError:
                    pass
            for (cid, subject), value in rows.items():
                self.check.labels(host, cid, subject).set(value)
            if reachable:
                self._check_keys[host] = set(rows)

    def observe_breaker(self, host: str, state: str, trips: int) -> None:
        self.breaker.labels(host).set(BREAKER_VALUE.get(state, 1))
        self.breaker_trips.labels(host).set(trips)

    def observe_ladder(self, host: str, ladder, boot_id) -> None:
        """gpudoctor_ready, the one-hot state and its transition time, as a reader sees the ladder (recovery.view)."""
        from gpudoctor.recovery.ladder import STATES, view

        state, _, ready = view(ladder, boot_id)
        with self._lock:
            self.ready.labels(host).set(1 if ready else 0)
            for s in STATES:
                self.recovery_state.labels(host, s).set(1 if s == state else 0)
            if ladder.since is not None:
                self.recovery_since.labels(host).set(ladder.since)
            self.between_failures.labels(host)  # the series exists (count 0) before the first interval

    def render(self) -> bytes:
        from prometheus_client.exposition import generate_latest

        return generate_latest(self.registry)


def parse_addr(addr: str) -> tuple[str, int]:
    """'HOST:PORT' (IPv6 as [::1]:PORT) -> (host, port); bad input raises ConfigError."""
    host, sep, port = addr.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"--metrics-addr must be HOST:PORT (e.g. 127.0.0.1:9835), got {addr!r}")
    return host, int(port)


class MetricsServer:
    """/metrics (Prometheus text) and /healthz (JSON, 200 healthy / 503 not) on the bounded server of httpd.py."""

    def __init__(self, addr: str, metrics: DaemonMetrics, health):
        from gpudoctor.daemon.httpd import BoundedHTTPServer, listen

        host, port = parse_addr(addr)
        try:
            sock = listen(host, port)
        except OSError as exc:
            raise ConfigError(f"cannot listen on {addr} for /metrics: {exc.strerror or exc}") from exc
        self.metrics = metrics
        self.health = health
        self.httpd = BoundedHTTPServer(sock, self._handle, server_name=f"gpudoctor/{__version__}")

    def _handle(self, path: str) -> tuple[int, str, bytes]:
        if path == "/metrics":
            from prometheus_client.exposition import CONTENT_TYPE_LATEST

            return 200, CONTENT_TYPE_LATEST, self.metrics.render()
        if path == "/healthz":
            ok, body = self.health()
            return (200 if ok else 503), "application/json", (json.dumps(body) + "\n").encode()
        return 404, "text/plain", b"not found: try /metrics or /healthz\n"

    @property
    def address(self) -> str:
        host, port = self.httpd.sock.getsockname()[:2]
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def start(self) -> None:
        self.httpd.start()

    def stop(self) -> None:
        self.httpd.stop()
