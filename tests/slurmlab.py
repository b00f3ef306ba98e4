"""The Slurm lab: Debian's real munged + slurmctld + slurmd (slurm-wlm 22.05) as root, one node, in a private network
namespace with every state, spool, log and munge file under a temp dir (docs/testing.md says what is real).

    need_lab()                      munged, slurmctld, slurmd, scontrol, ip, nsenter installed and root, else
                                    tests/needs.py's one-line skip (a failure under CI=true)
    SlurmLab(base).start() / .close()   (also a context manager); close() kills every daemon it started, deletes
                                    the namespace and checks (leftovers() is empty afterwards), also after a failure
      .run(argv, env=None)          a command inside the namespace with SLURM_CONF set (scontrol, gpudoctor, …)
      .scontrol(*args)              `scontrol ARGS` there; raises on a non-zero exit
      .show() -> str                `scontrol show node NODE`
      .state() -> str               its State= field
      .wait_state(pred, timeout)    until pred(State=) holds (the controller applies updates asynchronously)
      .reset()                      the node IDLE with no reason, no reservation, no job: each test starts there
      .write_conf(**extra)          slurm.conf with extra lines (HealthCheckProgram=…, Prolog=…); `scontrol
                                    reconfigure` makes slurmctld and slurmd read it again
      .node / .addr / .conf / .base / .log(name)

Daemons run as children of the test through `nsenter --net` (the mount namespace stays the host's: slurmd's cgroup
plugin reads /sys/fs/cgroup, which `ip netns exec` would replace by an empty sysfs). The node's address 192.0.2.1
(TEST-NET-1) is a second address on the namespace's own `lo`: slurmd resolves its NodeAddr with AI_ADDRCONFIG and
cannot bind where the only addresses are loopback ones.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from tests.procs import stop

ADDR = "192.0.2.1"
NODE = "gpu01"


def _which(name: str) -> str | None:
    return shutil.which(name) or next((p for p in (f"/usr/sbin/{name}", f"/sbin/{name}")
                                       if os.access(p, os.X_OK)), None)


def need_lab() -> None:
    """What the lab needs: one skip line each outside CI (tests/needs.py), a failure under CI=true."""
    from tests import needs

    needs.elsewhere("slurm-lab")
    for name in ("munged", "slurmctld", "slurmd", "scontrol", "ip", "nsenter"):
        needs.need(name)
    if os.geteuid() != 0:
        needs.unavailable("the Slurm lab needs root (a network namespace; munged, slurmctld, slurmd as root)")


class SlurmLab:
    def __init__(self, base: Path, node: str = NODE):
        self.base = Path(base)
        self.node = node
        self.addr = ADDR
        self.netns = f"gpd-slurm-w24-{os.getpid()}-{id(self) % 100000}"
        self.conf = self.base / "etc" / "slurm.conf"
        self.munge_sock = self.base / "munge" / "munge.socket.2"
        self.procs: dict[str, subprocess.Popen] = {}
        self._extra: dict[str, str] = {}

    # ---- life cycle -------------------------------------------------------------------------------------------
    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.close()

    def start(self) -> None:
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def _start(self) -> None:
        for d in ("etc", "munge", "state", "spool", "log", "run"):
            (self.base / d).mkdir(parents=True, exist_ok=True)
        os.chmod(self.base, 0o755)
        os.chmod(self.base / "munge", 0o700)
        subprocess.run(["ip", "netns", "add", self.netns], check=True, capture_output=True)
        self._ns(["ip", "link", "set", "lo", "up"])
        self._ns(["ip", "addr", "add", f"{ADDR}/32", "dev", "lo"])
        key = self.base / "munge" / "munge.key"
        subprocess.run([_which("mungekey"), "--create", f"--keyfile={key}", "--force"], check=True,
                       capture_output=True)
        os.chmod(key, 0o600)
        m = self.base / "munge"
        self._daemon("munged", [_which("munged"), "--foreground", "--force", f"--socket={self.munge_sock}",
                                f"--key-file={key}", f"--pid-file={m / 'munged.pid'}", f"--log-file={m / 'munged.log'}",
                                f"--seed-file={m / 'munged.seed'}"])
        self._wait(lambda: self.munge_sock.exists(), 10, "munged's socket")
        self.write_conf()
        self._daemon("slurmctld", [_which("slurmctld"), "-D", "-i", "-f", str(self.conf)])
        self._wait(lambda: self.run(["scontrol", "ping"]).returncode == 0, 20, "slurmctld answering `scontrol ping`")
        self._daemon("slurmd", [_which("slurmd"), "-D", "-N", self.node, "-f", str(self.conf)])
        self.wait_state(lambda s: s.split("+")[0] == "IDLE" and "NOT_RESPONDING" not in s, 30)

    def close(self) -> None:
        for name in ("slurmd", "slurmctld", "munged"):
            p = self.procs.pop(name, None)
            if p is None:
                continue
            stop(p, 10)
        self._kill_stragglers()
        subprocess.run(["ip", "netns", "del", self.netns], capture_output=True)
        left = self.leftovers()
        if left:
            raise RuntimeError(f"the Slurm lab left {left}")

    def _kill_stragglers(self) -> None:
        """Whatever still runs in our namespace (a job step, a health check) goes too: killed by pid."""
        res = subprocess.run(["ip", "netns", "pids", self.netns], capture_output=True, text=True)
        for pid in (int(x) for x in res.stdout.split() if x.isdigit()):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def leftovers(self) -> list[str]:
        out = []
        if Path(f"/run/netns/{self.netns}").exists():
            out.append(f"netns {self.netns}")
        out += [f"{n} pid {p.pid}" for n, p in self.procs.items() if p.poll() is None]
        return out

    # ---- helpers ----------------------------------------------------------------------------------------------
    def _in_ns(self, argv) -> list[str]:
        return ["nsenter", f"--net=/run/netns/{self.netns}", *argv]

    def _ns(self, argv, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(self._in_ns(argv), check=True, capture_output=True, **kw)

    def _daemon(self, name: str, argv) -> None:
        log = open(self.base / "log" / f"{name}.out", "wb")
        self.procs[name] = subprocess.Popen(self._in_ns(argv), stdout=log,
                                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env())
        log.close()

    def _wait(self, pred, timeout: float, what: str) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited {p.returncode}: {self.log(name)[-2000:]}")
            if pred():
                return
            time.sleep(0.1)
        raise RuntimeError(f"timed out waiting for {what}; slurmctld: {self.log('slurmctld')[-1500:]} "
                           f"slurmd: {self.log('slurmd')[-1500:]}")

    def log(self, name: str) -> str:
        for p in (self.base / "log" / f"{name}.log", self.base / "log" / f"{name}.out"):
            if p.exists():
                return p.read_text(errors="replace")
        return ""

    def env(self, extra: dict | None = None) -> dict:
        e = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
        e["SLURM_CONF"] = str(self.conf)
        e.update(extra or {})
        return e

    def write_conf(self, **extra: str) -> None:
        if extra:
            self._extra.update(extra)
        b = self.base
        lines = {
            "ClusterName": "gpdlab",
            "SlurmctldHost": f"{socket.gethostname().split('.')[0]}({ADDR})",
            "SlurmUser": "root", "SlurmdUser": "root",
            "AuthType": "auth/munge", "CredType": "cred/munge", "AuthInfo": f"socket={self.munge_sock}",
            "StateSaveLocation": str(b / "state"), "SlurmdSpoolDir": str(b / "spool"),
            "SlurmctldPidFile": str(b / "run" / "slurmctld.pid"), "SlurmdPidFile": str(b / "run" / "slurmd.pid"),
            "SlurmctldLogFile": str(b / "log" / "slurmctld.log"), "SlurmdLogFile": str(b / "log" / "slurmd.log"),
            "SlurmctldDebug": "info", "SlurmdDebug": "info",
            "ProctrackType": "proctrack/linuxproc", "TaskPlugin": "task/none",
            "JobAcctGatherType": "jobacct_gather/none", "AccountingStorageType": "accounting_storage/none",
            "SchedulerType": "sched/backfill", "SelectType": "select/cons_tres",
            "MpiDefault": "none", "ReturnToService": "1", "SlurmdTimeout": "300", "SlurmctldTimeout": "300",
            "InactiveLimit": "0", "KillWait": "2", "MinJobAge": "2", "MessageTimeout": "5",
            "RebootProgram": "/bin/true",
        }
        lines.update(self._extra)
        text = "".join(f"{k}={v}\n" for k, v in lines.items() if v is not None)
        text += f"NodeName={self.node} NodeAddr={ADDR} CPUs={os.cpu_count()} RealMemory=100 State=UNKNOWN\n"
        text += f"PartitionName=lab Nodes={self.node} Default=YES MaxTime=INFINITE State=UP\n"
        self.conf.write_text(text)
        # slurmd 22.05 loads a cgroup plugin even with proctrack/linuxproc and task/none; autodetected on a pure
        # cgroup2 host it is cgroup/v2, which wants systemd's D-Bus to place slurmstepd. cgroup/v1 named here
        # starts on either layout and, with these plugins, makes no cgroup at all.
        (self.conf.parent / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")

    # ---- the node ---------------------------------------------------------------------------------------------
    def run(self, argv, env: dict | None = None, timeout: float = 30, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(self._in_ns(argv), env=self.env(env), capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, **kw)

    def scontrol(self, *args) -> str:
        res = self.run(["scontrol", *args])
        if res.returncode != 0:
            raise RuntimeError(f"scontrol {' '.join(args)} → {res.returncode}: {res.stderr.strip()}")
        return res.stdout

    def show(self) -> str:
        return self.scontrol("show", "node", self.node)

    def state(self) -> str:
        from gpudoctor.integrations.slurm import parse_show_node

        return parse_show_node(self.show()).state or ""

    def wait_state(self, pred, timeout: float = 10) -> str:
        end = time.monotonic() + timeout
        state = ""
        while time.monotonic() < end:
            res = self.run(["scontrol", "show", "node", self.node])
            if res.returncode == 0:
                from gpudoctor.integrations.slurm import parse_show_node

                state = parse_show_node(res.stdout).state or ""
                if pred(state):
                    return state
            time.sleep(0.1)
        raise AssertionError(f"node state never matched: last {state!r}; slurmctld: "
                             f"{self.log('slurmctld')[-1500:]}")

    def reset(self) -> None:
        """Back to IDLE with no reason: reservations deleted, jobs cancelled, the node resumed."""
        for line in self.scontrol("show", "reservation").splitlines():
            if line.startswith("ReservationName="):
                self.scontrol("delete", f"reservation={line.split()[0].split('=', 1)[1]}")
        self.run(["scontrol", "cancel_reboot", self.node])
        if self.run(["squeue", "-h", "-o", "%i"]).stdout.split():
            self.run(["scancel", "-u", "root"])
            self._wait(lambda: not self.run(["squeue", "-h", "-o", "%i"]).stdout.split(), 15, "the lab's jobs to end")
        st = self.state()
        if "DOWN" in st or "DRAIN" in st or "FAIL" in st:
            self.scontrol("update", f"nodename={self.node}", "state=resume")
        self.wait_state(lambda s: s == "IDLE", 15)
        if self.keeps_reasons() and "Reason=" in self.show():
            # Slurm >= 23.11 without accounting storage keeps a resumed node's reason and scontrol cannot clear
            # it; a job allocated on the node does (node_mgr.c make_node_alloc)
            res = self.run(["srun", "-N1", "-w", self.node, "-t", "1", "true"], timeout=30)
            if res.returncode != 0:
                raise RuntimeError(f"srun on {self.node} to clear its kept reason: {res.stderr.strip()}")
            self.wait_state(lambda s: s == "IDLE", 15)

    def version(self) -> tuple[int, int]:
        """Slurm's version as (major, minor), from `scontrol --version` ("slurm 24.11.5")."""
        out = self.scontrol("--version").split()[-1]
        major, minor = out.split(".")[:2]
        return int(major), int(minor)

    def keeps_reasons(self) -> bool:
        """Does a resume keep the node's Reason? From 23.11 on, under accounting_storage/none (this lab's), the
        hook that cleared it (clusteracct_storage_g_node_up) returns first."""
        return self.version() >= (23, 11)
