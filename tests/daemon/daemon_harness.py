"""Run the real daemon as a subprocess: real sd_notify socket, real HTTP scrapes, a file-driven fake clock."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from tests.childenv import pythonpath


HERE = Path(__file__).resolve().parent
T0 = 1_700_000_000.0


def scrape(text: str) -> dict:
    """Prometheus text -> {(name, frozenset(labels)): value}."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


class DaemonProc:
    def __init__(self, tmp: Path, scenario: dict, *, interval: float = 60, abstract_socket: bool = False,
                 watchdog_usec: int | None = 200_000):
        self.tmp = tmp
        self.clock = tmp / "clock"
        self.now = T0
        self._write_clock()
        self.scenario_path = tmp / "scenario.json"
        self.log = tmp / "applied.jsonl"
        self.state = tmp / "daemon.json"  # beside recovery.json, where a gate looks for a running daemon
        self.stderr_path = tmp / "daemon.stderr"
        self.interval = interval
        self.scenario = dict(scenario, log=str(self.log), clock=str(self.clock))
        self.write_scenario()
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        if abstract_socket:
            name = f"gpudoctor-test-{os.getpid()}-{id(self)}"
            self.sock.bind("\0" + name)
            self.notify_addr = "@" + name
        else:
            self.notify_addr = str(tmp / "notify.sock")
            self.sock.bind(self.notify_addr)
        self.sock.settimeout(0.1)
        self.watchdog_usec = watchdog_usec
        self.datagrams: list[str] = []
        self._stop_reader = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.proc = None

    # --- plumbing ---
    def _write_clock(self):
        tmp = self.clock.with_suffix(".tmp")
        tmp.write_text(repr(self.now))
        os.replace(tmp, self.clock)

    def write_scenario(self, **changes):
        self.scenario.update(changes)
        tmp = self.scenario_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.scenario))
        os.replace(tmp, self.scenario_path)

    def _read(self):
        while not self._stop_reader.is_set():
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                return
            self.datagrams.append(data.decode())

    def env(self, **extra):
        env = dict(os.environ)
        env["PYTHONPATH"] = pythonpath(HERE, env=env)
        env["NOTIFY_SOCKET"] = self.notify_addr
        if self.watchdog_usec:
            env["WATCHDOG_USEC"] = str(self.watchdog_usec)
        env.pop("WATCHDOG_PID", None)
        env.update(extra)
        return env

    def argv(self, *extra):
        return [sys.executable, "-m", "gpudoctor", "daemon", "--inventory", str(self.scenario_path),
                "--state", str(self.state), "--metrics-addr", "127.0.0.1:0", "--interval", str(self.interval),
                "--clock-file", str(self.clock), "--engine", "scenario_engine:factory", "--no-xid", *extra]

    def start(self, *extra, wait_ready=True):
        self.datagrams.clear()
        self.proc = subprocess.Popen(self.argv(*extra), env=self.env(), stdout=subprocess.DEVNULL,
                                     stderr=open(self.stderr_path, "ab"), cwd=self.tmp)
        if wait_ready:
            self.wait_datagram(lambda d: "READY=1" in d.split("\n"))
        return self

    def run_once(self, *extra) -> subprocess.CompletedProcess:
        return subprocess.run(self.argv("--once", *extra), env=self.env(), capture_output=True, text=True,
                              timeout=60, cwd=self.tmp)

    def wait_datagram(self, pred, timeout=15.0, start=0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for d in self.datagrams[start:]:
                if pred(d):
                    return d
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"daemon exited {self.proc.returncode}: {self.stderr()}")
            time.sleep(0.01)
        raise AssertionError(f"no matching datagram in {timeout}s; got {self.datagrams!r}; stderr: {self.stderr()}")

    def stderr(self) -> str:
        try:
            return self.stderr_path.read_text()[-4000:]
        except OSError:
            return ""

    def read_state(self) -> dict:
        return json.loads(self.state.read_text())

    def cycles(self) -> int:
        try:
            return self.read_state()["cycles"]
        except (OSError, ValueError, KeyError):
            return 0

    def wait_cycles(self, n, timeout=15.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.cycles() >= n:
                return
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"daemon exited {self.proc.returncode}: {self.stderr()}")
            time.sleep(0.01)
        raise AssertionError(f"daemon did not reach {n} cycles (at {self.cycles()}): {self.stderr()}")

    def step(self, dt=None):
        """Advance the fake clock by dt (default: one interval) and wait for the cycle it triggers."""
        before = self.cycles()
        self.now += self.interval if dt is None else dt
        self._write_clock()
        self.wait_cycles(before + 1)

    def applied(self) -> list[dict]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]

    def url(self, path: str) -> str:
        return f"http://{self.read_state()['metrics_addr']}{path}"

    def get(self, path: str):
        try:
            with urllib.request.urlopen(self.url(path), timeout=5) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def metrics(self) -> dict:
        code, body = self.get("/metrics")
        assert code == 200
        return scrape(body)

    def signal(self, sig):
        self.proc.send_signal(sig)

    def stop(self, timeout=15.0) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def close(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        self._stop_reader.set()
        self.sock.close()
