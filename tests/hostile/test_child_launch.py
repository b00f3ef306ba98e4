"""The deep tier's per-GPU measuring child imports nothing from a working directory another user writes (#47).

Root runs `check --deep`, `snapshot --deep` and `release` from a 0777 directory uid 65534 owns, holding json.py,
ctypes.py, platform.py and torch.py that leave a marker when imported. A root-owned stand-in nvidia-smi (first on PATH)
lists one GPU and no compute process, which is all gather/deep_gpu.py asks before it starts the child; the positive
control is the child's own record in the snapshot (it ran, and said why it measured nothing on this CPU machine).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests import needs
from tests.console import gpudoctor
from tests.hostile.attacker import attacker_dir, owned_by

MODULES = ("json", "ctypes", "platform", "torch")

# Answers exactly what the deep tier asks before it starts a child (gather/deep_gpu.py: QUERY_GPUS, QUERY_APPS);
# anything else is a stand-in's refusal, as tests/standins/nvidia-smi's.
NVIDIA_SMI = """#!/bin/sh
case "$*" in
  "--query-gpu=index,pci.bus_id,name --format=csv,noheader,nounits") echo "0, 00000000:19:00.0, NVIDIA H100 80GB HBM3" ;;
  "--query-compute-apps=pid,process_name,used_memory,gpu_bus_id --format=csv,noheader,nounits") ;;
  *) echo "stand-in: unsupported arguments: $*" >&2; exit 2 ;;
esac
"""


def world(tmp_path: Path) -> tuple[Path, Path, dict]:
    """(the hostile working directory, the marker, the environment with the stand-in first on PATH)."""
    needs.root()
    marker = tmp_path / "imported"
    cwd = attacker_dir(tmp_path, "work", mode=0o777)
    for mod in MODULES:
        (cwd / f"{mod}.py").write_text(f"open({str(marker)!r}, 'a').write({mod!r} + ' ')\n")
        owned_by(cwd / f"{mod}.py", mode=0o644)
    tools = tmp_path / "bin"  # root's, 0755: a tool root may run
    tools.mkdir(mode=0o755)
    smi = tools / "nvidia-smi"
    smi.write_text(NVIDIA_SMI)
    smi.chmod(0o755)
    env = {"PATH": f"{tools}:{os.environ['PATH']}", "HOME": str(tmp_path), "GPUDOCTOR_INVENTORY": "",
           "GPUDOCTOR_STATE_DIR": str(tmp_path / "state")}
    return cwd, marker, env


def imported(marker: Path) -> str:
    return marker.read_text() if marker.exists() else ""


def test_snapshot_deep_starts_the_child_isolated(tmp_path):
    cwd, marker, env = world(tmp_path)
    out = tmp_path / "snap.json"
    r = gpudoctor("snapshot", "--deep", "-o", out, cwd=cwd, env=env, timeout=120)
    assert "Traceback" not in r.stderr, r.stderr
    gpus = json.loads(out.read_text())["facts"]["deep"]["gpus"]
    assert gpus and gpus[0]["command"]["rc"] is not None, gpus  # the child started (the positive control)
    assert not imported(marker), f"the measuring child imported the working directory's {imported(marker)}"


def test_check_deep_starts_the_child_isolated(tmp_path):
    cwd, marker, env = world(tmp_path)
    r = gpudoctor("check", "--deep", "--json", cwd=cwd, env=env, timeout=120)
    assert "Traceback" not in r.stderr, r.stderr
    said = [f["summary"] for f in json.loads(r.stdout)["findings"] if f["id"] == "fabric.deep.figure"]
    assert any("GPU 0: deep measurement failed" in s for s in said), said  # the child ran and answered (no libcuda)
    assert not imported(marker), f"the measuring child imported the working directory's {imported(marker)}"


def test_release_verifies_with_the_child_isolated(tmp_path):
    """`release` runs the deep tier as its verification (policy.verify.deep: on): the same child, the same rule."""
    cwd, marker, env = world(tmp_path)
    inv = tmp_path / "inventory.yaml"  # root's, in root's directory
    inv.write_text("hosts:\n  here: {address: local}\npolicy:\n  verify: {deep: 'on', serving: 'off'}\n")
    r = gpudoctor("release", "local", "-i", inv, "--recovery-file", tmp_path / "recovery.json", "--json", cwd=cwd,
                  env=env, timeout=120)
    assert "Traceback" not in r.stderr, r.stderr
    doc = json.loads(r.stdout)
    assert r.returncode == 1 and not doc["released"], doc  # no GPU here: the verification fails, and says why
    assert "GPU 0: deep measurement failed" in doc["verification"]["reason"], doc  # the child ran (positive control)
    assert not imported(marker), f"the measuring child imported the working directory's {imported(marker)}"


def test_every_local_command_starts_in_the_root_directory(tmp_path, monkeypatch):
    """LocalHost.run starts every command in / (host/local.py), whatever directory root stood in."""
    from gpudoctor.host.local import LocalHost

    monkeypatch.chdir(tmp_path)
    assert LocalHost().run(["pwd"], timeout=10).stdout.strip() == "/"
