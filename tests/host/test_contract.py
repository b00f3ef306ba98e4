"""One contract, every backend: LocalHost (host/ops.py in process), SSHHost (a real sshd: host/ops.py in the probe
agent, and one-shot through a login shell per request, on a server with SFTP and on one without: none is needed) and
ReplayHost (a recorded transcript).

The replay backend records each operation on a RecordingHost over LocalHost, round-trips the transcript through
JSON, replays it on a fresh ReplayHost, asserts the replay equals the live answer and returns the replay.
"""

from __future__ import annotations

import json
import os
import stat
import time

import pytest

from gpudoctor.host.base import Host
from gpudoctor.host.local import LocalHost
from gpudoctor.host.replay import RecordingHost, ReplayHost
from tests import needs
from tests.procs import alive


@pytest.fixture
def tmp_path(dev_tmp_path):
    """Device nodes are made here: a directory where they open as on /dev, whatever /tmp's mount (tests/devmount.py)."""
    return dev_tmp_path


class ReplayThrough(Host):
    """Answers every operation from a replay of what a RecordingHost just recorded live."""

    def __init__(self, inner: Host):
        super().__init__(name="replay", python=list(inner.python))
        self.inner = inner

    def _replay(self, op: str, *args, **kw):
        rec = RecordingHost(inner=self.inner)
        live = getattr(rec, op)(*args, **kw)
        transcript = json.loads(json.dumps(rec.transcript))
        replayed = getattr(ReplayHost(name="replay", python=list(self.inner.python), transcript=transcript),
                           op)(*args, **kw)
        assert replayed == live, f"replay of {op}{args} differs from the live answer"
        return replayed

    def run(self, argv, timeout=None, input=None, env=None):
        return self._replay("run", argv, timeout=timeout, input=input, env=env)

    def read_file(self, path, timeout=3.0, max_bytes=4 << 20):
        return self._replay("read_file", path, timeout, max_bytes)

    def stat_many(self, paths, timeout=3.0):
        return self._replay("stat_many", paths, timeout)

    def try_open_many(self, paths, timeout=5.0, access="rw"):
        return self._replay("try_open_many", paths, timeout, access)

    def listdir(self, path, timeout=3.0):
        return self._replay("listdir", path, timeout)

    def statvfs(self, path, timeout=3.0):
        return self._replay("statvfs", path, timeout)

    def batch(self, ops, timeout=3.0):
        return self._replay("batch", ops, timeout)


def _ssh_kinds(sshd, sshd_nosftp):
    """ssh: through the probe agent; ssh-classic: one-shot, a login shell per command and per file operation;
    ssh-nosftp: the agent on a server without an SFTP subsystem."""
    return {"ssh": sshd.make_host, "ssh-classic": lambda: sshd.make_host(agent=False),
            "ssh-nosftp": lambda: sshd_nosftp.make_host()}


@pytest.fixture(params=["local", "ssh", "ssh-classic", "ssh-nosftp", "replay"])
def host(request, sshd, sshd_nosftp):
    if request.param == "local":
        h = LocalHost()
    elif request.param == "replay":
        h = ReplayThrough(LocalHost())
    else:
        h = _ssh_kinds(sshd, sshd_nosftp)[request.param]()
    yield h
    h.close()


@pytest.fixture(params=["local", "ssh", "ssh-classic", "ssh-nosftp"])
def live_host(request, sshd, sshd_nosftp):
    h = LocalHost() if request.param == "local" else _ssh_kinds(sshd, sshd_nosftp)[request.param]()
    yield h
    h.close()


T = 30.0  # deadline for file operations: the contract is about answers; loaded CI machines can be slow


def wait_dead(pid: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.02)
    return not alive(pid)


# --- run --------------------------------------------------------------------------------------------

def test_run_captures_stdout_stderr_and_rc(host):
    r = host.run(["sh", "-c", "echo out; echo err >&2"])
    assert (r.rc, r.stdout, r.stderr, r.timed_out, r.ok) == (0, "out\n", "err\n", False, True)


def test_nonzero_exit_is_a_result_not_an_exception(host):
    r = host.run(["sh", "-c", "echo nope >&2; exit 3"])
    assert (r.rc, r.stderr, r.ok) == (3, "nope\n", False)
    assert "rc 3: nope" in r.describe()


def test_command_not_found_is_127(host):
    r = host.run(["gpudoctor-no-such-command-xyz", "--version"])
    assert r.rc == 127 and not r.timed_out


def test_arguments_arrive_byte_exact(host):
    args = ["a b", "'", '"', "$(echo no)", "`echo no`", "x;y", "line1\nline2", "*", "", "-n", "é ✓"]
    r = host.run([*host.python, "-c", "import json,sys; print(json.dumps(sys.argv[1:]))", *args])
    assert r.rc == 0, r.stderr
    assert json.loads(r.stdout) == args


def test_input_and_env_reach_the_command(host):
    r = host.run(["sh", "-c", 'cat; printf "%s" "$GPUDOCTOR_T"'], input=b"from stdin\n",
                 env={"GPUDOCTOR_T": "v $(x) `y` 'z'"})
    assert r.stdout == "from stdin\nv $(x) `y` 'z'"


def test_timeout_is_a_result_within_budget_and_kills_the_process_group(host, tmp_path):
    pidfile = tmp_path / "pid"
    t0 = time.monotonic()
    r = host.run(["sh", "-c", f"sleep 30 & echo $! > {pidfile}; wait"], timeout=2.0)
    elapsed = time.monotonic() - t0
    assert r.timed_out and r.rc is None and not r.ok
    assert 1.9 <= elapsed < 2.0 + 5.0, elapsed  # the budget, plus slack for a loaded CI machine
    assert "did not answer in 2 s" in r.describe()
    child = int(pidfile.read_text())
    assert wait_dead(child, within=5.0), "the timed-out command's child survived"


# --- read_file -------------------------------------------------------------------------------------

def test_read_file_returns_bytes_exactly(host, tmp_path):
    data = bytes(range(256)) * 300  # binary, > one SFTP request
    p = tmp_path / "blob"
    p.write_bytes(data)
    r = host.read_file(str(p), timeout=T)
    assert r.ok and r.data == data and r.error is None


def test_read_file_honours_max_bytes(host, tmp_path):
    p = tmp_path / "big"
    p.write_bytes(b"x" * 100_000)
    assert host.read_file(str(p), max_bytes=70_000, timeout=T).data == b"x" * 70_000


def test_read_file_of_proc(host):
    assert host.read_file("/proc/sys/kernel/ostype", timeout=T).text == "Linux\n"


def test_read_file_errors_are_errno_names(host, tmp_path):
    assert host.read_file(str(tmp_path / "missing"), timeout=T).error == "ENOENT"
    assert host.read_file(str(tmp_path), timeout=T).error == "EISDIR"
    f = tmp_path / "f"
    f.write_text("x")
    assert host.read_file(str(f / "below-a-file"), timeout=T).error == "ENOTDIR"
    loop = tmp_path / "loop"
    loop.symlink_to("loop")
    assert host.read_file(str(loop), timeout=T).error == "ELOOP"
    assert host.read_file(str(tmp_path / "dangling-parent" / "x"), timeout=T).error == "ENOENT"


# --- stat ------------------------------------------------------------------------------------------

def test_stat_char_device_dir_file_link_and_missing(host, tmp_path, unused_major):
    needs.root()  # mknod
    node = tmp_path / "nvidia-uvm"
    os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(unused_major, 3))
    os.chmod(node, 0o666)
    f = tmp_path / "f"
    f.write_bytes(b"12345")
    link = tmp_path / "l"
    link.symlink_to("f")
    res = host.stat_many([str(node), str(tmp_path), str(f), str(link), str(tmp_path / "nope")], timeout=T)
    n = res[str(node)]
    assert (n.exists, n.kind, n.major, n.minor, n.mode) == (True, "char", unused_major, 3, 0o666)
    assert res[str(tmp_path)].kind == "dir"
    assert (res[str(f)].kind, res[str(f)].size) == ("file", 5)
    assert (res[str(link)].kind, res[str(link)].target) == ("link", "f")
    missing = res[str(tmp_path / "nope")]
    assert (missing.exists, missing.error) == (False, "ENOENT")
    assert host.stat(str(node), timeout=T).path == str(node)


# --- try_open --------------------------------------------------------------------------------------

def test_try_open_ok_enoent_enxio(host, tmp_path, unused_major):
    needs.root()  # mknod
    stale = tmp_path / "stale"
    os.mknod(stale, 0o666 | stat.S_IFCHR, os.makedev(unused_major, 0))
    res = host.try_open_many(timeout=T, paths=["/dev/null", str(tmp_path / "nope"), str(stale)])
    assert res == {"/dev/null": "OK", str(tmp_path / "nope"): "ENOENT", str(stale): "ENXIO"}


def test_try_open_read_only_opens_the_way_a_capability_consumer_does(host, tmp_path, unused_major):
    """A 0444 node (MIG monitor capability) refuses O_RDWR to a non-root user but opens read-only; the kernel decides
    (run as an ordinary user through setpriv where we are root)."""
    ro = tmp_path / "ro"
    ro.write_text("x")
    os.chmod(ro, 0o444)
    assert host.try_open_many([str(ro)], T, access="r") == {str(ro): "OK"}
    got = host.batch([("open", [str(ro)], "r"), ("open", [str(ro)])], timeout=T)
    assert got[0] == {str(ro): "OK"}
    assert got[1] == {str(ro): "OK" if os.geteuid() == 0 else "EACCES"}
    with pytest.raises(ValueError):
        host.try_open_many([str(ro)], T, access="w")
    needs.root()  # mknod
    node = tmp_path / "cap"
    os.mknod(node, 0o444 | stat.S_IFCHR, os.makedev(unused_major, 2))
    assert host.try_open_many([str(node)], T, access="r") == {str(node): "ENXIO"}  # permitted; no driver here


# --- listdir / statvfs -----------------------------------------------------------------------------

def test_listdir_sorted_and_errors(host, tmp_path):
    for n in ("b", "a", ".hidden", "c"):
        (tmp_path / n).write_text("")
    assert host.listdir(str(tmp_path), timeout=T) == [".hidden", "a", "b", "c"]
    assert host.listdir(str(tmp_path / "nope"), timeout=T) == "ENOENT"
    assert host.listdir(str(tmp_path / "a"), timeout=T) == "ENOTDIR"


def test_statvfs(host, tmp_path):
    s = host.statvfs(str(tmp_path), timeout=T)
    assert set(s) == {"total", "free", "avail", "readonly"} and s["total"] >= s["free"] >= s["avail"] >= 0 and s["total"] > 0
    assert s["readonly"] is False
    assert host.statvfs(str(tmp_path / "nope"), timeout=T) == {"error": "ENOENT"}


# --- batch ------------------------------------------------------------------------------------------

def test_batch_answers_each_operation_as_the_single_call_does(host, tmp_path, unused_major):
    needs.root()  # mknod
    (tmp_path / "f").write_bytes(b"0123456789")
    (tmp_path / "g").write_bytes(b"0123456789")  # a snapshot keeps one read per path, whatever its cap
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "b").write_text("")
    (tmp_path / "d" / "a").write_text("")
    node = tmp_path / "stale"
    os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(unused_major, 0))
    f, g, d, missing = str(tmp_path / "f"), str(tmp_path / "g"), str(tmp_path / "d"), str(tmp_path / "nope")
    ops = [("read", f), ("read", g, 4), ("read", missing), ("read", d), ("listdir", d), ("listdir", missing),
           ("stat", [f, d, str(node), missing]), ("open", ["/dev/null", str(node), missing]), ("statvfs", d),
           ("statvfs", missing)]
    got = host.batch(ops, timeout=T)
    assert got[0].data == b"0123456789" and got[1].data == b"0123"
    assert (got[2].error, got[3].error) == ("ENOENT", "EISDIR")
    assert got[4:6] == [["a", "b"], "ENOENT"]
    st = got[6]
    assert [st[p].kind for p in (f, d, str(node))] == ["file", "dir", "char"] and st[missing].error == "ENOENT"
    assert got[7] == {"/dev/null": "OK", str(node): "ENXIO", missing: "ENOENT"}
    assert got[8]["total"] > 0 and got[9] == {"error": "ENOENT"}
    single = [host.read_file(f, T), host.read_file(g, T, 4), host.read_file(missing, T), host.read_file(d, T),
              host.listdir(d, T), host.listdir(missing, T), host.stat_many([f, d, str(node), missing], T),
              host.try_open_many(["/dev/null", str(node), missing], T)]
    assert got[:8] == single
    assert host.batch([], timeout=T) == []


# --- write_file + rename (live backends: a snapshot is read-only) -------------------------------------

def test_write_temp_then_rename_replaces_the_target(live_host, tmp_path):
    target = tmp_path / "200.conf"
    target.write_text("old\n")
    tmp = tmp_path / ".200.conf.tmp"
    live_host.write_file(str(tmp), b"new\n")
    assert tmp.read_bytes() == b"new\n" and target.read_text() == "old\n"
    live_host.rename(str(tmp), str(target))
    assert target.read_bytes() == b"new\n" and not tmp.exists()


def test_write_and_rename_errors_carry_the_targets_errno(live_host, tmp_path):
    with pytest.raises(OSError) as e:
        live_host.write_file(str(tmp_path / "no-dir" / "f"), b"x")
    assert e.value.errno == 2
    with pytest.raises(OSError) as e:
        live_host.rename(str(tmp_path / "missing"), str(tmp_path / "t"))
    assert e.value.errno == 2
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "inside").write_text("")
    (tmp_path / "f").write_text("")
    with pytest.raises(OSError) as e:  # a file cannot replace a non-empty directory
        live_host.rename(str(tmp_path / "f"), str(tmp_path / "d"))
    assert e.value.errno in (21, 39)  # EISDIR (Linux rename(2) of file onto dir)
    assert (tmp_path / "f").exists()


def test_snapshot_refuses_writes():
    with pytest.raises(OSError) as e:
        ReplayHost(transcript={}).write_file("/etc/x", b"")
    assert e.value.errno == 30
