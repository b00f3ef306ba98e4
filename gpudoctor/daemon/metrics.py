"""The daemon's /metrics (prometheus_client, own registry) and /healthz, served on loopback by default."""

from __future__ import annotations

import json
import threading

from gpudoctor import __version__
from gpudoctor.errors import ConfigError
from gpudoctor.integrations.promfile import _finding_rows, status_value

BREAKER_VALUE = {"closed": 0, "open": 1, "half_open": 2}


class DaemonMetrics:
    """Every metric the daemon exports. Names match promfile.render where they overlap."""

    def __init__(self):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Info, disable_created_metrics

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
    """A small threaded HTTP server: /metrics (Prometheus text), /healthz (JSON, 200 healthy / 503 not)."""

    def __init__(self, addr: str, metrics: DaemonMetrics, health):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        host, port = parse_addr(addr)
        outer = self

        class Handler(BaseHTTPRequestHandler):
            server_version = f"gpudoctor/{__version__}"

            def do_GET(self):  # noqa: N802 - http.server's name
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    from prometheus_client.exposition import CONTENT_TYPE_LATEST

                    self._send(200, CONTENT_TYPE_LATEST, outer.metrics.render())
                elif path == "/healthz":
                    ok, body = outer.health()
                    self._send(200 if ok else 503, "application/json", (json.dumps(body) + "\n").encode())
                else:
                    self._send(404, "text/plain", b"not found: try /metrics or /healthz\n")

            def _send(self, code, ctype, body):
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):  # keep stderr for structured logs
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            allow_reuse_address = True

        if ":" in host:
            import socket

            Server.address_family = socket.AF_INET6
        try:
            self.httpd = Server((host, port), Handler)
        except OSError as exc:
            raise ConfigError(f"cannot listen on {addr} for /metrics: {exc.strerror or exc}") from exc
        self.metrics = metrics
        self.health = health
        self._thread = None

    @property
    def address(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def start(self) -> None:
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.5},
                                        name="gpudoctor-metrics", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
