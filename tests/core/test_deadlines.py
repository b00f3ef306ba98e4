"""Nothing hangs: a command that never returns becomes an 'unknown: did not answer in N s' finding, within budget."""

import json
import os
import subprocess
import sys
import time

from gpudoctor.diagnose import diagnose
from gpudoctor.gather import gather
from gpudoctor.gather.context import GatherContext
from gpudoctor.host.local import LocalHost
from tests.procs import alive


def fake_tools(tmp_path):
    """A nvidia-smi that hangs; each one started writes its PID to tmp_path/pids (ours alone, not the machine's)."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for tool in ("nvidia-smi",):
        p = bin_ / tool
        p.write_text(f"#!/bin/sh\necho $$ >> {tmp_path / 'pids'}\nexec sleep 600\n")
        p.chmod(0o755)
    return bin_


def test_hung_nvidia_smi_is_unknown_and_check_ends_in_budget(tmp_path):
    bin_ = fake_tools(tmp_path)
    env = dict(os.environ, PATH=f"{bin_}:{os.environ['PATH']}")
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "gpudoctor", "check", "--json", "--timeout", "1"], capture_output=True,
                       text=True, env=env, timeout=30)
    took = time.perf_counter() - t
    assert took < 8.0, took  # 1 s deadline + interpreter start-up, with room for a loaded CI machine
    doc = json.loads(r.stdout)
    assert doc["timings"]["driver"] < 2.5  # the probe itself was cut at its deadline
    f = next(f for f in doc["findings"] if f["id"] == "driver.nvml.init")
    assert f["status"] == "unknown" and f["summary"] == "nvidia-smi did not answer in 1 s"
    # and the sleeping process it started was killed, not left behind
    pids = [int(x) for x in (tmp_path / "pids").read_text().split()]
    assert pids and not [p for p in pids if alive(p)], pids


def test_hung_read_becomes_timeout_result(tmp_path):
    master, slave = os.openpty()  # reading a terminal's slave side blocks until the master writes: never
    host = LocalHost()
    try:
        t = time.perf_counter()
        r = host.read_file(os.ttyname(slave), timeout=0.5)
        assert time.perf_counter() - t < 2.0
        assert r.error == "TIMEOUT" and not r.ok
    finally:
        os.close(master)
        os.close(slave)


def test_a_fifo_is_refused_at_once_never_opened_for_a_blocking_read(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # open() of a FIFO with no writer blocks forever
    t = time.perf_counter()
    r = LocalHost().read_file(str(fifo), timeout=5.0)
    assert r.error == "FIFO" and not r.ok and time.perf_counter() - t < 1.0


def test_whole_gather_respects_deadline(tmp_path):
    bin_ = fake_tools(tmp_path)
    host = LocalHost(path_prepend=[str(bin_)])
    t = time.perf_counter()
    facts = gather(host, GatherContext(name="t", timeout=0.5))
    assert time.perf_counter() - t < 3.0
    assert facts["driver"]["timed_out"] is True
    d = diagnose(facts)
    assert d.by_key()["driver.nvml.init"].status.value == "unknown"
