#!/usr/bin/env python3
"""Fleet scale: how the fleet engine's wall time grows with the number of hosts, measured in one run.

1. SSH: N inventory entries (default 64) that are all aliases of one real sshd on 127.0.0.1, checked at
   --parallel 32, against one host checked alone. Target: N hosts <= 5x one host.
   Also printed: the remote commands one check starts (each costs a login shell on the target), the CPU of one
   command through a login shell and through the probe agent, and the CPU per host on each side. All "hosts" are
   this machine, so their probes share its cores: the CPU line gives the floor no engine can beat here.
   Run twice, both printed: without a shell rc (the sshd sets SHLVL=1, so bash skips ~/.bashrc: gpudoctor's own
   cost), and with a slow one (BASH_ENV: ~0.3 s of CPU per login shell, like pyenv/conda init; issue #17). For each:
   the wall time, every host's status, the login shells the target started (one per host: no fallback storm) and
   the processes of the run still on the target 5 s after it ended. --skip-shell-rc: only the first.
2. Simulated: 1,000 hosts through the snapshot/replay backend (the H200 captures in tests/fixtures/snapshots,
   re-gathered and diagnosed per host). Target: < 10 s.

    python bench/fleet_scale.py [--hosts 64] [--parallel 32] [--simulated 1000] [--skip-ssh] [--skip-shell-rc]
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))  # tests.*; gpudoctor itself: the installed package

from gpudoctor.fleet import check_fleet  # noqa: E402


def simulated(n: int, parallel: int) -> None:
    from gpudoctor.diagnose import diagnose
    from gpudoctor.snapshot import load
    from gpudoctor.target import snapshot_facts

    docs = [load(str(p)) for p in sorted((ROOT / "tests" / "fixtures" / "snapshots").glob("*.json"))]
    names = [f"sim{i:04d}" for i in range(n)]

    def check(name: str):
        return diagnose(snapshot_facts(docs[int(name[3:]) % len(docs)]))

    t = time.perf_counter()
    check(names[0])
    one = time.perf_counter() - t
    res = check_fleet(None, names, parallel=parallel, check_fn=check)
    counts = ", ".join(f"{v} {k}" for k, v in res.counts().items() if v)
    print(f"simulated: {n} hosts (snapshot replay) at parallel {parallel}: {res.wall_s:.2f} s "
          f"({res.wall_s / n * 1000:.2f} ms/host; one host alone {one * 1000:.1f} ms) -> {counts}")
    print(f"simulated: target < 10 s: {'met' if res.wall_s < 10 else 'NOT met'}")


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


SFTP_SERVER = "/usr/lib/openssh/sftp-server"  # Debian's default Subsystem: a real sshd serves SFTP


SLOW_RC = 'i=0; while [ $i -lt 120000 ]; do i=$((i+1)); done\n'  # ~0.3 s of CPU in bash (2-core dev VM)


def start_sshd(tmp: Path, slow_rc: bool = False, marker: str = ""):
    """A throwaway sshd on 127.0.0.1 for the current user, key auth only. Returns (proc, port, key, known_hosts).

    Configured like a stock server (an SFTP subsystem), with SetEnv SHLVL=1 so bash does not source this machine's
    ~/.bashrc for ssh commands; slow_rc: SetEnv BASH_ENV to a file that burns ~0.3 s of CPU, which bash runs for
    every `bash -c` (every login shell sshd starts). `marker` goes into every session's environment, so the run's
    processes on the target can be counted (and nothing else)."""
    sshd = shutil.which("sshd") or "/usr/sbin/sshd"
    for kind in ("host", "user"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp / f"{kind}_key")], check=True)
    (tmp / "authorized_keys").write_text((tmp / "user_key.pub").read_text())
    os.chmod(tmp / "authorized_keys", 0o600)
    port = free_port()
    cfg = tmp / "sshd_config"
    cfg.write_text(f"Port {port}\nListenAddress 127.0.0.1\nHostKey {tmp / 'host_key'}\nPidFile {tmp / 'sshd.pid'}\n"
                   f"AuthorizedKeysFile {tmp / 'authorized_keys'}\nPasswordAuthentication no\n"
                   "KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\nUsePAM no\nStrictModes no\n"
                   "MaxStartups 200:30:400\nMaxSessions 200\nLogLevel VERBOSE\n"
                   f"Subsystem sftp {SFTP_SERVER if os.path.exists(SFTP_SERVER) else 'internal-sftp'}\n"
                   f"SetEnv SHLVL=1 GPUDOCTOR_BENCH_TARGET={marker or 'none'}"
                   + (f" BASH_ENV={tmp / 'slow_rc.sh'}" if slow_rc else "") + "\n")
    (tmp / "slow_rc.sh").write_text(SLOW_RC)
    Path("/run/sshd").mkdir(exist_ok=True)
    proc = subprocess.Popen([sshd, "-D", "-E", str(tmp / "sshd.log"), "-f", str(cfg)], stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    host_pub = (tmp / "host_key.pub").read_text().split()
    known = tmp / "known_hosts"
    known.write_text(f"[127.0.0.1]:{port} {host_pub[0]} {host_pub[1]}\n")
    return proc, port, tmp / "user_key", known


def target_processes(marker: str) -> int:
    """Processes whose environment holds this run's marker: what the run has on the target right now."""
    needle = f"GPUDOCTOR_BENCH_TARGET={marker}".encode()
    n = 0
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                n += needle in (d / "environ").read_bytes().split(b"\0")
            except OSError:
                pass
    return n


def ssh(n: int, parallel: int, slow_rc: bool = False) -> None:
    try:
        from gpudoctor.target import open_target  # noqa: F401
        from gpudoctor.inventory import load_inventory
    except ImportError as exc:
        print(f"ssh: skipped: this build has no SSH backend/inventory yet ({exc})")
        return
    import getpass

    from gpudoctor.fleet import default_check_fn

    import uuid

    tmp = Path(tempfile.mkdtemp(prefix="gpudoctor-fleet-"))
    marker = uuid.uuid4().hex[:12]
    proc, port, key, known = start_sshd(tmp, slow_rc, marker)
    tag = "ssh (slow rc)" if slow_rc else "ssh (no rc)"
    log = tmp / "sshd.log"
    try:
        inv_path = tmp / "inventory.yaml"
        lines = ["hosts:"]
        for i in range(n):
            lines += [f"  ct{i:03d}:", "    address: 127.0.0.1", f"    port: {port}", f"    user: {getpass.getuser()}",
                      f"    identity_file: {key}", f"    known_hosts: {known}",
                      # the interpreter itself, not a pyenv shim (a shell script that costs ~0.2 s per start)
                      f"    python: {os.path.realpath(sys.executable)}"]
        inv_path.write_text("\n".join(lines) + "\n")
        inv = load_inventory(str(inv_path))
        check = default_check_fn(inv)
        names = [f"ct{i:03d}" for i in range(n)]
        rc_note = ("a slow rc: ~0.3 s of CPU per login shell (BASH_ENV), like pyenv/conda init" if slow_rc
                   else "none (SetEnv SHLVL=1: bash skips ~/.bashrc)")
        print(f"{tag}: the target's shell startup: {rc_note}")
        shell_ms, agent_ms = _command_costs(port, key, known)
        print(f"{tag}: CPU of one command on the target: {shell_ms:.1f} ms through a login shell, {agent_ms:.1f} ms "
              f"through the probe agent (which costs one login shell per connection)")
        check(names[0])  # warm the page cache and imports once, as a second run would
        time.sleep(0.5)
        cmds0, me0, srv0 = _sessions(log), _cpu_self(), _cpu_sshd(proc.pid)
        t = time.perf_counter()
        one = check(names[0])
        single = time.perf_counter() - t
        time.sleep(0.5)  # the connection's sshd exits and is reaped: its CPU counts
        cmds_one, me_one, srv_one = _sessions(log) - cmds0, _cpu_self() - me0, _cpu_sshd(proc.pid) - srv0
        me0, srv0 = _cpu_self(), _cpu_sshd(proc.pid)
        cmds_all0 = _sessions(log)
        res = check_fleet(inv, names, parallel=parallel, check_fn=check, host_timeout=300)
        time.sleep(5.0)
        left = target_processes(marker)
        shells = _sessions(log) - cmds_all0
        me_all, srv_all = _cpu_self() - me0, _cpu_sshd(proc.pid) - srv0
        counts = ", ".join(f"{v} {k}" for k, v in res.counts().items() if v)
        ratio = res.wall_s / single
        print(f"{tag}: one host alone: {single:.2f} s (verdict {one.verdict.value}); remote commands it started "
              f"(each a login shell there): {cmds_one}")
        print(f"{tag}: {n} hosts via one sshd on 127.0.0.1 at parallel {parallel}: {res.wall_s:.2f} s -> {counts}; "
              f"slowest host {max(r.duration_s for r in res.records):.2f} s")
        unanswered = [r for r in res.records if r.status in ("unknown", "unreachable", "error") and not r.error
                      and r.root_cause is None]
        print(f"{tag}: login shells the target started for the {n}: {shells} ({shells / n:.1f} per host; a fallback "
              f"storm would be one per operation); hosts without an answer or a reason: {len(unanswered)}; "
              f"processes of the run left on the target 5 s after it: {left}")
        print(f"{tag}: ratio {ratio:.2f}x one host (target <= 5x): {'met' if ratio <= 5 else 'NOT met'}")
        cores = os.cpu_count() or 1
        cpu_all = me_all + srv_all
        print(f"{tag}: CPU per host, average of the {n}: gpudoctor (paramiko, gather, diagnose) {me_all / n * 1000:.0f} ms, "
              f"the target side (sshd, login shell, agent, probes) {srv_all / n * 1000:.0f} ms "
              f"(one host alone: {me_one * 1000:.0f} + {srv_one * 1000:.0f} ms, 10 ms ticks)")
        print(f"{tag}: all {n} hosts' work runs on this machine's {cores} cores: >= {cpu_all / cores:.2f} s "
              f"= {cpu_all / cores / single:.1f}x one host whatever the engine does (used {cpu_all / res.wall_s:.2f} "
              f"cores on average)")
    finally:
        proc.terminate()
        proc.wait(10)


def _command_costs(port: int, key: Path, known: Path, n: int = 20) -> tuple[float, float]:
    """Target-side CPU (ms) of one `true`: through a login shell (agent off), and through the probe agent.

    A connection's own CPU (sshd, the agent's start) reaches the sshd's account when it closes: measure a
    connection with no command and one with n, and divide the difference."""
    import getpass

    from gpudoctor.host.ssh import SSHHost

    pid = int((key.parent / "sshd.pid").read_text())

    def session(agent: bool, commands: int) -> float:
        h = SSHHost(name="cost", address="127.0.0.1", port=port, user=getpass.getuser(), identity_files=[str(key)],
                    known_hosts=str(known), ssh_config="", allow_agent=False, agent=agent,
                    python=[os.path.realpath(sys.executable)])
        t0 = _cpu_sshd(pid)
        h.read_file("/proc/sys/kernel/ostype")  # connected (and the agent started, where it runs)
        for _ in range(commands):
            h.run(["true"])
        h.close()
        time.sleep(0.3)
        return _cpu_sshd(pid) - t0

    out = []
    for agent in (False, True):
        session(agent, 1)  # warm
        out.append((session(agent, n) - session(agent, 0)) / n * 1000)
    return out[0], out[1]


def _sessions(log: Path) -> int:
    """Commands the sshd started (LogLevel VERBOSE: one line per exec request)."""
    try:
        return log.read_text(errors="replace").count("Starting session: command")
    except OSError:
        return 0


def _cpu_self() -> float:
    me = os.times()
    return me.user + me.system


def _cpu_sshd(sshd_pid: int) -> float:
    """CPU seconds of the sshd and every session/probe it ran (reaped children count)."""
    import psutil

    t = psutil.Process(sshd_pid).cpu_times()
    return t.user + t.system + t.children_user + t.children_system


def _count(least: int):
    """An argparse type: an integer >= least, else a one-line usage error (never a traceback)."""
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if n < least:
            raise argparse.ArgumentTypeError(f"{n} is below the minimum {least}")
        return n
    return parse


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=_count(1), default=64, help="real SSH hosts (loopback sshd) to check (default 64)")
    ap.add_argument("--parallel", type=_count(1), default=32, help="hosts checked at once (default 32)")
    ap.add_argument("--simulated", type=_count(0), default=1000,
                    help="snapshot-replay hosts for the simulated part (default 1000; 0 skips it)")
    ap.add_argument("--skip-ssh", action="store_true", help="skip the real-SSH part")
    ap.add_argument("--skip-shell-rc", action="store_true",
                    help="only the run without a shell rc (skip the slow-rc run: ~0.3 s of CPU per login shell)")
    args = ap.parse_args()
    print(f"machine: {os.cpu_count()} CPUs, python {sys.version.split()[0]}, load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())} (other work on the machine skews every number)")
    if args.simulated:
        simulated(args.simulated, args.parallel)  # first: the SSH part leaves sshd sessions winding down
    else:
        print("simulated: skipped (--simulated 0)")
    if not args.skip_ssh:
        ssh(args.hosts, args.parallel, slow_rc=False)
        if not args.skip_shell_rc:
            ssh(args.hosts, args.parallel, slow_rc=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
