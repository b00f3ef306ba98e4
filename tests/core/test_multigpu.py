"""Fabric checks on real captures from a 2-GPU H200 host (NVLink NV18), healthy and with injected faults."""

import json

import pytest

from gpudoctor import snapshot

from gpudoctor.target import snapshot_facts
from gpudoctor.diagnose import diagnose
from gpudoctor.gather.fabric import parse_topo, tp_groups

from .conftest import SNAPSHOTS, capture


def x2(name="h200x2-healthy"):
    return diagnose(snapshot_facts(snapshot.load(str(SNAPSHOTS / f"{name}.json"))))


def test_two_gpus_each_with_full_width_and_mrrs():
    d = x2()
    assert d.exit_code == 0
    assert d.by_key()["driver.gpu.count"].summary.startswith("2 GPU(s) visible")
    widths = [f for f in d.findings if f.id == "driver.pcie.width"]
    assert len(widths) == 2 and all(f.status.value == "ok" and "x16" in f.summary for f in widths)
    mrrs = {f.subject: f.data for f in d.findings if f.id == "fabric.pcie.mrrs"}
    assert mrrs == {"0000:00:06.0": {"mrrs": 4096, "mps": 256}, "0000:00:07.0": {"mrrs": 4096, "mps": 256}}


def test_nvlink_pair_p2p_and_tp_advice():
    d = x2()
    by = d.by_key()
    assert by["fabric.topo.p2p"].status.value == "ok" and by["fabric.topo.p2p"].evidence == ["GPU0-GPU1: OK"]
    assert by["fabric.topo.cross_numa"].status.value == "ok"
    assert "TP2: 0,1 — worst link NV18, NUMA 0" in by["fabric.topo.tp_groups"].evidence
    numa = [f for f in d.findings if f.id == "fabric.numa.gpu_node"]
    assert len(numa) == 2 and all(f.status.value == "info" for f in numa)  # a VM: numa_node -1


def test_raw_topology_captures_parse():
    t = parse_topo(capture("h200x2", "nvidia-smi-topo.txt"))
    assert t["gpus"] == ["GPU0", "GPU1"] and t["pairs"] == {"GPU0-GPU1": "NV18", "GPU1-GPU0": "NV18"}
    assert tp_groups(t, 2) == [{"gpus": ["GPU0", "GPU1"], "worst_link": "NV18", "numa_nodes": ["0"]}]
    assert parse_topo(capture("h200x2", "nvidia-smi-topo-p2p.txt"))["pairs"] == {"GPU0-GPU1": "OK", "GPU1-GPU0": "OK"}


@pytest.mark.parametrize("name,code,root", [
    ("h200x2-uvm-blocked", 2, "devices.node.major[/dev/nvidia-uvm]"),
    ("h200x2-ctl-blocked", 2, "devices.node.major[/dev/nvidiactl]"),
    ("h200x2-uvm-stale-major", 2, "devices.node.major[/dev/nvidia-uvm]"),
    ("h200x2-uvmtools-000", 1, "devices.node.mode[/dev/nvidia-uvm-tools]"),
])
def test_faults_on_the_two_gpu_host(name, code, root):
    d = x2(name)
    assert d.exit_code == code and d.root_cause.key == root


def test_measured_tp2_allreduce_on_nvlink():
    """The numbers `gpudoctor check --deep` printed on the 2-GPU host (docs/h200x2/check-deep.json)."""
    doc = json.loads((SNAPSHOTS.parents[2] / "docs" / "h200x2" / "check-deep.json").read_text())
    (f,) = [f for f in doc["fabric"] if f["key"].startswith("fabric.nccl.allreduce")]
    assert f["key"] == "fabric.nccl.allreduce[TP2:0,1]" and f["status"] == "info"
    assert 150 < f["data"]["busbw_gbs"] < 900  # NVLink-class, not PCIe (~50 GB/s)
    facts = {"deep": {"groups": [{"tp": 2, "gpus": ["GPU0", "GPU1"], "worst_link": "NV18", "numa_nodes": ["0"],
                                  "bytes": 256 << 20, "iters": 20, "seconds_per_op": (256 << 20) / f["data"]["algbw_gbs"] / 1e9,
                                  "algbw_gbs": f["data"]["algbw_gbs"], "busbw_gbs": f["data"]["busbw_gbs"],
                                  "nccl": "2.28.9"}]}, "meta": {"context": {"policy": {"min_busbw_gbs": 400}}}}
    again = diagnose(facts).by_key()["fabric.nccl.allreduce[TP2:0,1]"]
    assert again.status.value == "warn" and f"{f['data']['busbw_gbs']:.1f} GB/s" in again.summary
