"""A standard output that cannot be written — /dev/full (a full disk), or closed (`>&-`) — is one line on stderr and exit
3 for every command, never a traceback and exit 1 (Nagios's WARNING for a host that FAILs) or 120; with stderr closed
too, the exit code alone still says it: 3 (docs/cli.md "Exit codes"). The click tree is walked, so a command added
without harmless arguments here fails the suite (#49)."""

from __future__ import annotations

import os
import subprocess
import sys

import click
import pytest

from gpudoctor.cli import cli as root
from tests.bench.conftest import free_port
from tests.console import commands, console_script

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = str(REPO / "examples" / "h200-uvm-blocked.json")
CONF = str(REPO / "tests" / "fixtures" / "proxmox" / "configs" / "200-seed.conf")
DEVICES = str(REPO / "tests" / "fixtures" / "proxmox" / "proc-devices-uvm511.txt")
LOG = str(REPO / "tests" / "fixtures" / "serverlogs" / "cuda-graph-oom.log")
RESULTS = REPO / "tests" / "fixtures" / "bench2" / "one-trial"


def harmless(name: str, tmp) -> list[str]:
    """Arguments with which each command prints something on stdout and changes nothing outside tmp."""
    inv = tmp / "inv.yaml"
    inv.write_text("version: 1\nhosts:\n  vm:\n    address: 127.0.0.1\n    port: 1\n")
    (tmp / "m").mkdir(exist_ok=True)
    res = tmp / "r1"
    if not res.exists():
        res.mkdir()
        (res / "results.jsonl").write_text((RESULTS / "results.jsonl").read_text())
    camp = tmp / "c.yaml"
    camp.write_text(f"""name: t
model: {tmp}/m
server:
  command: [{sys.executable}, -m, gpudoctor.bench.standin, --decode-tok-s, "0", --ttft-ms, "1"]
  port: {free_port()}
gate: false
tp: [1]
concurrency: [1]
timeouts: {{ready_s: 60, stall_s: 15, stop_s: 5, gpu_release_s: 5}}
methods: {{baseline: {{baseline: true}}}}
workloads:
  - name: chat
    max_tokens: [4]
    num_prompts: 1
""")
    return {
        "check": ["--snapshot", EXAMPLE],
        "snapshot": ["--timeout", "5"],
        "checks": [],
        "fix": ["--snapshot", EXAMPLE],
        "lxc audit": ["--config", CONF, "--devices", DEVICES],
        "lxc fix": ["--config", CONF, "--devices", DEVICES],  # a dry run
        "model verify": [str(tmp / "m")],
        "model stage": ["--from", str(tmp / "m"), "--to", str(tmp / "staged")],  # a dry run
        "gate": ["--snapshot", EXAMPLE],
        "daemon": ["--reset-breaker", "--state", str(tmp / "d.json")],
        "release": ["vm", "-i", str(inv), "--json"],
        "recovery release": ["vm", "-i", str(inv), "--json"],
        "recovery show": ["-i", str(inv)],
        "bench load": ["--server-url", "http://127.0.0.1:1", "--max-tokens", "4", "--context-limit", "4096",
                       "--ready-timeout", "1", "--concurrency", "1", "--out", str(tmp / "lo"), "--json"],
        "bench run": [str(camp), "--out", str(tmp / "ro")],
        "bench report": [str(res)],
        "bench compare": [str(res), str(res)],
        "bench standin": ["--help"],  # a server: its output is its help (it takes SGLang's flags)
        "sglang validate": ["--model-path", str(tmp / "m")],
        "sglang explain": [LOG],
        "inventory show": ["-i", str(inv)],
        "inventory ping": ["-i", str(inv)],
        "completion": ["bash"],
        "manpage": [],
    }[name]


LEAVES = sorted(" ".join(p) for p, c in commands(root) if not isinstance(c, click.Group))


def run(args, tmp, stdout, close=()) -> subprocess.CompletedProcess:
    env = {**os.environ, "STATE_DIRECTORY": str(tmp / "state"), "NO_COLOR": "1"}

    def pre():
        for fd in close:
            os.close(fd)

    with open(os.devnull if stdout is None else stdout, "w") as out:
        return subprocess.run([console_script(), *args], stdout=out, stderr=subprocess.PIPE, text=True, env=env,
                              preexec_fn=pre if close else None, timeout=120, cwd=tmp)


@pytest.mark.parametrize("name", LEAVES)
def test_every_command_with_stdout_full_or_closed_says_one_line_and_exits_3(name, tmp_path):
    def args(k: int) -> list[str]:  # a fresh directory each run (bench run refuses an --out of an earlier run)
        (tmp_path / str(k)).mkdir()
        return [*name.split(), *harmless(name, tmp_path / str(k))]

    fine = subprocess.run([console_script(), *args(0)], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, "STATE_DIRECTORY": str(tmp_path / "state")})
    assert fine.stdout.strip(), f"{name}: these arguments print nothing on stdout: {fine.stderr}"
    full = run(args(1), tmp_path, "/dev/full")
    assert full.returncode == 3 and "Traceback" not in full.stderr, (name, full.returncode, full.stderr)
    assert full.stderr.splitlines()[-1:] == ["gpudoctor: cannot write standard output: No space left on device; "
                                             "what this command printed is lost"], full.stderr
    assert not [ln for ln in full.stderr.splitlines() if ln.startswith(("gpudoctor:", "Error", "Exception"))][:-1]
    closed = run(args(2), tmp_path, None, close=(1,))
    assert closed.returncode == 3 and "Traceback" not in closed.stderr, (name, closed.returncode, closed.stderr)
    assert closed.stderr.splitlines()[-1].startswith("gpudoctor: cannot write standard output"), closed.stderr
    both = run(args(3), tmp_path, None, close=(1, 2))
    assert both.returncode == 3, (name, both.returncode)
