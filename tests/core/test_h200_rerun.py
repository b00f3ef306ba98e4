"""Issue #13 on real captured data: the H200 re-run of 2026-12-01 (tools/h200_rerun.sh; raw outputs in
tests/fixtures/captures/h200-rerun-13/). Each snapshot replays through today's gather and checks.

h200-user-healthy-607fb59.json was taken by gpudoctor at 607fb59 as an ordinary user (uid 1001): that code replays it
to WARN (exit 1, open(nvidia-cap1) EACCES as root cause); today's code to ok (exit 0)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpudoctor import snapshot

from gpudoctor.target import snapshot_facts
from gpudoctor.diagnose import diagnose
from gpudoctor.gate import evaluate, resolve_profile
from gpudoctor.remedies.bench_orphans import StopOrphanServers
from gpudoctor.remedy import RemedyContext

from .conftest import SNAPSHOTS


def _diag(name):
    facts = snapshot_facts(snapshot.load(str(SNAPSHOTS / f"{name}.json")))
    return facts, diagnose(facts)


@pytest.mark.parametrize("name", ["h200-user-healthy", "h200-user-healthy-607fb59"])
def test_an_ordinary_user_on_a_healthy_h200_is_ok(name):
    facts, d = _diag(name)
    assert facts["devices"]["identity"]["uid"] == 1001
    assert d.exit_code == 0 and d.root_cause is None
    by = d.by_key()
    cap1 = by["devices.node.open[/dev/nvidia-caps/nvidia-cap1]"]
    assert cap1.status.value == "info" and cap1.data["by_design"] and "MIG config capability" in cap1.summary
    assert "uid 1001 does not hold it" in cap1.summary
    cap2 = by["devices.node.open[/dev/nvidia-caps/nvidia-cap2]"]
    if name.endswith("607fb59"):  # that gpudoctor opened it O_RDWR: refused to a user, by design
        assert cap2.status.value == "info" and any("recorded with an O_RDWR open" in e for e in cap2.evidence)
    else:  # opened read-only, as its consumer does: the monitor capability is everyone's
        assert cap2.status.value == "ok" and "open(/dev/nvidia-caps/nvidia-cap2, O_RDONLY) → ok" in cap2.evidence
    assert all(by[f"devices.node.open[{p}]"].status.value == "ok"
               for p in ("/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"))


def test_the_user_is_told_what_it_cannot_see():
    _, d = _diag("h200-user-healthy")
    by = d.by_key()
    priv = by["host.privileges"]
    assert priv.status.value == "info" and priv.summary.startswith("Probes run as uid 1001 (not root)")
    text = " ".join(priv.evidence)
    for words in ("PCIe config space past its first 64 bytes", "nvidia-cap1 is 0400 root", "/proc/PID/fd",
                  "kernel.dmesg_restrict = 1"):
        assert words in text
    # every kind is named where a reader sees it: the summary, and each on its own line under `check -a` (#49: the
    # row showed 3 evidence lines, the uid and 2 of the 4)
    for short in ("PCIe config space past 64 bytes", "the MIG config capability", "other users' GPU processes",
                  "the kernel log (XIDs)"):
        assert short in priv.summary
    r = subprocess.run([sys.executable, "-m", "gpudoctor", "check", "--snapshot",
                        str(SNAPSHOTS / "h200-user-healthy.json"), "-a"], capture_output=True, text=True, timeout=60)
    row = r.stdout[r.stdout.index("host.privileges"):].splitlines()
    assert sum(ln.strip().startswith("cannot see: ") for ln in row[:8]) == 4, r.stdout
    xid = by["driver.xid"]
    assert xid.status.value == "info" and "Could not read the kernel log (kernel.dmesg_restrict = 1" in xid.summary
    assert xid.evidence[:1] == ["/dev/kmsg → EPERM"]
    assert "64 bytes" in by["fabric.pcie.mrrs[0000:00:06.0]"].summary


def test_root_reads_the_h200_kernel_log_and_finds_no_xid():
    _, d = _diag("h200-root-healthy-kmsg")
    x = d.by_key()["driver.xid"]
    assert x.status.value == "ok" and x.summary == "No Xid in the kernel log (since boot)"
    assert x.evidence[0].startswith("/dev/kmsg: ") and "records read" in x.evidence[0]
    assert d.by_key()["driver.recovery_action[GPU 0 (00000000:00:06.0)]"].status.value == "ok"
    assert d.by_key()["host.privileges"].status.value == "ok" and d.exit_code == 0


@pytest.mark.parametrize("name,node", [("h200-uvm-ebpf-denied", "/dev/nvidia-uvm"), ("h200-ctl-ebpf-denied", "/dev/nvidia0")])
def test_the_ebpf_eperm_names_the_cgroup_and_its_device_program(name, node):
    _, d = _diag(name)
    f = d.by_key()[f"devices.node.open[{node}]"]
    assert f.status.value == "fail" and f.data["errno"] == "EPERM" and d.exit_code == 2
    cg = f.data["cgroup"]
    assert cg["v2_path"].startswith("/sys/fs/cgroup/") and "gpudoctor-cgdev-" in cg["v2_path"]
    assert cg["device_programs"] and cg["attached"] == [{"path": cg["v2_path"], "ids": cg["device_programs"]}]
    proof = f"cgroup2 {cg['v2_path']}: BPF_CGROUP_DEVICE program id(s) {cg['device_programs'][0]}"
    assert any(e.startswith(proof) for e in f.evidence)
    # whichever finding ranks as the root cause (on this Docker-style host: the container's device rules) shows it too
    assert any(e.startswith(proof) for e in d.root_cause.evidence), d.root_cause.key


def test_20_gib_held_by_another_user_is_named_gated_and_refused():
    facts, d = _diag("h200-busy-20g")
    p = [f for f in d.findings if f.id == "workload.gpu.processes"]
    assert len(p) == 1
    f = p[0]
    assert f.summary == "pid 1551 (gpuser) holds 20.6 GiB on GPU 0: python3 /tmp/hold.py 20"
    assert f.data["used_mib"] > 20 * 1024 and f.data["user"] == "gpuser"
    assert "/proc/1551/fd: /dev/nvidia-caps/nvidia-cap2, /dev/nvidia-uvm, /dev/nvidia0, /dev/nvidiactl" in f.evidence
    assert d.exit_code == 0
    g = evaluate(d, resolve_profile("benchmark"))
    assert g.exit_code == 2
    mem = next(b for b in g.blockers if b.key == "workload.gpu.foreign_memory[GPU 0 (00000000:00:06.0)]")
    assert mem.status == "fail" and "20.6 GiB held by pid 1551 gpuser" in mem.summary
    r = StopOrphanServers()
    assert r.plan(facts, RemedyContext()) is None
    assert r.refusal.startswith("not stopping pid 1551 (gpuser) python3 /tmp/hold.py 20: not a server gpudoctor's "
                                "bench started")


def test_an_orphaned_server_beside_it_is_the_only_one_planned_for_stopping():
    facts, d = _diag("h200-busy-orphan")
    o = d.by_key()["workload.bench.orphan[pid 2110]"]
    assert o.status.value == "warn" and o.data["owner"] == "vm:2109:4180" and o.data["label"] == "tp1-old"
    assert d.root_cause.key == o.key and d.exit_code == 1
    port = d.by_key()["workload.port.serving[port 30000]"]
    assert port.data["in_use_by_other"] and port.data["pids"] == [2110]
    g = evaluate(d, resolve_profile("benchmark"))
    assert {"workload.port.serving[port 30000]", "workload.gpu.foreign_memory[GPU 0 (00000000:00:06.0)]"} <= {
        b.key for b in g.blockers}
    change = StopOrphanServers().plan(facts, RemedyContext())
    assert [s["pid"] for s in change.data["servers"]] == [2110] and "left alone, not ours: 1551" in change.diff


@pytest.mark.parametrize("name", ["h200-user-healthy", "h200-user-healthy-607fb59", "h200-root-healthy-kmsg",
                                  "h200-uvm-ebpf-denied", "h200-ctl-ebpf-denied", "h200-busy-20g", "h200-busy-orphan",
                                  "h200-model-truncated"])
def test_every_rerun_diagnosis_fits_the_json_schema(name):
    import json

    import jsonschema

    schema = json.loads((SNAPSHOTS.parents[2] / "gpudoctor" / "data" / "check.schema.json").read_text())
    jsonschema.validate(_diag(name)[1].to_json(), schema)
