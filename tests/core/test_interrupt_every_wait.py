"""Ctrl-C stops every long-waiting command within 1 s, whatever it waits on, with one line and exit 130 (docs/cli.md
"Exit codes"). Each command is interrupted mid-wait, as a person at a terminal would: `inventory ping`, `check --all`
and `daemon` on a host that accepts TCP and never says a word (an SSH banner that never comes, `connect_timeout: 20`);
`bench load` and `bench run` mid-level against the stand-in server, decoding slowly. `inventory ping` used to wait out
its connect timeout (18.5 s), `daemon` its cycle (16 s, then exit 0), `check --all` 2.2 s of connection closing (#49)."""

from __future__ import annotations

import select
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.bench.conftest import StandIn, env, free_port
from tests.console import console_script

STOP_WITHIN_S = 1.0


@pytest.fixture
def mute_host(tmp_path):
    """An inventory whose one host accepts TCP and never speaks; yields (inventory path, listening socket)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        inv = tmp_path / "inv.yaml"
        inv.write_text(f"version: 1\nhosts:\n  mute:\n    address: 127.0.0.1\n    port: {s.getsockname()[1]}\n"
                       "    connect_timeout: 20\n")
        yield str(inv), s


def _start(args, cwd=None) -> subprocess.Popen:
    return subprocess.Popen([console_script(), *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env(), cwd=cwd)


def _connected(listener: socket.socket, p: subprocess.Popen, timeout: float = 60.0) -> socket.socket:
    """Wait (on the event, not a sleep) until the command has connected to the mute host: it now waits on its banner."""
    ready, _, _ = select.select([listener], [], [], timeout)
    assert ready and p.poll() is None, p.communicate()
    return listener.accept()[0]


def _line_on_stderr(p: subprocess.Popen, marker: str, timeout: float = 90.0) -> None:
    """Wait until the command's stderr says `marker` (bench: the level is running)."""
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        line = p.stderr.readline()
        if not line:
            break
        seen.append(line)
        if marker in line:
            return
    p.kill()
    pytest.fail(f"never saw {marker!r}: {''.join(seen)}")


def _interrupt(p: subprocess.Popen) -> tuple[float, str]:
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    try:
        _, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        pytest.fail("did not stop within 60 s of SIGINT")
    return time.monotonic() - t0, err


@pytest.mark.parametrize("args", [["inventory", "ping"], ["check", "--all"], ["daemon", "--host", "mute",
                                  "--metrics-addr", "127.0.0.1:0", "--no-xid", "--interval", "600"]],
                         ids=["inventory-ping", "check-all", "daemon"])
def test_ctrl_c_on_a_host_that_never_speaks(mute_host, tmp_path, args):
    inv, listener = mute_host
    extra = ["--state", str(tmp_path / "state" / "daemon.json")] if args[0] == "daemon" else []
    p = _start([*args, "-i", inv, *extra])
    conn = _connected(listener, p)
    try:
        took, err = _interrupt(p)
    finally:
        conn.close()
    assert p.returncode == 130, err
    assert err.splitlines()[-1] == "gpudoctor: interrupted" and "Traceback" not in err, err
    assert took < STOP_WITHIN_S, f"{' '.join(args)} stopped {took:.2f} s after SIGINT"


def test_ctrl_c_mid_bench_load(tmp_path):
    s = StandIn(tmp_path, "--decode-tok-s", "2")
    try:
        p = _start(["bench", "load", "--server-url", s.url, "--max-tokens", "400", "--context-limit", "4096",
                    "--concurrency", "1", "--out", str(tmp_path / "out")])
        _line_on_stderr(p, "token counts:")  # said just before the first level's requests go out
        time.sleep(0.3)  # a request is in flight (400 tokens at 2 tok/s: minutes of decoding ahead)
        took, err = _interrupt(p)
    finally:
        s.stop()
    assert p.returncode == 130 and err.splitlines()[-1] == "gpudoctor: interrupted", err
    assert took < STOP_WITHIN_S, f"bench load stopped {took:.2f} s after SIGINT"


def test_ctrl_c_mid_bench_run(tmp_path):
    (tmp_path / "model").mkdir()
    camp = tmp_path / "c.yaml"
    camp.write_text(f"""name: t
model: {tmp_path}/model
server:
  command: [{sys.executable}, -m, gpudoctor.bench.standin, --decode-tok-s, "2", --ttft-ms, "10"]
  port: {free_port()}
gate: false
tp: [1]
concurrency: [1]
timeouts: {{ready_s: 90, stall_s: 15, stop_s: 5, gpu_release_s: 5}}
methods: {{baseline: {{baseline: true}}}}
workloads:
  - name: chat
    max_tokens: [400]
    num_prompts: 4
""")
    p = _start(["bench", "run", str(camp), "--out", str(tmp_path / "out")])
    _line_on_stderr(p, "ready in")  # the server is up; the level starts now
    time.sleep(0.3)
    took, err = _interrupt(p)
    assert p.returncode == 130 and err.splitlines()[-1] == "gpudoctor: interrupted", err
    assert took < STOP_WITHIN_S, f"bench run stopped {took:.2f} s after SIGINT"
