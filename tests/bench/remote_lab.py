"""A remote target for campaign tests: inventory host ct200 is the test sshd on 127.0.0.1 (real SSH, strict host key).

The "remote" servers are the stand-in, started through SSH by the campaign's HostLauncher; their logs, pid and rc
files live in `remote_dir` (on this machine, as seen through sshd). ct200's PATH starts with `bin/`, which holds an
nvidia-smi stand-in that lists a compute process for the next N queries (GPU memory released late, as a real driver
may). The gate is a `gpudoctor` stand-in run locally that records its arguments. ct200's file reads are mapped under
`files/` (tests/rooted.py: `roots`, set for the CLI runs by the test), so a model at /models/llama exists only
"on ct200"; commands are not mapped.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

from tests.bench.conftest import free_port
from tests.childenv import pythonpath
from tests.rooted import roots_env


@dataclass
class RemoteLab:
    tmp: Path
    inventory: Path
    remote_dir: Path
    bin: Path
    gate_log: Path
    smi_log: Path
    smi_busy: Path
    gate: Path
    files: Path  # ct200's file operations (Host.read_file: the model's config and tokenizer) are mapped under it
    roots: dict  # the environment that roots ct200 under `files` for `python -m tests.rooted`

    def campaign(self, body: str, *, concurrency: str = "[1, 2]", port: int | None = None, extra: str = "",
                 server_extra: str = "", max_tokens: int = 24, decode: str = "400", ttft: str = "10",
                 gate: str | None = None, name: str = "c.yaml") -> tuple[Path, int]:
        port = port or free_port()
        gate = gate if gate is not None else f"[{self.gate}, gate, --profile, benchmark]"
        text = textwrap.dedent(f"""\
            name: remote test
            target: ct200
            model: {self.tmp}/model
            server:
              command: [{sys.executable}, -m, gpudoctor.bench.standin, --decode-tok-s, "{decode}", --ttft-ms, "{ttft}"]
              port: {port}
              env: {{PYTHONPATH: "{pythonpath(env={})}"}}
              remote_dir: {self.remote_dir}
            """) + textwrap.indent(textwrap.dedent(server_extra), "  ") + textwrap.dedent(f"""\
            gate:
              command: {gate}
            tp: [1]
            concurrency: {concurrency}
            timeouts: {{ready_s: 60, stall_s: 15, stop_s: 5, gpu_release_s: 10}}
            workloads:
              - name: chat
                max_tokens: [{max_tokens}]
                num_prompts: 4
            """) + textwrap.dedent(body) + textwrap.dedent(extra)
        path = self.tmp / name
        path.write_text(text)
        return path, port

    def gate_calls(self) -> list[list[str]]:
        if not self.gate_log.exists():
            return []
        return [json.loads(line) for line in self.gate_log.read_text().splitlines()]

    def smi_calls(self) -> list[str]:
        return self.smi_log.read_text().splitlines() if self.smi_log.exists() else []

    def remote_logs(self) -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in self.remote_dir.rglob("*.log")}

    def kill_leftovers(self) -> list[int]:
        """SIGKILL the process group of every server wrapper recorded under remote_dir that still runs."""
        killed = []
        for pid_file in self.remote_dir.rglob("*.pid"):
            try:
                pid = int(pid_file.read_text())
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except (OSError, ValueError):
                continue
            if b"gpudoctor-bench-server" in cmdline:
                try:
                    os.killpg(pid, signal.SIGKILL)
                    killed.append(pid)
                except ProcessLookupError:
                    pass
        return killed


def make_lab(tmp_path: Path, sshd) -> RemoteLab:
    bin_dir = tmp_path / "ct200-bin"
    bin_dir.mkdir()
    smi_log, smi_busy = tmp_path / "nvidia-smi.calls", tmp_path / "nvidia-smi.busy"
    smi_busy.write_text("0")
    smi = bin_dir / "nvidia-smi"
    smi.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        echo "$*" >> {smi_log}
        case "$1" in
          --query-compute-apps=*)
            n=$(cat {smi_busy})
            if [ "$n" -gt 0 ]; then echo $((n - 1)) > {smi_busy}; echo "4242, 70000"; fi ;;
          --query-gpu=*) echo "0, 3" ;;
        esac
        """))
    smi.chmod(0o755)
    gate_log = tmp_path / "gate.calls"
    gate = tmp_path / "local-bin" / "gpudoctor"
    gate.parent.mkdir()
    gate.write_text(f"#!{sys.executable}\nimport json, sys\n"
                    f"open({str(gate_log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n")
    gate.chmod(0o755)
    root = tmp_path / "ct200-files"
    root.mkdir()
    for d in (f"{tmp_path}/model", "/models/draft"):  # the model and draft exist on ct200 (a run checks first)
        (root / d.lstrip("/")).mkdir(parents=True)
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(sshd.inventory_yaml("ct200"))
    remote = tmp_path / "ct200-runs"
    return RemoteLab(tmp_path, inventory, remote, bin_dir, gate_log, smi_log, smi_busy, gate, root,
                     roots_env(ct200=(root, [bin_dir])))
