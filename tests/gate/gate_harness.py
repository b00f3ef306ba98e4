"""Run the real `gpudoctor gate` CLI in a subprocess, against the H200 snapshots or a live host rooted in a temp
directory (Live), with stand-in scontrol on PATH.

A replay never acts (docs/security.md), so what drains, resumes and moves the ladder is a live gate: Live is an
inventory host `gpu01` whose files live under a HostRoot (tests/rooted.py maps them), judged with the profile
`nodes` (the nvidia-uvm node's major must match the live one; nothing else is required), so a test turns the
verdict with one mknod: Live.bad() (the seed's stale 509 node) or Live.good()."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.childenv import pythonpath
from tests.remedies.hostroot import HostRoot
from tests.rooted import roots_env


ROOT = Path(__file__).resolve().parents[2]
SNAPS = ROOT / "tests" / "fixtures" / "snapshots"

SHOW_NODE = """NodeName={node} Arch=x86_64 CoresPerSocket=32
   CPUAlloc=0 CPUEfctv=64 CPUTot=64 CPULoad=0.05
   Gres=gpu:h200:8
   NodeAddr={node} NodeHostName={node} Version=23.11.4
   RealMemory=1000000 AllocMem=0 FreeMem=990000 Sockets=2 Boards=1
   State={state} ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A
   Partitions=gpu
   BootTime=2024-05-01T10:00:00 SlurmdStartTime=2024-05-01T10:01:00
   CfgTRES=cpu=64,mem=1000000M,billing=64,gres/gpu=8
{reason_line}"""

SCONTROL = """#!{python}
import json, os, sys
with open(os.environ["SCONTROL_LOG"], "a") as fh:
    fh.write(json.dumps(sys.argv[1:]) + "\\n")
if sys.argv[1:3] == ["show", "node"]:
    sys.stdout.write(open(os.environ["SCONTROL_SHOW"]).read())
    sys.exit(int(os.environ.get("SCONTROL_SHOW_RC", "0")))
if sys.argv[1:3] == ["show", "reservation"]:
    sys.stdout.write("No reservations in the system\\n")
    sys.exit(0)
if sys.argv[1:2] == ["update"] and os.environ.get("SCONTROL_UPDATE_RC"):
    sys.stderr.write("slurm_update error: Invalid node state specified\\n")
    sys.exit(int(os.environ["SCONTROL_UPDATE_RC"]))
"""


class Slurm:
    """A stand-in `scontrol` on PATH that records every call and answers `show node` from a file (in scontrol's
    words; tests/gate/test_slurm_lab.py meets the real one), `show reservation` with none."""

    def __init__(self, tmp: Path):
        self.bin = tmp / "bin"
        self.bin.mkdir()
        exe = self.bin / "scontrol"
        exe.write_text(SCONTROL.format(python=sys.executable))
        exe.chmod(0o755)
        self.log = tmp / "scontrol.log"
        self.show = tmp / "show.txt"
        self.env = {"SCONTROL_LOG": str(self.log), "SCONTROL_SHOW": str(self.show)}
        self.node("gpu01", "IDLE", None)

    def node(self, name, state, reason):
        line = f"   Reason={reason} [root@2024-05-02T09:00:00]\n" if reason else ""
        self.show.write_text(SHOW_NODE.format(node=name, state=state, reason_line=line))

    def calls(self) -> list[list[str]]:
        if not self.log.exists():
            return []
        return [json.loads(x) for x in self.log.read_text().splitlines()]

    def updates(self) -> list[list[str]]:
        return [c for c in self.calls() if c[:1] == ["update"]]


LIVE_CAUSE = "/dev/nvidia-uvm is 509:0, but the live nvidia-uvm device is 511:0"  # Live.bad()'s root cause
LIVE_INVENTORY = """hosts:
  {name}: {{address: local}}
profiles:
  nodes: {{require: ["devices.node.major*"], fail_free: false}}
policy:
  verify:
    deep: "off"
    serving: "off"
    commands: [[test, -e, "{flag}"]]
"""


class Live:
    """Inventory host NAME (gpu01), live, its files under a temp root, in TMP/inventory.yaml: gate it with
    run_gate(*live.args, ..., env=live.env, rooted=True), or run live.cli + live.args with live.env anywhere (a
    Slurm node's HealthCheckProgram: live.shim()). Its ladder record is NAME; the verification passes while `flag`
    exists."""

    name = "gpu01"

    def __init__(self, tmp: Path, flag: Path, name: str = "gpu01"):
        self.name = name
        (tmp / "gpu-root").mkdir(exist_ok=True)
        self.root = HostRoot(tmp / "gpu-root", uvm_major=511).healthy_nodes(511)
        self.inventory = tmp / "inventory.yaml"
        self.inventory.write_text(LIVE_INVENTORY.format(name=name, flag=flag))
        self.args = ["--inventory", str(self.inventory), "--host", name, "--profile", "nodes"]
        self.env = {**roots_env(**{name: (self.root.root, [self.root.bin])}), "GPUDOCTOR_STANDIN_ROOT":
                    str(self.root.root), "GPUDOCTOR_STANDIN_PYTHON": sys.executable, "PYTHONPATH": pythonpath()}
        self.cli = [sys.executable, "-m", "tests.rooted"]  # the CLI with this host's files under its root

    def shim(self, path: Path, *extra: str) -> Path:
        """An executable that runs `gpudoctor ARGS` on this host (ARGS: its own, then --host and the inventory),
        with the environment it needs set inside: slurmd runs a HealthCheckProgram with almost none."""
        exports = "".join(f"{k}='{v}'; export {k}\n" for k, v in self.env.items())
        # `python -m` puts its cwd first on sys.path, and slurmd may run it in the checkout (whose gpudoctor/ is not
        # the installed layout): run it from /, as a real HealthCheckProgram's console script does not care where
        path.write_text(f"#!/bin/sh\n{exports}cd / || exit 1\nexec {' '.join(self.cli)} \"$@\" {' '.join(self.args)} "
                        f"{' '.join(extra)}\n")
        path.chmod(0o755)
        return path

    def bad(self) -> "Live":
        self.root.node("/dev/nvidia-uvm", 509, 0)
        return self

    def good(self) -> "Live":
        self.root.node("/dev/nvidia-uvm", 511, 0)
        return self


def run_gate(*args, cwd, env=None, path_prepend=None, rooted=False) -> subprocess.CompletedProcess:
    """The real CLI in a subprocess; cwd and HOME are a temp dir so no stray inventory.yaml is picked up. `rooted`:
    through tests/rooted.py, so a Live host's files are read under its root."""
    e = dict(os.environ)
    e.pop("GPUDOCTOR_INVENTORY", None)
    e["HOME"] = str(cwd)
    e["STATE_DIRECTORY"] = str(Path(cwd) / "state")  # the recovery ladder's file: this test's, never /var/lib's
    e["PYTHONPATH"] = pythonpath(env=e)
    if path_prepend:
        e["PATH"] = f"{path_prepend}{os.pathsep}{e['PATH']}"
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "tests.rooted" if rooted else "gpudoctor", "gate", *args], env=e,
                          cwd=cwd,
                          capture_output=True, text=True, timeout=60)
