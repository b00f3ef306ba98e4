"""The reaper (#28): what SSHHost runs over a fresh channel when a session's end was not seen kills every process
carrying the host's nonce — in its command line (a login shell still in its rc files) or its environment (what an
exec'd command started) — process group and all, never itself and never a process without the nonce."""

import os
import signal
import subprocess
import time

from gpudoctor.host.ssh import SSHHost
from tests.procs import alive


def _spawn(argv, env=None):
    return subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, start_new_session=True)


def test_reap_line_kills_what_carries_the_nonce_and_nothing_else():
    host = SSHHost(address="127.0.0.1", name="reap-test")
    other = SSHHost(address="127.0.0.1", name="other")
    procs = []
    try:
        # a login shell still in a slow rc: the nonce only in its command line (it has not exec'd yet)
        rc_loop = _spawn(["bash", "-c", host.command_line(["sleep", "60"]).replace(
            "echo", "i=0; while [ $i -lt 100000000 ]; do i=$((i+1)); done; echo", 1)])
        # a command it exec'd and a child that command started: the nonce in their environment
        env = {**os.environ, "GPUDOCTOR_RUN": host._nonce}
        execd = _spawn(["sh", "-c", "sleep 60 & wait"], env=env)
        # another host's session and an unrelated process: never touched
        foreign = _spawn(["bash", "-c", other.command_line(["sleep", "60"])])
        plain = _spawn(["sleep", "60"])
        procs = [rc_loop, execd, foreign, plain]
        time.sleep(0.3)
        r = subprocess.run(["bash", "-c", host.reap_line()], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        head, _, pids = r.stdout.strip().partition(":")[2].partition(":")
        killed = {int(x) for x in pids.split()}
        assert {rc_loop.pid, execd.pid} <= killed and not killed & {foreign.pid, plain.pid}
        assert int(head) < SSHHost.REAP_TRIES  # it ended because none was left, not by giving up
        for p in (rc_loop, execd):
            assert p.wait(timeout=10) == -signal.SIGKILL
        time.sleep(0.2)
        assert alive(foreign.pid) and alive(plain.pid)
        left = subprocess.run(["grep", "-lsa", "-e", f"GPUDOCTOR_RUN={host._nonce}"] +
                              [f"/proc/{d}/environ" for d in os.listdir("/proc") if d.isdigit()],
                              capture_output=True, text=True)
        assert left.stdout.strip() == ""  # the exec'd command's child died with its group
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(timeout=10)


def test_every_session_line_carries_the_nonce_first():
    host = SSHHost(address="127.0.0.1")
    line = host.command_line(["true"], env={"A": "1"})
    assert line.startswith(f"GPUDOCTOR_RUN={host._nonce}; export GPUDOCTOR_RUN; ")
    assert SSHHost(address="127.0.0.1")._nonce != host._nonce
    assert host._nonce not in host.reap_line().replace(f"{host._nonce[:-1]}[{host._nonce[-1]}]", "")
