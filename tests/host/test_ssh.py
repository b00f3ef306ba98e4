"""SSHHost beyond the shared contract: host keys, deadlines, connection reuse, ~/.ssh/config, ssh-agent, faults."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
import time

import pytest

from gpudoctor.errors import HostKeyError, HostUnreachable
from gpudoctor.host.ssh import SSHHost, fingerprint
from tests.sshd import keygen, pub_key_fields


# --- host keys -------------------------------------------------------------------------------------

def test_unknown_host_key_is_refused_and_nothing_runs(sshd, tmp_path):
    kh = tmp_path / "known_hosts"
    kh.write_text("")
    marker = tmp_path / "marker"
    host = sshd.make_host(known_hosts=str(kh))
    with pytest.raises(HostKeyError) as e:
        host.run(["touch", str(marker)])
    msg = str(e.value)
    kind, _ = pub_key_fields(sshd.host_key.with_suffix(".pub"))
    assert f"unknown SSH host key for [127.0.0.1]:{sshd.port}" in msg
    assert kind in msg and "SHA256:" in msg and str(kh) in msg
    assert "ssh-keyscan" in msg and "accept-new" in msg
    assert not marker.exists()
    assert kh.read_text() == ""  # strict never writes


def test_missing_known_hosts_file_is_refused(sshd, tmp_path):
    kh = tmp_path / "nope" / "known_hosts"
    with pytest.raises(HostKeyError, match="does not exist"):
        sshd.make_host(known_hosts=str(kh)).run(["true"])
    assert not kh.exists()


def test_changed_host_key_is_refused_even_with_accept_new(sshd, tmp_path):
    other = keygen(tmp_path / "impostor")
    kind, b64 = pub_key_fields(other.with_suffix(".pub"))
    kh = tmp_path / "known_hosts"
    kh.write_text(f"[127.0.0.1]:{sshd.port} {kind} {b64}\n")
    marker = tmp_path / "marker"
    for policy in ("strict", "accept-new"):
        with pytest.raises(HostKeyError) as e:
            sshd.make_host(known_hosts=str(kh), host_key_policy=policy).run(["touch", str(marker)])
        assert "CHANGED" in str(e.value) and "ssh-keygen -R" in str(e.value)
    assert not marker.exists()
    assert kh.read_text() == f"[127.0.0.1]:{sshd.port} {kind} {b64}\n"


def test_accept_new_trusts_on_first_use_and_records_the_key(sshd, tmp_path):
    kh = tmp_path / "ssh" / "known_hosts"  # directory does not exist yet
    host = sshd.make_host(known_hosts=str(kh), host_key_policy="accept-new")
    assert host.run(["echo", "hi"]).stdout == "hi\n"
    host.close()
    assert kh.read_text() == sshd.known_hosts_line()
    assert oct(kh.stat().st_mode & 0o777) == "0o600"
    strict = sshd.make_host(known_hosts=str(kh))  # the recorded key now satisfies strict checking
    assert strict.run(["true"]).rc == 0
    strict.close()


def test_hashed_known_hosts_entries_are_understood(sshd, tmp_path):
    kh = tmp_path / "known_hosts"
    shutil.copy(sshd.known_hosts, kh)
    subprocess.run(["ssh-keygen", "-H", "-f", str(kh)], check=True, capture_output=True)
    assert kh.read_text().startswith("|1|")
    host = sshd.make_host(known_hosts=str(kh))
    assert host.run(["true"]).rc == 0
    host.close()


def test_fingerprint_matches_openssh(sshd):
    import paramiko

    key = paramiko.Ed25519Key.from_private_key_file(str(sshd.host_key))
    out = subprocess.run(["ssh-keygen", "-lf", str(sshd.host_key.with_suffix(".pub"))], capture_output=True,
                         text=True, check=True).stdout
    assert fingerprint(key) == out.split()[1]


# --- deadlines and unreachable hosts ----------------------------------------------------------------

def test_refused_port_is_unreachable_at_once(sshd):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        host = sshd.make_host(port=port)
        t0 = time.monotonic()
        with pytest.raises(HostUnreachable, match="refused"):
            host.run(["true"])
    assert time.monotonic() - t0 < 5.0  # no connect deadline involved: refused at once (generous for loaded CI)


def test_silent_server_hits_the_connect_deadline(sshd):
    with socket.socket() as s:  # accepts TCP, never says a word
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        host = sshd.make_host(port=s.getsockname()[1], connect_timeout=0.5)
        t0 = time.monotonic()
        with pytest.raises(HostUnreachable) as e:
            host.run(["true"])
        elapsed = time.monotonic() - t0
    assert 0.4 <= elapsed < 10.0, elapsed
    assert isinstance(e.value.__cause__, Exception)  # translated with `raise ... from exc`


def test_unknown_host_name_is_unreachable_not_a_traceback(sshd):
    host = sshd.make_host(address="no-such-host.invalid")
    with pytest.raises(HostUnreachable, match="cannot resolve"):
        host.run(["true"])


def test_wrong_user_key_is_an_authentication_failure(sshd, tmp_path):
    stranger = keygen(tmp_path / "stranger")
    with pytest.raises(HostUnreachable, match="authentication failed"):
        sshd.make_host(identity_files=[str(stranger)]).run(["true"])


def test_missing_identity_file_is_named(sshd, tmp_path):
    with pytest.raises(HostUnreachable, match="identity file .*does not exist"):
        sshd.make_host(identity_files=[str(tmp_path / "nope")]).run(["true"])
    with pytest.raises(HostUnreachable, match="identity file .* is a directory, not a key file"):  # not Errno 21
        sshd.make_host(identity_files=[str(tmp_path)]).run(["true"])


def test_a_host_stuck_in_a_command_does_not_block_other_commands(ssh_host):
    results = {}
    started = threading.Event()

    def slow():
        started.set()
        results["slow"] = ssh_host.run(["sleep", "30"], timeout=4)

    t = threading.Thread(target=slow)
    t.start()
    started.wait()
    time.sleep(0.3)
    fast = ssh_host.run(["echo", "quick"])
    assert fast.stdout == "quick\n"
    assert t.is_alive() and "slow" not in results  # answered while the other command still ran
    t.join()
    assert results["slow"].timed_out


# --- one connection, many threads --------------------------------------------------------------------

def test_many_threads_share_one_connection_and_close_cleanly(sshd):
    host = sshd.make_host(max_sessions=8)
    before = threading.active_count()
    errors, outputs = [], {}

    def worker(i):
        try:
            for j in range(6):
                r = host.run(["echo", f"{i}-{j}"])
                outputs[(i, j)] = r.stdout
                assert host.read_file("/proc/sys/kernel/ostype").data == b"Linux\n"
        except Exception as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(24)]  # 24 > sshd's MaxSessions (10)
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert outputs == {(i, j): f"{i}-{j}\n" for i in range(24) for j in range(6)}
    assert host.connections_made == 1
    host.close()
    assert not host.connected
    deadline = time.monotonic() + 2
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert threading.active_count() <= before  # paramiko's transport thread is gone


def test_a_dropped_connection_is_rebuilt_on_next_use(sshd_factory):
    server = sshd_factory.start_extra()
    host = server.make_host()
    assert host.run(["true"]).rc == 0
    assert server.cut_connections() >= 1
    deadline = time.monotonic() + 3
    while host.connected and time.monotonic() < deadline:
        time.sleep(0.02)
    assert host.run(["echo", "again"]).stdout == "again\n"
    assert host.connections_made == 2
    host.close()


def test_a_connection_cut_mid_command_raises_unreachable(sshd_factory):
    server = sshd_factory.start_extra()
    host = server.make_host()
    host.run(["true"])
    threading.Timer(0.3, server.cut_connections).start()
    t0 = time.monotonic()
    with pytest.raises(HostUnreachable, match="connection lost"):
        host.run(["sleep", "10"], timeout=8)
    assert time.monotonic() - t0 < 7  # well before the command's 8 s deadline
    host.close()


def test_a_cut_at_any_byte_is_unreachable_or_the_whole_answer(sshd, tmp_path, cut_proxy):
    """Cut the connection after N bytes for N across connect, key exchange, auth and the command: every run
    either raises HostUnreachable quickly or returns the complete answer; none hangs or returns half."""
    outcomes = {"unreachable": 0, "answer": 0}
    for cut_after in [*range(1, 5400, 83), None]:
        proxy = cut_proxy(cut_after)
        kh = sshd.write_known_hosts(tmp_path / "kh", port=proxy.port)
        host = sshd.make_host(port=proxy.port, known_hosts=str(kh), connect_timeout=2.0)
        t0 = time.monotonic()
        try:
            r = host.run(["echo", "whole answer"], timeout=3)
            assert (r.rc, r.stdout) == (0, "whole answer\n"), cut_after
            outcomes["answer"] += 1
        except HostUnreachable:
            assert proxy.cuts == 1, cut_after
            outcomes["unreachable"] += 1
        finally:
            host.close()
        assert time.monotonic() - t0 < 8, cut_after  # never hangs to the 3 s command deadline and beyond
    assert outcomes["unreachable"] >= 50 and outcomes["answer"] >= 1, outcomes


# --- ~/.ssh/config, ssh-agent, ProxyCommand --------------------------------------------------------

def test_ssh_config_alias_supplies_hostname_port_user_and_identity(sshd, tmp_path):
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Host kpro6-test\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User {sshd.user}\n"
                   f"  IdentityFile {sshd.client_key}\n  UserKnownHostsFile {sshd.known_hosts}\n")
    host = SSHHost(name="kpro6", address="kpro6-test", ssh_config=str(cfg), allow_agent=False, look_for_keys=False,
                   connect_timeout=5)
    assert host.run(["echo", "via config"]).stdout == "via config\n"
    r = host.resolve()
    assert (r.hostname, r.port, r.user, r.known_hosts) == ("127.0.0.1", sshd.port, sshd.user, str(sshd.known_hosts))
    host.close()


def test_explicit_settings_win_over_ssh_config(sshd, tmp_path):
    cfg = tmp_path / "ssh_config"
    cfg.write_text("Host *\n  Port 1\n  User nobody-here\n")
    host = sshd.make_host(ssh_config=str(cfg))
    assert host.run(["true"]).rc == 0
    host.close()


def test_ssh_agent_supplies_the_key(sshd, tmp_path):
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL)
    try:
        for _ in range(200):
            if sock.exists():
                break
            time.sleep(0.01)
        env = dict(os.environ, SSH_AUTH_SOCK=str(sock))
        subprocess.run(["ssh-add", str(sshd.client_key)], env=env, check=True, capture_output=True)
        old = os.environ.get("SSH_AUTH_SOCK")
        os.environ["SSH_AUTH_SOCK"] = str(sock)
        try:
            host = sshd.make_host(identity_files=[], allow_agent=True, look_for_keys=False)
            assert host.run(["echo", "agent"]).stdout == "agent\n"
            host.close()
        finally:
            if old is None:
                del os.environ["SSH_AUTH_SOCK"]
            else:
                os.environ["SSH_AUTH_SOCK"] = old
    finally:
        agent.terminate()
        agent.wait(5)


def test_proxy_command_from_ssh_config(sshd, tmp_path):
    relay = tmp_path / "relay.py"
    relay.write_text(
        "import socket,sys,threading\n"
        "s=socket.create_connection(('127.0.0.1',int(sys.argv[1])))\n"
        "def up():\n"
        "    while True:\n"
        "        d=sys.stdin.buffer.read1(65536)\n"
        "        if not d: break\n"
        "        s.sendall(d)\n"
        "threading.Thread(target=up,daemon=True).start()\n"
        "while True:\n"
        "    d=s.recv(65536)\n"
        "    if not d: break\n"
        "    sys.stdout.buffer.write(d); sys.stdout.buffer.flush()\n")
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Host behind-jump\n  HostName 127.0.0.1\n  Port {sshd.port}\n"
                   f"  ProxyCommand {shutil.which('python3')} {relay} %p\n")
    host = sshd.make_host(address="behind-jump", port=None, ssh_config=str(cfg), connect_timeout=20)
    assert host.run(["echo", "proxied"]).stdout == "proxied\n"
    host.close()


def test_file_operations_need_no_sftp(sshd, sshd_nosftp, tmp_path):
    (tmp_path / "f").write_bytes(b"host/ops.py")
    for server in (sshd, sshd_nosftp):
        for agent in (True, False):  # in the agent, and one-shot
            host = server.make_host(agent=agent)
            assert host.read_file(str(tmp_path / "f")).data == b"host/ops.py"
            host.write_file(str(tmp_path / "g"), b"written", exclusive=False)
            assert (tmp_path / "g").read_bytes() == b"written"
            host.close()


# --- fake root ----------------------------------------------------------------------------------------

def test_fake_root_maps_file_operations_and_path(ssh_fake_root):
    fake = ssh_fake_root
    fake.write("/etc/pve/lxc/200.conf", "arch: amd64\n")
    fake.write("/proc/devices", "Character devices:\n195 nvidia\n511 nvidia-uvm\n")
    fake.tool("pct", "#!/bin/sh\necho \"pct $*\"\n")
    h = fake.host
    assert h.read_file("/etc/pve/lxc/200.conf").data == b"arch: amd64\n"
    assert b"511 nvidia-uvm" in h.read_file("/proc/devices").data
    assert h.listdir("/etc/pve/lxc") == ["200.conf"]
    st = h.stat("/etc/pve/lxc/200.conf")
    assert (st.path, st.kind) == ("/etc/pve/lxc/200.conf", "file")
    assert h.try_open_many(["/etc/pve/lxc/200.conf"]) == {"/etc/pve/lxc/200.conf": "OK"}
    h.write_file("/etc/pve/lxc/.200.conf.tmp", b"arch: amd64\nlock: backup\n")
    h.rename("/etc/pve/lxc/.200.conf.tmp", "/etc/pve/lxc/200.conf")
    assert fake.path("/etc/pve/lxc/200.conf").read_text() == "arch: amd64\nlock: backup\n"
    assert h.run(["pct", "list"]).stdout == "pct list\n"


@pytest.mark.parametrize("how", ["sftp", "python"])
def test_write_then_rename_cut_at_any_byte_leaves_old_or_new(sshd, tmp_path, cut_proxy, how):
    """The safe-edit pattern (write a temp name, rename over the target) with the connection cut after N bytes,
    N swept over the whole exchange: the target is always the old or the new file, never a mix, and a retry on
    a fresh connection finishes the job. "python" is gpudoctor.files.edit's call (mode + exclusive: python program
    fed on stdin), "sftp" the plain write."""
    old, new = b"arch: amd64\n" * 50, b"arch: amd64\nlxc.cgroup2.devices.allow: c 511:* rwm\n" * 40
    kw = {"mode": 0o640, "exclusive": True} if how == "python" else {}

    def attempt(port: int, target) -> None:
        kh = sshd.write_known_hosts(tmp_path / f"kh{port}", port=port)
        host = sshd.make_host(port=port, known_hosts=str(kh), connect_timeout=3.0)
        try:
            tmp = str(target) + ".tmp"
            deadline = time.monotonic() + 10
            while True:
                if os.path.exists(tmp):
                    host.unlink(tmp)  # a stale temp of a cut run, as gpudoctor.files.edit removes it
                try:
                    host.write_file(tmp, new, **kw)
                    break
                except FileExistsError:  # the cut run's remote process is still finishing: it may outlive the cut
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
            host.rename(tmp, str(target))
        finally:
            host.close()

    probe = cut_proxy(None)
    (tmp_path / "probe.conf").write_bytes(old)
    attempt(probe.port, tmp_path / "probe.conf")
    time.sleep(0.1)
    total = probe.forwarded
    assert (tmp_path / "probe.conf").read_bytes() == new
    seen = {"old": 0, "new": 0}
    for i, cut in enumerate(range(1, total, max(1, total // 52))):
        target = tmp_path / f"run{i}.conf"
        target.write_bytes(old)
        try:
            attempt(cut_proxy(cut).port, target)
        except (HostUnreachable, OSError):
            pass
        now = target.read_bytes()
        assert now in (old, new), f"cut after {cut} of {total} bytes left a mixed file"
        seen["new" if now == new else "old"] += 1
        if i % 4 == 0:
            attempt(sshd.port, target)  # the retry over a healthy connection
            assert target.read_bytes() == new
    assert sum(seen.values()) >= 50 and seen["old"] > 0, seen
