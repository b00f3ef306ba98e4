"""#24 item 5: the daemon's children get an environment without systemd's protocol (NOTIFY_SOCKET, WATCHDOG_*,
LISTEN_*, ...): a child that inherited NOTIFY_SOCKET would send its own datagrams there, as `systemctl is-enabled`
of a missing unit sends ERRNO=2 (rejected and logged by systemd under NotifyAccess=main).

Real: the daemon process, its sd_notify socket, a child started the way checks start probes (gpudoctor's LocalHost).
The child does what systemctl does with NOTIFY_SOCKET (sends ERRNO=2) and writes down the protocol variables it got.
The same over 3 cycles of the shipped unit under systemd 252 PID 1: tests/systemd/test_units_under_systemd.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from gpudoctor.daemon.sdnotify import PROTOCOL_VARS, take_protocol_env

CHILD = """
import json, os, socket, sys
got = {k: v for k, v in os.environ.items() if k in %r}
with open(sys.argv[1], "a") as fh:
    fh.write(json.dumps(got) + "\\n")
addr = os.environ.get("NOTIFY_SOCKET")
if addr:  # what systemctl does: tell the service manager the errno it failed with
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.sendto(b"ERRNO=2", "\\0" + addr[1:] if addr.startswith("@") else addr)
""" % (PROTOCOL_VARS,)


def test_take_protocol_env_moves_every_protocol_variable_and_keeps_the_rest():
    env = {"NOTIFY_SOCKET": "/run/systemd/notify", "WATCHDOG_USEC": "120000000", "WATCHDOG_PID": "7",
           "LISTEN_FDS": "1", "LISTEN_PID": "7", "LISTEN_FDNAMES": "x", "SYSTEMD_EXEC_PID": "7",
           "PATH": "/usr/bin", "STATE_DIRECTORY": "/var/lib/gpudoctor", "INVOCATION_ID": "abc"}
    got = take_protocol_env(env)
    assert set(got) == {"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID",
                        "LISTEN_FDNAMES", "SYSTEMD_EXEC_PID"}
    assert env == {"PATH": "/usr/bin", "STATE_DIRECTORY": "/var/lib/gpudoctor", "INVOCATION_ID": "abc"}


def test_children_of_the_daemon_never_see_notify_socket(daemon_factory, tmp_path):
    child = tmp_path / "child.py"
    child.write_text(CHILD)
    seen = tmp_path / "child-env.jsonl"
    sc = {"hosts": ["ct200"], "local_host": None, "policy": {},
          "findings": {"ct200": [{"id": "driver.nvml.init", "status": "ok", "summary": "NVML initialised"}]},
          "child": [sys.executable, str(child), str(seen)]}
    d = daemon_factory(sc, watchdog_usec=200_000)
    # the child is a faithful probe of the leak: started with the daemon's environment, it reaches the socket
    subprocess.run([sys.executable, str(child), str(tmp_path / "control.jsonl")], check=True, timeout=30,
                   env={**os.environ, "NOTIFY_SOCKET": d.notify_addr})
    d.wait_datagram(lambda m: m == "ERRNO=2")
    d.datagrams.clear()
    d.start()
    for _ in range(3):
        d.step()
    d.wait_datagram(lambda m: m == "WATCHDOG=1")  # the daemon itself still speaks the protocol
    assert d.stop() == 0
    runs = [json.loads(x) for x in seen.read_text().splitlines()]
    assert len(runs) >= 4 and all(r == {} for r in runs), runs  # the first cycle and 3 more
    assert "ERRNO=2" not in d.datagrams, d.datagrams
