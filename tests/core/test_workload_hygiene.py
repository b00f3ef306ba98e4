"""Workload hygiene with real processes on this machine: a stranger holding an open GPU device node (a mknod'ed
node) and — in NVML's process list, from the captured H200 `nvidia-smi -q -x` — 20 GiB; a server gpudoctor's bench
started and left (its campaign gone) holding a node and the serving port. The benchmark gate blocks; the cleanup
remedy stops only gpudoctor's own orphan and refuses the stranger."""

from __future__ import annotations

import os
import re
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpudoctor.gather.marker import owner_token, parse_owner, server_env
from gpudoctor.diagnose import diagnose
from gpudoctor.gate import evaluate, resolve_profile
from gpudoctor.gather import gather
from gpudoctor.gather.context import GatherContext
from gpudoctor.gather.driver import parse_nvidia_smi_xml
from gpudoctor.host.local import LocalHost
from gpudoctor.remedies.bench_orphans import StopOrphanServers
from gpudoctor.remedy import RemedyContext

from tests import needs

from .conftest import CAPTURES


@pytest.fixture
def tmp_path(dev_tmp_path):
    """Device nodes are made here: a directory where they open as on /dev, whatever /tmp's mount (tests/devmount.py)."""
    return dev_tmp_path


HOLD = r"""
import os, socket, sys, time

fd = os.open(sys.argv[1], os.O_RDWR)
if len(sys.argv) > 2 and sys.argv[2] != "-":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", int(sys.argv[2]))); s.listen()
if len(sys.argv) > 3:  # become another user, keeping what is open (a stranger's job)
    os.setgroups([]); os.setgid(int(sys.argv[3])); os.setuid(int(sys.argv[3]))
print("ready", os.getpid(), flush=True)
time.sleep(600)
"""


def _xml_with(pids_mib: dict[int, int]) -> str:
    """The captured H200 `nvidia-smi -q -x` with NVML processes: the format the driver prints, these PIDs."""
    text = (CAPTURES / "h200-healthy" / "nvidia-smi-qx.txt").read_text().splitlines()
    xml = "\n".join(text[1:-1])
    procs = "".join(f"<process_info><gpu_instance_id>N/A</gpu_instance_id><compute_instance_id>N/A"
                    f"</compute_instance_id><pid>{pid}</pid><type>C</type><process_name>python3</process_name>"
                    f"<used_memory>{mib} MiB</used_memory></process_info>" for pid, mib in pids_mib.items())
    xml = xml.replace("<processes>\n\t\t</processes>", f"<processes>{procs}</processes>", 1)
    used = sum(pids_mib.values())
    return re.sub(r"(<fb_memory_usage>.*?<used>)0 MiB", rf"\g<1>{used} MiB", xml, count=1, flags=re.S)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def gpu_root(tmp_path):
    """A tree whose dev/nvidia0 is a real character node (1:3, /dev/null's numbers: it opens) — what a process
    holding the GPU has open."""
    needs.root()  # mknod
    (tmp_path / "dev").mkdir()
    os.mknod(tmp_path / "dev" / "nvidia0", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    os.chmod(tmp_path / "dev" / "nvidia0", 0o666)
    return tmp_path


class Proc:
    """A process that is not our child (double fork, its own session), as a stranger's job or a server left by an
    earlier campaign is: gpudoctor treats its own descendants as its probes."""

    def __init__(self, argv, env):
        launcher = ("import os, sys\n"
                    "if os.fork() == 0:\n"
                    "    os.setsid(); os.execvpe(sys.argv[1], sys.argv[1:], os.environ)\n")
        p = subprocess.Popen([sys.executable, "-c", launcher, *argv], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, **(env or {})})
        self.out = p.stdout
        line = self.out.readline().split()
        p.wait()
        assert line and line[0] == "ready", line
        self.pid = int(line[1])

    def poll(self):
        try:
            st = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return 0
        return 0 if st in ("Z", "X") else None

    def wait(self, timeout):
        end = time.monotonic() + timeout
        while self.poll() is None:
            assert time.monotonic() < end, f"pid {self.pid} still running"
            time.sleep(0.05)

    def kill(self):
        if self.poll() is None:
            os.kill(self.pid, 9)


@pytest.fixture
def spawn():
    procs = []

    def start(argv, env=None):
        procs.append(Proc(argv, env))
        return procs[-1]

    yield start
    for p in procs:
        p.kill()


def _dead_owner() -> str:
    """The owner token of a campaign process that has ended (a real process, reaped)."""
    p = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdout.write(sys.stdin.readline())"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    token = owner_token(p.pid)
    p.communicate("x\n")
    return token


def _facts(root, xml, port):
    ctx = GatherContext(name="t", policy={"checks": {"workload.port.serving": {"port": port}}})
    facts = gather(LocalHost(root=str(root)), ctx, only={"procs"})
    facts["driver"] = {"rc": 0, **parse_nvidia_smi_xml(xml)}
    return facts


def _stranger(spawn, gpu_root):
    """The stranger runs as nobody (it opens the node, then drops to uid 65534; gpu_root needs root), so its user
    differs from ours."""
    import pwd

    node = str(gpu_root / "dev" / "nvidia0")
    return spawn([sys.executable, "-c", HOLD, node, "-", "65534"]), pwd.getpwuid(65534).pw_name


def test_a_strangers_20_gib_is_named_gated_and_never_touched(gpu_root, spawn):
    stranger, user = _stranger(spawn, gpu_root)
    port = _free_port()
    facts = _facts(gpu_root, _xml_with({stranger.pid: 20480}), port)
    d = diagnose(facts)
    f = d.by_key()[f"workload.gpu.processes[pid {stranger.pid}]"]
    assert f.status.value == "info"
    assert f.summary.startswith(f"pid {stranger.pid} ({user}) holds 20.0 GiB on GPU 0: ")
    assert "-c" in f.summary and f.data["user"] == user and f.data["used_mib"] == 20480
    assert f"/proc/{stranger.pid}/fd: /dev/nvidia0" in f.evidence and f.data["bench"] is None
    mem = d.by_key()["workload.gpu.foreign_memory[GPU 0 (00000000:00:06.0)]"]
    assert mem.status.value == "info" and mem.data["foreign_mib"] == 20480 and mem.data["pids"] == [stranger.pid]
    assert {f.status.value for f in d.findings if f.layer == "workload"} <= {"ok", "info"}  # not a fault in check
    # the benchmark gate blocks on it; the serve gate does not care
    g = evaluate(d, resolve_profile("benchmark"))
    b = next(b for b in g.blockers if b.key == mem.key)
    assert b.status == "fail" and "20.0 GiB held by pid" in b.summary and "allows 1024 MiB" in b.summary
    assert not [b for b in evaluate(d, resolve_profile("serve")).blockers if b.key.startswith("workload.gpu")]
    # the cleanup remedy refuses it, by name, and the process lives on
    r = StopOrphanServers()
    assert r.plan(facts, RemedyContext()) is None
    assert f"pid {stranger.pid} ({user})" in r.refusal and "not a server gpudoctor's bench started" in r.refusal
    time.sleep(0.2)
    assert stranger.poll() is None


def test_an_orphaned_bench_server_is_found_and_only_it_is_stopped(gpu_root, spawn):
    node = str(gpu_root / "dev" / "nvidia0")
    stranger, _ = _stranger(spawn, gpu_root)
    port = _free_port()
    owner = _dead_owner()
    env = {"GPUDOCTOR_BENCH_RUN": "/tmp/campaign-x", "GPUDOCTOR_BENCH_LABEL": "tp1-fa3", "GPUDOCTOR_BENCH_OWNER": owner}
    orphan = spawn([sys.executable, "-c", HOLD, node, str(port)], env=env)
    facts = _facts(gpu_root, _xml_with({stranger.pid: 20480, orphan.pid: 30720}), port)
    d = diagnose(facts)
    o = d.by_key()[f"workload.bench.orphan[pid {orphan.pid}]"]
    assert o.status.value == "warn" and "left running by a campaign that is gone" in o.summary
    assert "30.0 GiB" in o.summary and o.remedy == "workload.bench.orphan" and o.data["owner"] == owner
    pf = d.by_key()[f"workload.port.serving[port {port}]"]
    assert pf.data["in_use_by_other"] and pf.data["pids"] == [orphan.pid] and "gpudoctor bench server" in pf.evidence[0]
    g = evaluate(d, resolve_profile("benchmark"))
    assert {b.key for b in g.blockers} >= {pf.key, "workload.gpu.foreign_memory[GPU 0 (00000000:00:06.0)]"}
    assert not [f for f in d.findings if f.id == "workload.bench.orphan" and f.subject == f"pid {stranger.pid}"]

    r = StopOrphanServers()
    change = r.plan(facts, RemedyContext())
    assert [s["pid"] for s in change.data["servers"]] == [orphan.pid]
    assert f"left alone, not ours: {stranger.pid}" in change.diff
    host = LocalHost()
    applied = r.apply(host, change, RemedyContext())
    assert applied["changed"] and applied["result"][str(orphan.pid)]["stopped"]
    assert applied["result"][str(orphan.pid)]["why"] == "SIGTERM" and applied["result"][str(orphan.pid)]["group"]
    orphan.wait(timeout=5)
    assert r.verify(host, change, RemedyContext()).status.value == "ok"
    assert stranger.poll() is None  # never a stranger's process


def test_a_server_whose_campaign_runs_is_not_an_orphan_and_a_changed_marker_is_refused(gpu_root, spawn):
    node = str(gpu_root / "dev" / "nvidia0")
    port = _free_port()
    live = spawn([sys.executable, "-c", HOLD, node], env=server_env("/tmp/run-y", "cfg-a"))  # owner: this process
    facts = _facts(gpu_root, _xml_with({live.pid: 1024}), port)
    f = diagnose(facts).by_key()[f"workload.bench.orphan[pid {live.pid}]"]
    assert f.status.value == "info" and "its campaign is still running" in f.summary
    assert parse_owner(f.data["owner"])[1] == os.getpid()
    r = StopOrphanServers()
    assert r.plan(facts, RemedyContext()) is None and r.refusal is None
    # a plan made for a dead owner is re-checked on the target: this process's marker names a live owner
    change = r.plan({**facts}, RemedyContext()) or None
    assert change is None
    from gpudoctor.remedy import Change

    forged = Change("workload.bench.orphan", "t", "x", data={"servers": [{"pid": live.pid, "start": f.data["start"],
                                                                          "owner": _dead_owner()}], "stop_s": 1})
    res = r.apply(LocalHost(), forged, RemedyContext())
    assert not res["changed"] and "no longer carries the campaign's marker" in res["result"][str(live.pid)]["why"]
    gone = Change("workload.bench.orphan", "t", "x", data={"servers": [{"pid": live.pid, "start": f.data["start"] + 1,
                                                                        "owner": f.data["owner"]}], "stop_s": 1})
    assert r.apply(LocalHost(), gone, RemedyContext())["result"][str(live.pid)]["gone"]  # a reused PID is not ours
    assert live.poll() is None


def test_the_runner_marks_every_server_it_starts():
    src = (Path(__file__).parents[2] / "gpudoctor" / "campaign" / "runner.py").read_text()
    assert "server_env(" in src
    env = server_env("/r", "l")
    assert set(env) == {"GPUDOCTOR_BENCH_RUN", "GPUDOCTOR_BENCH_LABEL", "GPUDOCTOR_BENCH_OWNER"}
    host, pid, start = parse_owner(env["GPUDOCTOR_BENCH_OWNER"])
    assert host == socket.gethostname() and pid == os.getpid() and start > 0


def test_over_ssh_the_same_scan_names_the_holder_and_leaves_the_agents_probes_out(gpu_root, spawn, sshd):
    """A real sshd on loopback: the scan runs through the probe agent; the process holding the node is found, the
    agent's own children (the scan itself, other probes) are not."""
    stranger, user = _stranger(spawn, gpu_root)
    host = sshd.make_host(root=str(gpu_root))
    try:
        facts = gather(host, GatherContext(name="ssh"), only={"procs"})
    finally:
        host.close()
    holders = facts["procs"]["holders"]
    assert set(holders) == {str(stranger.pid)}  # only it holds a node under this test's root
    assert holders[str(stranger.pid)]["nodes"] == ["/dev/nvidia0"] and holders[str(stranger.pid)]["user"] == user
