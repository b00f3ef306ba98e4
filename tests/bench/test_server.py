"""Waiting for GPU memory to be released (fake nvidia-smi on PATH), NCCL env per TP, and orphan-server handling."""

from __future__ import annotations

import os
import stat

from gpudoctor.bench.server.launch import gpu_busy, wait_gpu_release
from gpudoctor.host.local import LocalHost
from tests.bench.campaigns import write
from tests.bench.conftest import run_cli


def fake_nvidia_smi(tmp_path, busy_calls: int, apps: str = "") -> tuple:
    """An nvidia-smi that reports 40 GB used for `busy_calls` --query-gpu calls, then 3 MiB."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    count = tmp_path / "calls"
    count.write_text("0")
    script = bin_dir / "nvidia-smi"
    script.write_text(f"""#!/bin/sh
case "$1" in
  --query-compute-apps=*) printf '%s' '{apps}'; exit 0;;
esac
n=$(cat {count}); n=$((n+1)); echo $n > {count}
if [ $n -le {busy_calls} ]; then echo "0, 40000"; echo "1, 3"; else echo "0, 3"; echo "1, 3"; fi
""")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return bin_dir, count


def test_waits_until_memory_is_released(tmp_path):
    bin_dir, count = fake_nvidia_smi(tmp_path, busy_calls=3)
    host = LocalHost(path_prepend=[str(bin_dir)])
    assert gpu_busy(host, 1024) == "memory still in use (> 1024 MiB): GPU 0 40000 MiB"
    assert wait_gpu_release(host, 1024, deadline_s=10, poll_s=0.05) is None
    assert int(count.read_text()) == 4


def test_gives_up_with_the_reason(tmp_path):
    bin_dir, _ = fake_nvidia_smi(tmp_path, busy_calls=10**6)
    host = LocalHost(path_prepend=[str(bin_dir)])
    why = wait_gpu_release(host, 1024, deadline_s=0.3, poll_s=0.05)
    assert why == "GPUs not released after 0.3 s: memory still in use (> 1024 MiB): GPU 0 40000 MiB"


def test_compute_apps_count_as_busy(tmp_path):
    bin_dir, _ = fake_nvidia_smi(tmp_path, busy_calls=0, apps="4242, 70000\n")
    assert gpu_busy(LocalHost(path_prepend=[str(bin_dir)]), 1024) == \
        "1 compute process(es) still hold GPU memory: 4242, 70000"


def test_no_nvidia_smi_means_nothing_to_wait_for(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert gpu_busy(LocalHost(), 1024) is None


def test_campaign_stops_when_gpus_stay_busy(tmp_path, monkeypatch):
    bin_dir, _ = fake_nvidia_smi(tmp_path, busy_calls=10**6)
    path, _ = write(tmp_path, "methods: {baseline: {}}\n", concurrency="[1]")
    path.write_text(path.read_text().replace("gpu_release_s: 5", "gpu_release_s: 0.5"))
    out = tmp_path / "out"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    p = run_cli("bench", "run", str(path), "--out", str(out))
    assert p.returncode == 2
    assert "gpudoctor: after stopping baseline-tp1: GPUs not released after 0.5 s" in p.stderr
    assert [line.count('"status": "ok"') for line in (out / "results.jsonl").read_text().splitlines()] == [1]


def test_nccl_env_reaches_only_its_tp(tmp_path):
    path, _ = write(tmp_path, "methods: {baseline: {}}\n", concurrency="[1]",
                    extra="nccl_env: {2: {NCCL_P2P_LEVEL: NVL, NCCL_DEBUG: WARN}}\n")
    path.write_text(path.read_text().replace("tp: [1]", "tp: [1, 2]"))
    out = tmp_path / "out"
    p = run_cli("bench", "run", str(path), "--out", str(out))
    assert p.returncode == 0, p.stderr
    assert "NCCL environment: NCCL_DEBUG=WARN NCCL_P2P_LEVEL=NVL" in (out / "logs" / "baseline-tp2.log").read_text()
    assert "NCCL_P2P_LEVEL" not in (out / "logs" / "baseline-tp1.log").read_text()
