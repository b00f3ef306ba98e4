"""Fixtures: the SGLang stand-in started as a real process on a free loopback port."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from tests.childenv import pythonpath

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env() -> dict:
    e = dict(os.environ)
    e["PYTHONPATH"] = pythonpath(env=e)
    return e


def wait_http(url: str, deadline: float = 10.0, want: int | None = 200) -> int | None:
    """Poll until the URL answers (with `want`, when given); return the last status (None: no answer)."""
    end = time.monotonic() + deadline
    status = None
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                status = r.status
        except urllib.error.HTTPError as exc:
            status = exc.code
        except OSError:
            status = None
        if status is not None and (want is None or status == want):
            return status
        time.sleep(0.05)
    return status


class StandIn:
    def __init__(self, tmp: Path, *args: str, ready: bool = True):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp / f"standin-{self.port}.log"
        self.proc = subprocess.Popen([sys.executable, "-m", "gpudoctor.bench.standin", "--port", str(self.port),
                                      "--log-file", str(self.log), *args], env=env())
        # /ready (SGLang) and vLLM's /health answer 200 at once when ready; /health_generate takes >= 1 s.
        probe = "/health" if "vllm" in args or "openai" in args else "/ready"
        status = wait_http(self.url + probe, deadline=30.0, want=200 if ready else None)  # a loaded machine
        if ready and status != 200:
            self.stop()
            raise RuntimeError(f"stand-in did not become ready: {status}; log: {self.log.read_text()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=5)

    def log_text(self) -> str:
        return self.log.read_text() if self.log.exists() else ""


@pytest.fixture
def standin(tmp_path):
    started: list[StandIn] = []

    def start(*args: str, ready: bool = True) -> StandIn:
        s = StandIn(tmp_path, *args, ready=ready)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """The real CLI in a subprocess: exit codes, stdout and stderr as a user sees them (through tests/rooted.py,
    which roots the hosts a test names in $GPUDOCTOR_TEST_ROOTS and changes nothing else)."""
    return subprocess.run([sys.executable, "-m", "tests.rooted", *args], capture_output=True, text=True, env=env(),
                          timeout=timeout, cwd=REPO)


def as_trials(dst, *runs):
    """The records of separate `bench load` runs of one configuration as trials 0, 1, … of one result directory."""
    dst.mkdir()
    recs = []
    for i, run in enumerate(runs):
        for line in (run / "results.jsonl").read_text().splitlines():
            recs.append(json.dumps({**json.loads(line), "trial": i}))
    (dst / "results.jsonl").write_text("\n".join(recs) + "\n")
