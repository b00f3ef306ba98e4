"""The Slurm lab: Debian's real munged + slurmctld + slurmd as root (slurm-wlm 22.05 on Debian 12, 24.11 on Debian 13),
in private network namespaces, every state, spool, log and munge file under a temp dir (docs/testing.md says what is
real). One lab, two shapes:

    SlurmLab(base)                  one node (gpu01) at 192.0.2.1, the daemons in one namespace: the gate's tests
    SlurmLab(base, nodes=3, gpus=2) a cluster: slurmctld in its own namespace, node i (n1, n2, …) in another joined
                                    to it by a veth pair on a bridge (192.0.2.0/24: the controller 192.0.2.1, node i
                                    192.0.2.(10+i)), GPUs as gres; partitions `lab` (all nodes) and `one` (n1):
                                    `bench run --slurm` and bench/slurm_speedup.py

    need_lab()                      munged, slurmctld, slurmd, scontrol, ip, nsenter installed and root, else
                                    tests/needs.py's one-line skip (a failure under CI=true)
    .start() / .close()             (also a context manager); close() kills every daemon it started, deletes the
                                    namespaces and checks (leftovers() is empty afterwards), also after a failure
      .run(argv, env=None, ns=None) a command in the controller's namespace (or node NS's) with SLURM_CONF set
      .popen(argv, env=None, **kw)  the same, not waited for
      .as_user(uid, argv)           run as another user (a stranger's sbatch): the conf, munge's socket and the
                                    spool (a job's script) are in a directory anyone may read (.pub), the key is not
      .scontrol(*args)              `scontrol ARGS` there; raises on a non-zero exit
      .show(node=None) / .state(node=None) / .info(node)   `scontrol show node`, its State=, parsed
      .wait_state(pred, timeout, node=None) / .wait_idle(node)   (the controller applies updates asynchronously)
      .jobs()                       squeue's lines `ID NAME STATE NODES USER` of every job
      .reset()                      every node IDLE with no reason, no reservation, no reboot pending, no job (any
                                    user's): each test starts there; under Slurm >= 23.11 a kept reason is cleared
      .write_conf(**extra)          slurm.conf with extra lines (HealthCheckProgram=…, Prolog=…); `scontrol
                                    reconfigure` makes slurmctld and slurmd read it again
      .node / .nodes / .addr / .conf / .base / .log(name) / .version() / .keeps_reasons()

Daemons run as children of the test through `nsenter --net` (the mount namespace stays the host's: slurmd's cgroup
plugin reads /sys/fs/cgroup, which `ip netns exec` would replace by an empty sysfs; so every directory is shared by all
nodes, as a cluster's shared file system is). The one-node shape's address 192.0.2.1 (TEST-NET-1) is a second address
on the namespace's own `lo`: slurmd resolves its NodeAddr with AI_ADDRCONFIG and cannot bind where the only addresses
are loopback ones. The cluster shape exists because Debian's slurmd is not built with --enable-multiple-slurmd (two
slurmd on one address would share a port, a pid file and a spool): each slurmd listens on the default port of its own
address, and a job's server listens on the campaign's port on its node only — as on real machines.

GPUs (cluster shape) are gres (AutoDetect=off) whose File= are character nodes with /dev/null's numbers under the
lab's directory: 22.05 drops a GPU without File= ("Removing file-less GPU") and refuses a plain file; Slurm counts
them and sets CUDA_VISIBLE_DEVICES per job; no real device is involved (TaskPlugin=task/none constrains no device).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from pathlib import Path

from tests.procs import stop

ADDR = "192.0.2.1"  # the controller's (and the one-node shape's node's) address
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
    def __init__(self, base: Path, node: str = NODE, *, nodes: int | None = None, gpus: int = 0):
        self.base = Path(base)
        self.cluster = nodes is not None
        self.nodes = [f"n{i}" for i in range(1, nodes + 1)] if self.cluster else [node]
        self.node = self.nodes[0]
        self.gpus = gpus
        self.addr = ADDR
        tag = f"gpd-slurm-w24-{os.getpid()}-{id(self) % 100000}"
        self.netns = f"{tag}-ctl" if self.cluster else tag  # the controller's namespace
        self.ns = {n: f"{tag}-{n}" for n in self.nodes} if self.cluster else {self.node: self.netns}
        self.bridge = f"gsb{os.getpid() % 100000}"
        self.pub: Path | None = None  # made at start: slurm.conf and munge's socket, readable by any user
        self.conf = self.base / "etc" / "slurm.conf"
        self.munge_sock = self.base / "munge" / "munge.socket.2"
        self.procs: dict[str, subprocess.Popen] = {}
        self._extra: dict[str, str] = {}

    def node_addr(self, node: str) -> str:
        return f"192.0.2.{10 + self.nodes.index(node) + 1}" if self.cluster else ADDR

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

    def _ip(self, *args, ns: str | None = None) -> None:
        argv = ["ip", *args] if ns is None else ["ip", "-n", ns, *args]
        res = subprocess.run(argv, capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {res.stderr.strip()}")

    def _network(self) -> None:
        self._ip("netns", "add", self.netns)
        self._ip("link", "set", "lo", "up", ns=self.netns)
        if not self.cluster:
            self._ip("addr", "add", f"{ADDR}/32", "dev", "lo", ns=self.netns)
            return
        self._ip("link", "add", self.bridge, "type", "bridge", ns=self.netns)
        self._ip("addr", "add", f"{ADDR}/24", "dev", self.bridge, ns=self.netns)
        self._ip("link", "set", self.bridge, "up", ns=self.netns)
        for i, node in enumerate(self.nodes, 1):
            ns = self.ns[node]
            self._ip("netns", "add", ns)
            self._ip("link", "set", "lo", "up", ns=ns)
            a, b = f"gsa{os.getpid() % 10000}x{i}", f"gsb{os.getpid() % 10000}x{i}"
            self._ip("link", "add", a, "type", "veth", "peer", "name", b, ns=self.netns)
            self._ip("link", "set", b, "netns", ns, ns=self.netns)
            self._ip("link", "set", a, "master", self.bridge, ns=self.netns)
            self._ip("link", "set", a, "up", ns=self.netns)
            self._ip("addr", "add", f"{self.node_addr(node)}/24", "dev", b, ns=ns)
            self._ip("link", "set", b, "up", ns=ns)

    def _start(self) -> None:
        for d in ("munge", "state", "log", "run"):
            (self.base / d).mkdir(parents=True, exist_ok=True)
        os.chmod(self.base, 0o755)
        os.chmod(self.base / "munge", 0o700)  # the key
        # slurm.conf and munge's socket where another user can reach them (a stranger's job); tests' temp dirs
        # are 0700 above the lab's base
        self.pub = Path(tempfile.mkdtemp(prefix="gpd-slurmlab-"))
        os.chmod(self.pub, 0o755)
        (self.pub / "etc").mkdir(mode=0o755)
        (self.pub / "munge").mkdir(mode=0o755)
        (self.pub / "spool").mkdir(mode=0o755)  # slurmstepd runs a job's script from there, as the job's user
        self.conf = self.pub / "etc" / "slurm.conf"
        self.munge_sock = self.pub / "munge" / "munge.socket.2"
        (self.base / "etc").mkdir(exist_ok=True)
        self._network()
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
        for node in self.nodes:
            if self.cluster:
                (self.pub / "spool" / node).mkdir(exist_ok=True)
            self._daemon(f"slurmd-{node}" if self.cluster else "slurmd",
                         [_which("slurmd"), "-D", "-N", node, "-f", str(self.conf)], ns=self.ns[node])
        for node in self.nodes:
            self.wait_state(lambda s: s.split("+")[0] == "IDLE" and "NOT_RESPONDING" not in s, 40, node=node)

    def close(self) -> None:
        for name in [n for n in self.procs if n.startswith("slurmd")] + ["slurmctld", "munged"]:
            p = self.procs.pop(name, None)
            if p is not None:
                stop(p, 10)
        for ns in self._namespaces():
            self._kill_stragglers(ns)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        if self.pub is not None:
            shutil.rmtree(self.pub, ignore_errors=True)
        left = self.leftovers()
        if left:
            raise RuntimeError(f"the Slurm lab left {left}")

    def _namespaces(self) -> list[str]:
        return list(dict.fromkeys([*self.ns.values(), self.netns]))

    @staticmethod
    def _kill_stragglers(ns: str) -> None:
        """Whatever still runs in a namespace of ours (a job step, a health check) goes too: killed by pid."""
        res = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
        for pid in (int(x) for x in res.stdout.split() if x.isdigit()):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def leftovers(self) -> list[str]:
        out = [f"netns {ns}" for ns in self._namespaces() if Path(f"/run/netns/{ns}").exists()]
        if self.pub is not None and self.pub.exists():
            out.append(str(self.pub))
        return out + [f"{n} pid {p.pid}" for n, p in self.procs.items() if p.poll() is None]

    # ---- helpers ----------------------------------------------------------------------------------------------
    def _in_ns(self, argv, ns: str | None = None) -> list[str]:
        return ["nsenter", f"--net=/run/netns/{ns or self.netns}", *argv]

    def _daemon(self, name: str, argv, ns: str | None = None) -> None:
        with open(self.base / "log" / f"{name}.out", "wb") as log:
            self.procs[name] = subprocess.Popen(self._in_ns(argv, ns), stdout=log, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL, env=self.env())

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
                           f"slurmd: {self.log(self._slurmd_log())[-1500:]}")

    def _slurmd_log(self) -> str:
        return f"slurmd-{self.node}" if self.cluster else "slurmd"

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
        n = "%n" if self.cluster else ""
        lines = {
            "ClusterName": "gpdcluster" if self.cluster else "gpdlab",
            "SlurmctldHost": f"{socket.gethostname().split('.')[0]}({ADDR})",
            "SlurmUser": "root", "SlurmdUser": "root",
            "AuthType": "auth/munge", "CredType": "cred/munge", "AuthInfo": f"socket={self.munge_sock}",
            "StateSaveLocation": str(b / "state"), "SlurmdSpoolDir": str(self.pub / "spool" / n) if n else str(self.pub / "spool"),
            "SlurmctldPidFile": str(b / "run" / "slurmctld.pid"),
            "SlurmdPidFile": str(b / "run" / ("slurmd-%n.pid" if n else "slurmd.pid")),
            "SlurmctldLogFile": str(b / "log" / "slurmctld.log"),
            "SlurmdLogFile": str(b / "log" / ("slurmd-%n.log" if n else "slurmd.log")),
            "SlurmctldDebug": "info", "SlurmdDebug": "info",
            "ProctrackType": "proctrack/linuxproc", "TaskPlugin": "task/none",
            "JobAcctGatherType": "jobacct_gather/none", "AccountingStorageType": "accounting_storage/none",
            "JobCompType": "jobcomp/none" if self.cluster else None,
            "SchedulerType": "sched/backfill", "SelectType": "select/cons_tres",
            "GresTypes": "gpu" if self.gpus else None,
            # the cluster: a node DOWN by a failure returns by itself; `scontrol show job` answers for 5 minutes
            # after a job ended (how it ended, for `bench run --slurm`)
            "MpiDefault": "none", "ReturnToService": "2" if self.cluster else "1", "SlurmdTimeout": "300",
            "SlurmctldTimeout": "300", "InactiveLimit": "0", "KillWait": "2",
            "MinJobAge": "300" if self.cluster else "2", "MessageTimeout": "5",
            "RebootProgram": "/bin/true",
        }
        lines.update(self._extra)
        text = "".join(f"{k}={v}\n" for k, v in lines.items() if v is not None)
        gres = f" Gres=gpu:{self.gpus}" if self.gpus else ""
        for node in self.nodes:
            text += (f"NodeName={node} NodeAddr={self.node_addr(node)} CPUs={os.cpu_count()} RealMemory=100{gres} "
                     "State=UNKNOWN\n")
        text += f"PartitionName=lab Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP\n"
        if self.cluster:
            text += f"PartitionName=one Nodes={self.nodes[0]} MaxTime=INFINITE State=UP\n"
        self.conf.write_text(text)
        os.chmod(self.conf, 0o644)
        # slurmd 22.05 loads a cgroup plugin even with proctrack/linuxproc and task/none; autodetected on a pure
        # cgroup2 host it is cgroup/v2, which wants systemd's D-Bus to place slurmstepd. cgroup/v1 named here
        # starts on either layout and, with these plugins, makes no cgroup at all.
        (self.conf.parent / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")
        if self.gpus:
            # Slurm 22.05 drops a GPU without File= ("Removing file-less GPU") and wants a device there: each "GPU"
            # is a character device node with /dev/null's numbers, under the lab's directory
            dev = b / "dev"
            dev.mkdir(exist_ok=True)
            for i in range(self.gpus):
                if not (dev / f"gpu{i}").exists():
                    os.mknod(dev / f"gpu{i}", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
            (self.conf.parent / "gres.conf").write_text(
                "AutoDetect=off\n" + f"Name=gpu File={dev}/gpu[0-{self.gpus - 1}]\n")

    # ---- the cluster ------------------------------------------------------------------------------------------
    def run(self, argv, env: dict | None = None, timeout: float = 30, ns: str | None = None,
            **kw) -> subprocess.CompletedProcess:
        return subprocess.run(self._in_ns(argv, self.ns[ns] if ns else None), env=self.env(env), capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL, **kw)

    def popen(self, argv, env: dict | None = None, **kw) -> subprocess.Popen:
        return subprocess.Popen(self._in_ns(argv), env=self.env(env), stdin=subprocess.DEVNULL, **kw)

    def as_user(self, uid: int, argv, timeout: float = 30) -> subprocess.CompletedProcess:
        """A command as user `uid` (its group the same number, no supplementary groups), from /tmp."""
        return self.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *argv], timeout=timeout,
                        cwd="/tmp")

    def scontrol(self, *args) -> str:
        res = self.run(["scontrol", *args])
        if res.returncode != 0:
            raise RuntimeError(f"scontrol {' '.join(args)} → {res.returncode}: {res.stderr.strip()}")
        return res.stdout

    def show(self, node: str | None = None) -> str:
        return self.scontrol("show", "node", node or self.node)

    def info(self, node: str | None = None):
        from gpudoctor.integrations.slurm import parse_show_node

        return parse_show_node(self.show(node))

    def state(self, node: str | None = None) -> str:
        return self.info(node).state or ""

    def wait_state(self, pred, timeout: float = 10, node: str | None = None) -> str:
        from gpudoctor.integrations.slurm import parse_show_node

        node = node or self.node
        end = time.monotonic() + timeout
        state = ""
        while time.monotonic() < end:
            res = self.run(["scontrol", "show", "node", node])
            if res.returncode == 0:
                state = parse_show_node(res.stdout).state or ""
                if pred(state):
                    return state
            time.sleep(0.1)
        raise AssertionError(f"node {node} state never matched: last {state!r}; slurmctld: "
                             f"{self.log('slurmctld')[-1500:]}")

    def wait_idle(self, node: str | None = None, timeout: float = 15) -> str:
        return self.wait_state(lambda s: s == "IDLE", timeout, node=node)

    def jobs(self) -> list[str]:
        """squeue's lines `ID NAME STATE NODES USER` of every job in the lab."""
        return [x for x in self.run(["squeue", "-h", "-o", "%i %j %T %N %u"]).stdout.splitlines() if x.strip()]

    def reset(self) -> None:
        """Every node back to IDLE with no reason: reservations deleted, reboots cancelled, every user's jobs
        cancelled, nodes resumed; under Slurm >= 23.11 a reason the resume kept cleared."""
        for line in self.scontrol("show", "reservation").splitlines():
            if line.startswith("ReservationName="):
                self.scontrol("delete", f"reservation={line.split()[0].split('=', 1)[1]}")
        for node in self.nodes:
            self.run(["scontrol", "cancel_reboot", node])
        ids = self.run(["squeue", "-h", "-o", "%i"]).stdout.split()
        if ids:
            self.run(["scancel", *ids])
            self._wait(lambda: not self.run(["squeue", "-h", "-o", "%i"]).stdout.split(), 30, "the lab's jobs to end")
        for node in self.nodes:
            st = self.state(node)
            if "DOWN" in st or "DRAIN" in st or "FAIL" in st:
                self.scontrol("update", f"nodename={node}", "state=resume")
        for node in self.nodes:
            self.wait_idle(node)
        if not self.keeps_reasons():
            return
        for node in self.nodes:
            if "Reason=" in self.show(node):
                # Slurm >= 23.11 without accounting storage keeps a resumed node's reason and scontrol cannot
                # clear it; a job allocated on the node does (node_mgr.c make_node_alloc)
                res = self.run(["srun", "-N1", "-w", node, "-t", "1", "true"], timeout=30)
                if res.returncode != 0:
                    raise RuntimeError(f"srun on {node} to clear its kept reason: {res.stderr.strip()}")
                self.wait_idle(node)

    def version(self) -> tuple[int, int]:
        """Slurm's version as (major, minor), from `scontrol --version` ("slurm 24.11.5")."""
        out = self.scontrol("--version").split()[-1]
        major, minor = out.split(".")[:2]
        return int(major), int(minor)

    def keeps_reasons(self) -> bool:
        """Does a resume keep the node's Reason? From 23.11 on, under accounting_storage/none (this lab's), the
        hook that cleared it (clusteracct_storage_g_node_up) returns first."""
        return self.version() >= (23, 11)
