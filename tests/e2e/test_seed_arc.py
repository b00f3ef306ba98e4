"""The seed's arc in one run on the real LXC lab (tests/lxclab.py): a campaign against the SGLang stand-in inside the
real container ct200; mid-campaign a driver update moves nvidia-uvm's major out of ct200's allow list and ct200
reboots (its /dev/shm tmpfs, with the staged model, goes with it; at once, or down for 4 s so that SSH is refused); gpudoctor judges ct200 through the one pipeline,
heals it (the allow line added to /etc/pve/lxc/200.conf on the Proxmox node, the real container restarted through
pct, the model restaged from its persistent source inside ct200) and the campaign completes with every record exactly
once; the same campaign with healing disallowed stops with one line naming the root cause and the command.

Real: LXC, the kernel's cgroup2 device program (which refuses the moved major until the config allows it), sshd in
ct200 and on the node, the campaign runner and its SSH launcher, the healer with the daemon's engine over SSH, the
remedies lxc.cgroup_allow (+ reboot) and model.stage (`gpudoctor model stage` run inside ct200), the stand-in server
process inside ct200 (this machine's interpreter and gpudoctor, bind-mounted read-only at the same paths, as the lab
binds /usr). The server's failure is causal: it opens /dev/nvidia-uvm and reads the model's config.json at start
(--require-device, --require-model) and dies with SGLang's real log lines when the kernel refuses or the file is gone.
Stands in: the GPU driver (the lab's shim answers the moved major once the device program lets the open through),
Proxmox's pct (tests/standins/pct.py), the driver update itself (LxcLab.move_uvm: the node's nodes and /proc/devices).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import gpudoctor
from gpudoctor.campaign.runner import CampaignStopped, run_campaign
from tests.lxclab import MOVED_UVM_MAJOR, UVM_MAJOR, fixed
from tests.model.modelfiles import write_model

SOURCE = "/root/models/arc-tiny"  # persistent storage inside ct200 (its rootfs)
MODEL = "/dev/shm/arc-tiny"  # tmpfs inside ct200: a restart wipes it
RUNS = "/root/arc-runs"


def _shared_dirs() -> list[str]:
    """What ct200 needs to run this machine's interpreter and gpudoctor: their directories outside /usr."""
    dirs = {sys.base_prefix, sys.prefix, str(Path(gpudoctor.__file__).resolve().parents[1])}
    out = []
    for d in sorted(dirs, key=len):
        if d.startswith("/usr/") or any(d == o or d.startswith(o + "/") for o in out):
            continue
        out.append(d)
    return out


def _config(lab) -> bytes:
    """ct200's config before the driver update: uvm's major (7) allowed, this machine's python bind-mounted."""
    mounts = "".join(f"lxc.mount.entry: {d} {d.lstrip('/')} none ro,bind,create=dir 0 0\n" for d in _shared_dirs())
    return fixed(lab.seed) + mounts.encode()


@pytest.fixture
def arc_lab(seed_lab):
    lab = seed_lab
    lab.reset(_config(lab))
    root = lab.rootfs
    gd = root / "bin" / "gpudoctor"  # gpudoctor installed in ct200 (the model.stage remedy runs it there)
    gd.write_text(f"#!/bin/sh\nexec {sys.executable} -m gpudoctor \"$@\"\n")
    gd.chmod(0o755)
    write_model(root / SOURCE.lstrip("/"), shards=2, elems=256)
    r = lab.pct("exec", "200", "--", "gpudoctor", "model", "stage", "--from", SOURCE, "--to", MODEL, "--apply")
    assert r.returncode == 0, r.stdout + r.stderr
    try:
        yield lab
    finally:
        for p in (gd, root / "root" / "models", root / RUNS.lstrip("/"), root / "var" / "lib" / "gpudoctor"):
            if p.is_dir():
                shutil.rmtree(p)
            else:
                p.unlink(missing_ok=True)
        lab.reset()  # uvm back on 7, the seed's config, ct200 restarted from it


def campaign(lab, tmp_path: Path, heal: str) -> Path:
    text = f"""\
name: seed arc
target: ct200
model: {MODEL}
server:
  command: [{sys.executable}, -m, gpudoctor.bench.standin, --decode-tok-s, "400", --ttft-ms, "10", --require-model,
            --require-device, /dev/nvidia-uvm]
  host: 0.0.0.0
  port: 30000
  remote_dir: {RUNS}
gate:
  command: [{sys.executable}, -m, gpudoctor, gate, --profile, benchmark]
tp: [1]
concurrency: [1, 2, 4]
timeouts: {{ready_s: 30, stall_s: 10, stop_s: 5, gpu_release_s: 10}}
workloads:
  - name: chat
    max_tokens: [24]
    num_prompts: 4
methods:
  baseline: {{baseline: true}}
  eagle3: {{args: [--speculative-algorithm, EAGLE3, --accept-length, "3"]}}
{heal}
"""
    path = tmp_path / "arc.yaml"
    path.write_text(text)
    return path


class DriverUpdate:
    """After eagle3's first level: the driver update moves uvm's major and ct200 goes down, as a node rebooting
    after a driver update; it is started again `down_s` later (0: `pct reboot` at once)."""

    def __init__(self, lab, down_s: float = 0.0):
        self.lab, self.down_s, self.done, self.notes = lab, down_s, False, []
        self.init_before = lab.init_pid()
        self.starter: threading.Timer | None = None

    def __call__(self, kind, **kw):
        if kind == "note":
            self.notes.append(kw.get("text", ""))
        rec = kw.get("record") or {}
        if kind == "level_done" and not self.done and rec.get("label") == "eagle3-tp1" and rec.get("status") == "ok":
            self.done = True
            self.lab.move_uvm(MOVED_UVM_MAJOR)
            if not self.down_s:
                r = self.lab.pct("reboot", "200")
                assert r.returncode == 0, r.stderr
                return
            r = self.lab.pct("stop", "200")
            assert r.returncode == 0, r.stderr
            self.starter = threading.Timer(self.down_s, self.lab.pct, ("start", "200"))
            self.starter.start()

    def join(self) -> None:
        if self.starter is not None:
            self.starter.join()


def records(out: Path, name: str = "results.jsonl") -> list[dict]:
    p = out / name
    return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


@pytest.mark.parametrize("down_s", [0.0, 4.0], ids=["reboot-kills-the-server", "down-4s-ssh-refused"])
def test_a_reboot_with_the_uvm_major_moved_heals_and_the_campaign_completes(arc_lab, tmp_path, down_s):
    lab = arc_lab
    path = campaign(lab, tmp_path, "heal: {allow: [lxc.cgroup_allow, lxc.cgroup_allow.reboot, model.stage], "
                                   "wait_s: 30}")
    out = tmp_path / "out"
    update = DriverUpdate(lab, down_s=down_s)
    t0 = time.monotonic()
    try:
        counts = run_campaign(str(path), str(out), inventory=str(lab.inventory), on_event=update)
    finally:
        update.join()
    took = time.monotonic() - t0
    assert update.done
    recs = records(out)
    keys = [(r["label"], r["workload"], r["concurrency"], r["trial"]) for r in recs]
    assert len(keys) == len(set(keys)) == 6, keys  # 2 methods x 3 levels, each exactly once
    assert all(r["status"] == "ok" for r in recs), [(r["label"], r["concurrency"], r["status"], r.get("error"))
                                                     for r in recs]
    assert counts["ok"] == 6
    order = [(r["label"], r["concurrency"], bool(r.get("heal"))) for r in recs]
    assert order == [("baseline-tp1", 1, False), ("baseline-tp1", 2, False), ("baseline-tp1", 4, False),
                     ("eagle3-tp1", 1, False), ("eagle3-tp1", 2, True), ("eagle3-tp1", 4, True)], order
    # the heal: the allow line for the moved major on the node, the container really restarted, the model restaged
    conf = lab.config_file.read_text()
    assert f"lxc.cgroup2.devices.allow: c {MOVED_UVM_MAJOR}:* rwm" in conf, conf
    assert f"lxc.cgroup2.devices.allow: c {UVM_MAJOR}:* rwm" in conf  # nothing else of the config was touched
    assert lab.init_pid() != update.init_before
    assert lab.pct("exec", "200", "--", "test", "-f", f"{MODEL}/config.json").returncode == 0
    (heal,) = records(out, "heals.jsonl")
    assert heal["healthy"] and heal["broken"], heal
    assert all(a["ok"] for a in heal["actions"]), heal["actions"]
    stamped = [r["heal"] for r in recs if r.get("heal")]
    assert all(s["n"] == 1 and "lxc.cgroup_allow" in s["actions"] and "model.stage" in s["actions"]
               for s in stamped), stamped
    retracted = records(out, "retracted.jsonl")
    assert [k[:3] for k in heal["retracted"]] == [[r["label"], r["workload"], r["concurrency"]] for r in retracted]
    if not down_s:  # the reboot killed the server under eagle3's second level: that record measured a broken target
        assert [(r["label"], r["concurrency"], r["status"]) for r in retracted] == [("eagle3-tp1", 2, "crashed")]
        assert retracted[0]["retracted"].startswith("heal 1: the server crashed during workload chat:short:out24 "
                                                    "at concurrency 2 (eagle3-tp1)"), retracted
    else:  # ct200 was gone: the level in flight was never recorded, the healer waited with a countdown
        assert retracted == [] and heal["reason"].startswith("lost ct200 while running eagle3-tp1: "), heal
        assert any(n.startswith("waiting for ct200 to answer: ") and " s left (" in n for n in update.notes), \
            update.notes
    # healing in order: the allow line with the restart first, then the model the restart wiped
    assert [a["remedy"] for a in heal["actions"]] == ["lxc.cgroup_allow", "model.stage"], heal["actions"]
    from gpudoctor.bench.records.report import write_report

    write_report(str(out), plots=False)
    md = (out / "report.md").read_text()
    assert "## Heals" in md and "lxc.cgroup_allow (ok)" in md and "model.stage (ok)" in md, md
    print(f"\narc: campaign with a heal took {took:.1f} s")


def test_with_healing_disallowed_the_campaign_stops_with_the_root_cause_and_the_command(arc_lab, tmp_path):
    lab = arc_lab
    path = campaign(lab, tmp_path, "heal: {allow: [], wait_s: 30}")
    out = tmp_path / "out"
    update = DriverUpdate(lab)
    before = lab.config_file.read_bytes()
    with pytest.raises(CampaignStopped) as e:
        run_campaign(str(path), str(out), inventory=str(lab.inventory), on_event=update)
    line = e.value.one_line()
    assert "\n" not in line and update.done
    # the root cause as the gate names it, the exact command (what healing would have done), then the resume
    assert (f"boundary.lxc.cgroup_allow[/dev/nvidia-uvm]: /dev/nvidia-uvm: major {MOVED_UVM_MAJOR} (nvidia-uvm) is "
            "not allowed by ct200's config") in line, line
    assert line.endswith("; run: gpudoctor fix --host ct200 --only lxc.cgroup_allow --apply --reboot (or let the "
                         "campaign heal it: heal: {allow: [lxc.cgroup_allow, lxc.cgroup_allow.reboot]}), then "
                         f"gpudoctor bench run {path} --out {out} --resume"), line
    assert lab.config_file.read_bytes() == before  # nothing was changed on the node
    recs = records(out)
    assert [(r["label"], r["concurrency"]) for r in recs if r["status"] == "ok"][:4] == [
        ("baseline-tp1", 1), ("baseline-tp1", 2), ("baseline-tp1", 4), ("eagle3-tp1", 1)]
    assert not (out / "retracted.jsonl").exists()
    # the failure is the kernel's, not scripted: a server started in ct200 now really cannot open the moved node
    # (and the model is gone from the wiped tmpfs), and SGLang's log names it
    for model, cause in ((MODEL, "model-path-missing"), (SOURCE, "cuda-unknown-error")):
        r = lab.pct("exec", "200", "--", sys.executable, "-m", "gpudoctor.bench.standin", "--port", "30001",
                    "--model-path", model, "--require-model", "--require-device", "/dev/nvidia-uvm")
        assert r.returncode == 1, r.stdout + r.stderr
        log = tmp_path / f"{cause}.log"
        log.write_text(r.stderr)
        explained = subprocess.run([sys.executable, "-m", "gpudoctor", "sglang", "explain", str(log), "--json"],
                                   capture_output=True, text=True)
        assert explained.returncode == 0 and cause in explained.stdout, explained.stdout + explained.stderr
