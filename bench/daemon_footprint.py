#!/usr/bin/env python3
"""Daemon idle footprint: RSS and CPU between check cycles, measured on the real daemon process.

Starts `gpudoctor daemon` (real engine: checks this machine; real XID watcher; /metrics on loopback) under a
sd_notify socket, waits for READY=1 (the first cycle is done), then samples its RSS and CPU time over an idle
window, scraping /metrics once during it as Prometheus would. Targets: RSS <= 60 MB, CPU <= 0.5 %.

    python bench/daemon_footprint.py [--idle 30] [--interval 600]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--idle", type=float, default=30.0, help="seconds of idle time to measure")
    ap.add_argument("--interval", type=float, default=600.0, help="daemon --interval (longer than --idle)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gpudoctor-footprint-"))
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp / "notify"))
    sock.settimeout(120)
    env = {**os.environ, "NOTIFY_SOCKET": str(tmp / "notify"), "PYTHONPATH": str(ROOT)}
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "gpudoctor", "daemon", "--state", str(tmp / "state.json"),
                             "--metrics-addr", "127.0.0.1:0", "--interval", str(args.interval)],
                            env=env, stderr=subprocess.DEVNULL)
    try:
        while not sock.recv(4096).startswith(b"READY=1"):
            pass
        ready_s = time.monotonic() - t0
        p = psutil.Process(proc.pid)
        rss_after_cycle = p.memory_info().rss
        time.sleep(1.0)  # let the first cycle's garbage settle
        addr = json.loads((tmp / "state.json").read_text())["metrics_addr"]
        c0, w0 = p.cpu_times(), time.monotonic()
        time.sleep(args.idle / 2)
        with urllib.request.urlopen(f"http://{addr}/metrics", timeout=10) as r:
            scraped = len(r.read())
        time.sleep(args.idle / 2)
        c1, w1 = p.cpu_times(), time.monotonic()
        cpu_s = (c1.user - c0.user) + (c1.system - c0.system)
        rss = p.memory_info().rss
        threads = p.num_threads()
        uss = p.memory_full_info().uss
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    cpu_pct = 100.0 * cpu_s / (w1 - w0)
    print(f"daemon ready (first cycle done) in {ready_s:.2f} s")
    print(f"RSS after first cycle: {rss_after_cycle / 1e6:.1f} MB; idle RSS: {rss / 1e6:.1f} MB "
          f"(USS {uss / 1e6:.1f} MB), {threads} threads")
    print(f"idle CPU over {w1 - w0:.1f} s incl. one /metrics scrape ({scraped} bytes): {cpu_s * 1000:.1f} ms "
          f"= {cpu_pct:.3f} %")
    ok = rss <= 60e6 and cpu_pct <= 0.5
    print(f"targets RSS <= 60 MB and CPU <= 0.5 %: {'met' if ok else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
