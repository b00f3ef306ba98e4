"""Boundary gather from a fake Proxmox root (real files, real mknod nodes, a real `pct` stand-in), the registered
checks, the diagnosis of the seed's scenario, and snapshot record/replay of the Proxmox side."""

import copy
import json
import os
from pathlib import Path

from gpudoctor.diagnose import diagnose
from gpudoctor.findings import Status
from gpudoctor.gather import gather
from gpudoctor.gather.context import GatherContext
from gpudoctor.host.local import LocalHost
from gpudoctor.host.replay import RecordingHost, ReplayHost
from gpudoctor.proxmox import pct

from tests import needs

from .conftest import install

SNAPSHOTS = Path(__file__).resolve().parents[1] / "fixtures" / "snapshots"


def mknods(root, uvm=511):
    needs.root()  # mknod
    (root / "dev/nvidia-caps").mkdir(parents=True)
    for name, major, minor in (("nvidia0", 195, 0), ("nvidiactl", 195, 255), ("nvidia-uvm", uvm, 0),
                               ("nvidia-uvm-tools", uvm, 1)):
        os.mknod(root / "dev" / name, 0o20666, os.makedev(major, minor))


def proxmox(root, bindir, name="kpro6"):
    return LocalHost(name=name, root=str(root), path_prepend=[str(bindir)])


def test_gather_finds_the_vmid_by_hostname_and_reads_everything(pve_root, fake_pct):
    bindir, state = fake_pct
    install(pve_root, 200, "200-seed.conf")
    mknods(pve_root)
    (pve_root / "var/lib/lxc/200").mkdir()
    (pve_root / "var/lib/lxc/200/config").write_text("lxc.cgroup2.devices.allow = c 195:* rwm\n")
    b = gather(LocalHost(), GatherContext(name="ct200", proxmox=proxmox(pve_root, bindir)), only={"boundary"})["boundary"]
    assert b["vmid"] == 200 and b["vmid_source"].startswith("$ pct list → 200 running ct200")
    assert b["config"]["path"] == "/etc/pve/lxc/200.conf" and "c 509:* rwm" in b["config"]["text"]
    assert b["config"]["readonly"] is False
    assert "511 nvidia-uvm" in b["proc_devices"]["text"]
    assert b["running"]["text"].startswith("lxc.cgroup2") and b["status"]["status"] == "running"
    assert b["host_nodes"]["/dev/nvidia-uvm"]["major"] == 511
    assert b["host_nodes"]["/dev/nvidia-caps"]["kind"] == "dir"
    json.dumps(b)  # facts are plain JSON


def test_not_an_lxc_target_and_unknown_container(pve_root, fake_pct):
    bindir, _ = fake_pct
    b = gather(LocalHost(), GatherContext(name="gpu1"), only={"boundary"})["boundary"]
    assert b["applicable"] is False
    facts = {"boundary": b, "host": {"container": {"kind": "lxc", "evidence": []}}}
    f = [x for x in diagnose(facts).findings if x.id.startswith("boundary.")]
    assert [(x.id, x.status) for x in f] == [("boundary.lxc.config", Status.INFO)]
    b = gather(LocalHost(), GatherContext(name="ct999", proxmox=proxmox(pve_root, bindir)), only={"boundary"})["boundary"]
    assert "no container named ct999 (200 ct200, 201 ct201)" in b["error"]
    f = [x for x in diagnose({"boundary": b}).findings if x.id.startswith("boundary.")]
    assert [(x.id, x.status) for x in f] == [("boundary.lxc.config", Status.UNKNOWN)]


def seed_facts(pve_root, bindir):
    """The seed's hour: the guest sees cuInit 999 and EPERM on /dev/nvidia-uvm; the host config allows 509 not 511."""
    doc = json.loads((SNAPSHOTS / "h200-healthy.json").read_text())
    f = copy.deepcopy(doc["facts"])
    f["host"]["container"] = {"kind": "lxc", "evidence": ["/proc/1/environ has container=lxc"]}
    f["host"]["proc_devices"]["char"]["nvidia-uvm"] = 511
    for p, minor in (("/dev/nvidia-uvm", 0), ("/dev/nvidia-uvm-tools", 1)):
        f["devices"]["nodes"][p].update(major=511, minor=minor, open="EPERM")
    f["cuda"].update(cuinit=999, cuinit_name="CUDA_ERROR_UNKNOWN", device_count=-1)
    install(pve_root, 200, "200-seed.conf")
    mknods(pve_root)
    ctx = GatherContext(name="ct200", vmid=200, proxmox=proxmox(pve_root, bindir))
    f["boundary"] = gather(LocalHost(), ctx, only={"boundary"})["boundary"]
    return f, ctx


def test_seed_scenario_diagnosis_names_the_missing_511_rule_as_root_cause(pve_root, fake_pct):
    bindir, _ = fake_pct
    facts, _ = seed_facts(pve_root, bindir)
    d = diagnose(facts)
    root = d.root_cause
    assert root.key == "boundary.lxc.cgroup_allow[/dev/nvidia-uvm]"
    assert "major 511 (nvidia-uvm) is not in ct200's allow-list (has 195, 509, 226, 234)" in root.evidence
    assert root.data["fix_line"] == "lxc.cgroup2.devices.allow: c 511:* rwm" and root.remedy == "lxc.cgroup_allow"
    by = d.by_key()
    assert by["devices.node.open[/dev/nvidia-uvm]"].blocked_by == root.key
    assert by["cuda.init"].blocked_by == root.key
    assert any("999" in c for c in d.chain) and d.chain[-1].startswith("root cause: /dev/nvidia-uvm: major 511")
    assert by["boundary.lxc.config"].status == Status.OK


def test_proxmox_side_records_and_replays(pve_root, fake_pct):
    bindir, _ = fake_pct
    _, ctx = seed_facts(pve_root, bindir)
    rec = RecordingHost(inner=ctx.proxmox)
    live = gather(LocalHost(), GatherContext(name="ct200", vmid=200, proxmox=rec), only={"boundary"})["boundary"]
    replay = ReplayHost(name="kpro6", transcript=json.loads(json.dumps(rec.transcript)))
    again = gather(LocalHost(), GatherContext(name="ct200", vmid=200, proxmox=replay), only={"boundary"})["boundary"]
    assert again == live


def test_pct_list_and_find():
    text = ("VMID       Status     Lock         Name                \n"
            "200        running                 ct200               \n"
            "201        stopped    backup       ct201               \n")
    gs = pct.parse_list(text)
    assert [(g.vmid, g.status, g.lock, g.name) for g in gs] == [(200, "running", "", "ct200"),
                                                               (201, "stopped", "backup", "ct201")]
    assert pct.parse_list("garbage\n") == []


def test_find_vmid_short_name_and_ambiguity(fake_pct):
    bindir, state = fake_pct
    h = LocalHost(path_prepend=[str(bindir)])
    assert pct.find_vmid(h, "ct200.lab.example")[0] == 200
    (state / "list").write_text("VMID Status Lock Name\n200 running ct200\n300 running ct200\n")
    vmid, ev = pct.find_vmid(h, "ct200")
    assert vmid is None and "2 containers named ct200: 200, 300" in ev


def test_reboot_that_never_comes_back_is_reported(fake_pct):
    bindir, state = fake_pct
    script = bindir / "pct"
    script.write_text(script.read_text().replace("(sleep 0.3; echo running > $S/status) &", "true"))
    res = pct.safe_reboot(LocalHost(path_prepend=[str(bindir)]), 200, wait_s=1.5, poll_s=0.2)
    assert not res.done and "not running after 1.5 s (last status: stopped)" in res.message
