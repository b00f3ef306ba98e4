"""The daemon with its real engine on this machine: the real check pipeline, the real XID watcher (which must cope
with whatever NVML this machine has), /metrics equal to what `gpudoctor check --json` says."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

from daemon_harness import scrape
from tests.childenv import pythonpath



def test_real_pipeline_daemon_matches_check_json(tmp_path):
    env = {**os.environ, "PYTHONPATH": pythonpath()}
    check = subprocess.run([sys.executable, "-m", "gpudoctor", "check", "--json"], capture_output=True, text=True,
                           env=env, timeout=120)
    expected = json.loads(check.stdout)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify"))
    sock.settimeout(60)
    state = tmp_path / "state.json"
    proc = subprocess.Popen([sys.executable, "-m", "gpudoctor", "daemon", "--state", str(state),
                             "--metrics-addr", "127.0.0.1:0", "--interval", "3600"],
                            env={**env, "NOTIFY_SOCKET": str(tmp_path / "notify")}, stderr=subprocess.PIPE)
    try:
        msg = sock.recv(4096).decode()
        assert msg.startswith("READY=1")
        host = socket.gethostname()
        assert f"STATUS={host} {expected['verdict']}" in msg
        addr = json.loads(state.read_text())["metrics_addr"]
        with urllib.request.urlopen(f"http://{addr}/metrics", timeout=10) as r:
            m = scrape(r.read().decode())
        value = {"ok": 0, "info": 0, "warn": 1, "fail": 2, "unknown": 3}
        for f in expected["findings"]:
            key = ("gpudoctor_check_status", frozenset({("host", host), ("check", f["id"]),
                                                       ("subject", f["subject"] or "")}))
            assert m[key] >= value[f["status"]], f["key"]
        assert m[("gpudoctor_host_status", frozenset({("host", host)}))] == expected["exit_code"]
        with urllib.request.urlopen(f"http://{addr}/healthz", timeout=10) as r:
            health = json.loads(r.read())
        assert health["status"] == "ok" and health["hosts"][host]["verdict"] == expected["verdict"]
        deadline = time.monotonic() + 10
        while "xid_watcher" not in health or health["xid_watcher"] == "starting":
            assert time.monotonic() < deadline
            time.sleep(0.1)
            with urllib.request.urlopen(f"http://{addr}/healthz", timeout=10) as r:
                health = json.loads(r.read())
        assert health["xid_watcher"] == "running" or health["xid_watcher"].startswith(("NVML", "no GPU"))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        assert sock.recv(4096) == b"STOPPING=1"
    finally:
        if proc.poll() is None:
            proc.kill()
        sock.close()


def test_daemon_bad_input_is_one_line_exit_3(tmp_path):
    env = {**os.environ, "PYTHONPATH": pythonpath()}
    cases = [
        (["--metrics-addr", "localhost"], "--metrics-addr must be HOST:PORT"),
        (["--inventory", str(tmp_path / "none.yaml")], "none.yaml: inventory file not found"),
        (["--host", "ct200"], "--host needs --inventory"),
        (["--interval", "0"], "Invalid value for '--interval'"),
    ]
    for args, msg in cases:
        r = subprocess.run([sys.executable, "-m", "gpudoctor", "daemon", "--state", str(tmp_path / "s.json"), *args],
                           capture_output=True, text=True, env=env, timeout=60)
        assert r.returncode == 3, (args, r.stderr)
        assert len(r.stderr.splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr  # exactly one line
        assert msg in r.stderr, r.stderr
    assert not (tmp_path / "s.json").exists()  # nothing written on bad input


def test_metrics_port_in_use_is_one_line(tmp_path):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    r = subprocess.run([sys.executable, "-m", "gpudoctor", "daemon", "--state", str(tmp_path / "s.json"),
                        "--metrics-addr", f"127.0.0.1:{port}", "--no-xid"], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": pythonpath()}, timeout=60)
    busy.close()
    assert r.returncode == 3 and f"cannot listen on 127.0.0.1:{port}" in r.stderr, r.stderr
    assert len(r.stderr.splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr  # exactly one line
