"""The SSH probe agent against a real sshd: one login shell per connection, deadlines kept, failures fall back."""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time

import pytest

from gpudoctor.errors import HostUnreachable
from gpudoctor.gather import gather
from gpudoctor.gather.context import GatherContext
from tests.procs import alive


def sessions(server) -> int:
    """Commands sshd started (one per exec request: each one a login shell on the target)."""
    return server.log.read_text().count("Starting session: command")


def wait_for(cond, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def steady(section: dict) -> dict:
    """Facts without what other processes on this machine change between two gathers (free bytes in /dev/shm)."""
    out = dict(section)
    vfs = (out.get("shm") or {}).get("statvfs")
    if isinstance(vfs, dict):
        out["shm"] = {**out["shm"], "statvfs": {k: v for k, v in vfs.items() if k not in ("free", "avail")}}
    return out


@pytest.fixture(scope="module")
def verbose_sshd(sshd_factory):
    return sshd_factory.start_extra(loglevel="VERBOSE")


def test_a_whole_check_starts_one_remote_command_instead_of_one_per_probe(verbose_sshd):
    counts, facts = {}, {}
    for mode in (True, False):
        before = sessions(verbose_sshd)
        host = verbose_sshd.make_host(agent=mode)
        facts[mode] = gather(host, GatherContext(name="t"))
        host.close()
        assert wait_for(lambda: sessions(verbose_sshd) > before, 3)
        counts[mode] = sessions(verbose_sshd) - before
    assert counts[True] == 1, counts  # the agent; the commands it runs start no login shell
    assert counts[False] >= 10, counts
    for key in ("host", "devices", "workload"):
        assert steady(facts[True][key]) == steady(facts[False][key]), key
    assert facts[True]["tools"]["units"] == facts[False]["tools"]["units"]


def test_without_a_usable_python_commands_answer_file_operations_say_so_and_the_agent_is_tried_once(
        verbose_sshd, tmp_path):
    (tmp_path / "f").write_text("one-shot")
    host = verbose_sshd.make_host(python=[str(tmp_path / "no-python3")])
    before = sessions(verbose_sshd)
    assert host.run(["echo", "hi"]).stdout == "hi\n"
    r = host.read_file(str(tmp_path / "f"))  # host/ops.py needs a python there: "could not probe", not a guess
    assert (r.data, r.error) == (None, "PROBE_FAILED rc=127")
    assert host.run(["echo", "again"]).stdout == "again\n"
    host.close()
    assert host.agents_started == 0
    assert wait_for(lambda: sessions(verbose_sshd) - before == 4, 3)  # the failed agent, then one per request


def test_an_agent_killed_mid_command_is_reported_not_rerun_and_replaced(sshd, tmp_path):
    host = sshd.make_host()
    assert host.run(["true"]).rc == 0
    marker = tmp_path / "ran"
    out = {}
    t = threading.Thread(target=lambda: out.update(r=host.run(["sh", "-c", f"echo x >> {marker}; sleep 3"],
                                                              timeout=20)))
    t.start()
    assert wait_for(marker.exists, 10)
    os.kill(host._agent.pid, signal.SIGKILL)
    t.join(15)
    r = out["r"]
    assert (r.rc, r.timed_out) == (None, False) and "ended while the command ran" in r.stderr
    assert host.read_file("/proc/sys/kernel/ostype").data == b"Linux\n"
    assert host.run(["echo", "ok"]).stdout == "ok\n"
    assert marker.read_text() == "x\n"  # the interrupted command never ran twice
    assert (host.agents_started, host.connections_made) == (2, 1)
    host.close()


def test_a_client_that_vanishes_leaves_no_command_running(sshd_factory, tmp_path):
    server = sshd_factory.start_extra()
    host = server.make_host()
    assert host.run(["true"]).rc == 0
    pidfile = tmp_path / "pid"
    threading.Timer(0.5, server.cut_connections).start()
    with pytest.raises(HostUnreachable, match="connection lost"):
        host.run(["sh", "-c", f"sleep 60 & echo $! > {pidfile}; wait"], timeout=1.5)
    assert wait_for(pidfile.exists, 5)
    child = int(pidfile.read_text())
    # The agent saw its stdin close; it kills the command itself when the deadline (+2 s grace) passes.
    assert wait_for(lambda: not alive(child), 1.5 + 2.0 + 5.0), "the command outlived its deadline"
    host.close()


def test_a_read_that_hangs_times_out_alone(ssh_host, tmp_path):
    master, slave = os.openpty()  # reading the terminal's slave side blocks until the master writes: never
    tty = os.ttyname(slave)
    (tmp_path / "f").write_text("fine")
    try:
        t0 = time.monotonic()
        hung, fine, listing = ssh_host.batch([("read", tty), ("read", str(tmp_path / "f")),
                                              ("listdir", str(tmp_path))], timeout=1.0)
        assert time.monotonic() - t0 < 1.0 + 3.0
        assert hung.error == "TIMEOUT" and fine.data == b"fine" and listing == ["f"]
        t0 = time.monotonic()
        assert ssh_host.read_file(tty, timeout=1.0).error == "TIMEOUT"
        assert 0.9 <= time.monotonic() - t0 < 1.0 + 3.0
        assert ssh_host.run(["echo", "still here"]).stdout == "still here\n"
    finally:
        os.close(master)
        os.close(slave)


def test_a_fifo_is_refused_at_once_never_read(ssh_host, tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # open() would block until a writer comes: never
    t0 = time.monotonic()
    assert ssh_host.read_file(str(fifo), timeout=5.0).error == "FIFO"
    (r,) = ssh_host.batch([("read", str(fifo))], timeout=5.0)
    assert r.error == "FIFO" and time.monotonic() - t0 < 3.0


def test_the_inventory_python_is_resolved_once(sshd, tmp_path):
    """A pyenv/conda shim costs a shell script per start: the agent runs python programs with what it resolved."""
    count = tmp_path / "shim-runs"
    shim = tmp_path / "python3-shim"
    shim.write_text(f'#!/bin/sh\necho run >> {count}\nexec {os.path.realpath(sys.executable)} "$@"\n')
    shim.chmod(0o755)
    host = sshd.make_host(python=[str(shim)])
    for _ in range(3):
        r = host.run([str(shim), "-c", "import sys; print(sys.executable)"])
        assert r.stdout.strip() == os.path.realpath(sys.executable)
    assert host.stat("/dev/null").kind == "char"
    host.close()
    assert count.read_text() == "run\n"


def test_big_answers_arrive_whole(ssh_host, tmp_path):
    blob = os.urandom(3 << 20)
    (tmp_path / "blob").write_bytes(blob)
    assert ssh_host.read_file(str(tmp_path / "blob"), timeout=30).data == blob
    r = ssh_host.run(["head", "-c", str(2 << 20), str(tmp_path / "blob")], timeout=30)
    assert r.rc == 0 and len(r.stdout.encode("utf-8", "surrogateescape")) > 0
    r = ssh_host.run([*ssh_host.python, "-c", "import sys; sys.stdout.write('x' * (5 << 20))"], timeout=30)
    assert r.stdout == "x" * (5 << 20)


def test_many_threads_share_one_agent(sshd, tmp_path):
    host = sshd.make_host()
    (tmp_path / "f").write_text("shared")
    errors, seen = [], []

    def worker(i):
        try:
            for j in range(5):
                r = host.run(["echo", f"{i}-{j}"])
                (rd,) = host.batch([("read", str(tmp_path / "f"))])
                assert (r.stdout, rd.data) == (f"{i}-{j}\n", b"shared")
                seen.append((i, j))
        except Exception as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(seen) == 80
    assert (host.agents_started, host.connections_made) == (1, 1)
    host.close()


def test_bad_arguments_are_refused_before_anything_connects(sshd):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]  # nothing listens here: connecting would raise HostUnreachable
    host = sshd.make_host(port=closed_port)
    with pytest.raises(ValueError, match="variable name"):
        host.run(["true"], env={"A B": "x"})
    with pytest.raises(ValueError, match="NUL"):
        host.run(["printf", "a\0b"])
    with pytest.raises(HostUnreachable):
        host.run(["true"])
