"""The Slurm lab grown to a cluster: Debian's real munged + slurmctld + one slurmd per node (slurm-wlm 22.05), each
daemon in its own network namespace with its own address, GPUs as gres, for `gpudoctor bench run --slurm`.

    SlurmCluster(base, nodes=3, gpus=2).start() / .close()   (also a context manager; close() leaves nothing behind)
      .run(argv, env=None, ns=None)   a command in the controller's namespace (or node NAME's) with SLURM_CONF set
      .scontrol(*args) / .info(node) / .wait_idle(node) / .reset()
      .nodes  ['n1', 'n2', 'n3']; partitions `lab` (all nodes, default) and `one` (n1 only)

Why namespaces: Debian's slurmd is not built with --enable-multiple-slurmd, so two slurmd on one address would share
a port, a pid file and a spool. Each node here is a network namespace (`gpd-sc-<pid>-<n>-<node>`) joined to the
controller's namespace by a veth pair on a bridge (192.0.2.0/24: the controller 192.0.2.1, node i 192.0.2.(10+i)), so
every slurmd listens on the default port of its own address, and a job's server listens on the campaign's port on its
node only — as on real machines. The mount namespace stays the host's (slurmd's cgroup plugin reads /sys/fs/cgroup),
so every directory is shared by all nodes, as a cluster's shared file system is.

GPUs are gres (AutoDetect=off) whose File= are character nodes with /dev/null's numbers under the cluster's directory:
22.05 drops a GPU without File= ("Removing file-less GPU") and refuses a plain file; Slurm counts them and sets
CUDA_VISIBLE_DEVICES per job; no real device is involved (TaskPlugin=task/none constrains no device).
"""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import time
from pathlib import Path

from tests.procs import stop
from tests.slurmlab import _which, need_lab  # noqa: F401  (need_lab: the cluster needs what the lab needs)

CTL = "192.0.2.1"


class SlurmCluster:
    def __init__(self, base: Path, nodes: int = 3, gpus: int = 2):
        self.base = Path(base)
        self.nodes = [f"n{i}" for i in range(1, nodes + 1)]
        self.gpus = gpus
        tag = f"gpd-sc-{os.getpid()}-{id(self) % 10000}"
        self.ctl_ns = f"{tag}-ctl"
        self.ns = {n: f"{tag}-{n}" for n in self.nodes}
        self.bridge = f"gsb{os.getpid() % 100000}"
        self.conf = self.base / "etc" / "slurm.conf"
        self.munge_sock = self.base / "munge" / "munge.socket.2"
        self.procs: dict[str, subprocess.Popen] = {}

    def addr(self, node: str) -> str:
        return f"192.0.2.{10 + self.nodes.index(node) + 1}"

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
        self._ip("netns", "add", self.ctl_ns)
        self._ip("link", "set", "lo", "up", ns=self.ctl_ns)
        self._ip("link", "add", self.bridge, "type", "bridge", ns=self.ctl_ns)
        self._ip("addr", "add", f"{CTL}/24", "dev", self.bridge, ns=self.ctl_ns)
        self._ip("link", "set", self.bridge, "up", ns=self.ctl_ns)
        for i, node in enumerate(self.nodes, 1):
            ns = self.ns[node]
            self._ip("netns", "add", ns)
            self._ip("link", "set", "lo", "up", ns=ns)
            a, b = f"gsa{os.getpid() % 10000}x{i}", f"gsb{os.getpid() % 10000}x{i}"
            self._ip("link", "add", a, "type", "veth", "peer", "name", b, ns=self.ctl_ns)
            self._ip("link", "set", b, "netns", ns, ns=self.ctl_ns)
            self._ip("link", "set", a, "master", self.bridge, ns=self.ctl_ns)
            self._ip("link", "set", a, "up", ns=self.ctl_ns)
            self._ip("addr", "add", f"{self.addr(node)}/24", "dev", b, ns=ns)
            self._ip("link", "set", b, "up", ns=ns)

    def _start(self) -> None:
        for d in ("etc", "munge", "state", "spool", "log", "run"):
            (self.base / d).mkdir(parents=True, exist_ok=True)
        os.chmod(self.base, 0o755)
        os.chmod(self.base / "munge", 0o700)
        self._network()
        key = self.base / "munge" / "munge.key"
        subprocess.run([_which("mungekey"), "--create", f"--keyfile={key}", "--force"], check=True,
                       capture_output=True)
        os.chmod(key, 0o600)
        m = self.base / "munge"
        self._daemon("munged", self.ctl_ns, [
            _which("munged"), "--foreground", "--force", f"--socket={self.munge_sock}", f"--key-file={key}",
            f"--pid-file={m / 'munged.pid'}", f"--log-file={m / 'munged.log'}", f"--seed-file={m / 'munged.seed'}"])
        self._wait(lambda: self.munge_sock.exists(), 10, "munged's socket")
        self.write_conf()
        self._daemon("slurmctld", self.ctl_ns, [_which("slurmctld"), "-D", "-i", "-f", str(self.conf)])
        self._wait(lambda: self.run(["scontrol", "ping"]).returncode == 0, 20, "slurmctld answering `scontrol ping`")
        for node in self.nodes:
            (self.base / "spool" / node).mkdir(exist_ok=True)
            self._daemon(f"slurmd-{node}", self.ns[node], [_which("slurmd"), "-D", "-N", node, "-f", str(self.conf)])
        for node in self.nodes:
            self.wait_idle(node, 40)

    def close(self) -> None:
        for name in [n for n in self.procs if n.startswith("slurmd")] + ["slurmctld", "munged"]:
            p = self.procs.pop(name, None)
            if p is not None:
                stop(p, 10)
        for ns in [*self.ns.values(), self.ctl_ns]:
            res = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
            for pid in (int(x) for x in res.stdout.split() if x.isdigit()):
                try:
                    os.kill(pid, 9)
                except ProcessLookupError:
                    pass
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        left = self.leftovers()
        if left:
            raise RuntimeError(f"the Slurm cluster left {left}")

    def leftovers(self) -> list[str]:
        out = [f"netns {ns}" for ns in [*self.ns.values(), self.ctl_ns] if Path(f"/run/netns/{ns}").exists()]
        return out + [f"{n} pid {p.pid}" for n, p in self.procs.items() if p.poll() is None]

    # ---- helpers ----------------------------------------------------------------------------------------------
    def _in(self, ns: str, argv) -> list[str]:
        return ["nsenter", f"--net=/run/netns/{ns}", *argv]

    def _daemon(self, name: str, ns: str, argv) -> None:
        with open(self.base / "log" / f"{name}.out", "wb") as log:
            self.procs[name] = subprocess.Popen(self._in(ns, argv), stdout=log, stderr=subprocess.STDOUT,
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
        raise RuntimeError(f"timed out waiting for {what}; slurmctld: {self.log('slurmctld')[-1500:]}")

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

    def write_conf(self) -> None:
        b = self.base
        lines = {
            "ClusterName": "gpdcluster",
            "SlurmctldHost": f"{socket.gethostname().split('.')[0]}({CTL})",
            "SlurmUser": "root", "SlurmdUser": "root",
            "AuthType": "auth/munge", "CredType": "cred/munge", "AuthInfo": f"socket={self.munge_sock}",
            "StateSaveLocation": str(b / "state"), "SlurmdSpoolDir": str(b / "spool" / "%n"),
            "SlurmctldPidFile": str(b / "run" / "slurmctld.pid"), "SlurmdPidFile": str(b / "run" / "slurmd-%n.pid"),
            "SlurmctldLogFile": str(b / "log" / "slurmctld.log"), "SlurmdLogFile": str(b / "log" / "slurmd-%n.log"),
            "SlurmctldDebug": "info", "SlurmdDebug": "info",
            "ProctrackType": "proctrack/linuxproc", "TaskPlugin": "task/none",
            "JobAcctGatherType": "jobacct_gather/none", "AccountingStorageType": "accounting_storage/none",
            "JobCompType": "jobcomp/none",
            "SchedulerType": "sched/backfill", "SelectType": "select/cons_tres",
            "GresTypes": "gpu",
            "MpiDefault": "none", "ReturnToService": "2", "SlurmdTimeout": "300", "SlurmctldTimeout": "300",
            "InactiveLimit": "0", "KillWait": "2", "MinJobAge": "300", "MessageTimeout": "5",
            "RebootProgram": "/bin/true",
        }
        text = "".join(f"{k}={v}\n" for k, v in lines.items())
        for node in self.nodes:
            text += (f"NodeName={node} NodeAddr={self.addr(node)} CPUs={os.cpu_count()} RealMemory=100 "
                     f"Gres=gpu:{self.gpus} State=UNKNOWN\n")
        text += f"PartitionName=lab Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP\n"
        text += f"PartitionName=one Nodes={self.nodes[0]} MaxTime=INFINITE State=UP\n"
        self.conf.write_text(text)
        (self.conf.parent / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")
        # Slurm 22.05 drops a GPU without File= ("Removing file-less GPU") and wants a device there: each "GPU" is
        # a character device node with /dev/null's numbers, under the cluster's directory — no real device is used
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
        where = self.ns[ns] if ns else self.ctl_ns
        return subprocess.run(self._in(where, argv), env=self.env(env), capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL, **kw)

    def popen(self, argv, env: dict | None = None, **kw) -> subprocess.Popen:
        return subprocess.Popen(self._in(self.ctl_ns, argv), env=self.env(env), stdin=subprocess.DEVNULL, **kw)

    def scontrol(self, *args) -> str:
        res = self.run(["scontrol", *args])
        if res.returncode != 0:
            raise RuntimeError(f"scontrol {' '.join(args)} → {res.returncode}: {res.stderr.strip()}")
        return res.stdout

    def info(self, node: str):
        from gpudoctor.integrations.slurm import parse_show_node

        return parse_show_node(self.scontrol("show", "node", node))

    def wait_idle(self, node: str, timeout: float = 15) -> None:
        end = time.monotonic() + timeout
        state = None
        while time.monotonic() < end:
            res = self.run(["scontrol", "show", "node", node])
            if res.returncode == 0:
                from gpudoctor.integrations.slurm import parse_show_node

                state = parse_show_node(res.stdout).state
                if state == "IDLE":
                    return
            time.sleep(0.2)
        raise AssertionError(f"{node} never IDLE: last {state!r}; slurmctld: {self.log('slurmctld')[-1500:]}")

    def jobs(self) -> list[str]:
        """squeue's lines `ID NAME STATE NODES` of every job in the cluster."""
        return [x for x in self.run(["squeue", "-h", "-o", "%i %j %T %N"]).stdout.splitlines() if x.strip()]

    def reset(self) -> None:
        """Every job cancelled, every node resumed and IDLE."""
        if self.jobs():
            self.run(["scancel", "-u", "root"])
            self._wait(lambda: not self.jobs(), 30, "the cluster's jobs to end")
        for node in self.nodes:
            st = self.info(node).state or ""
            if "DOWN" in st or "DRAIN" in st or "FAIL" in st:
                self.scontrol("update", f"nodename={node}", "state=resume")
        for node in self.nodes:
            self.wait_idle(node)
