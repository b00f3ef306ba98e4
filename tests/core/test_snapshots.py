"""Every real H200 snapshot replays offline to the verdict it had on the machine (docs/h200/*.check.txt)."""

import json
import re

import jsonschema
import pytest

from gpudoctor import snapshot

from gpudoctor.target import snapshot_facts
from gpudoctor.diagnose import diagnose

from .conftest import SNAPSHOTS

SCHEMA = json.loads((SNAPSHOTS.parents[2] / "gpudoctor" / "data" / "check.schema.json").read_text())

# name -> (exit code, root-cause key or None, words the root cause or chain must contain)
CASES = {
    "h200-healthy": (0, None, []),
    "h200-uvm-blocked": (2, "devices.node.major[/dev/nvidia-uvm]", ["1:3", "238:0", "NVML ok", "999"]),
    "h200-ctl-blocked": (2, "devices.node.major[/dev/nvidiactl]", ["195:255", "code 17", "CUDA_ERROR_NO_DEVICE"]),
    "h200-uvmtools-000": (1, "devices.node.mode[/dev/nvidia-uvm-tools]", ["0000"]),
    "h200-uvm-stale-major": (2, "devices.node.major[/dev/nvidia-uvm]", ["509:0", "ENXIO", "999"]),
    "h200-uvm-missing": (1, "devices.node.present[/dev/nvidia-uvm]", ["cuInit still succeeded"]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_snapshot_replays_to_its_verdict(name):
    code, root, words = CASES[name]
    doc = snapshot.load(str(SNAPSHOTS / f"{name}.json"))
    d = diagnose(snapshot_facts(doc))
    assert d.exit_code == code
    assert (d.root_cause.key if d.root_cause else None) == root
    text = " ".join([d.root_cause.summary, *d.root_cause.evidence, *d.chain]) if d.root_cause else ""
    for w in words:
        assert w in text
    jsonschema.validate(d.to_json(), SCHEMA)


def _recorded_part(recorded, again):
    """`again` cut down to the keys `recorded` has, at every level of nested mappings."""
    if isinstance(recorded, list) and isinstance(again, list) and len(recorded) == len(again):
        return [_recorded_part(a, b) for a, b in zip(recorded, again)]
    if not isinstance(recorded, dict) or not isinstance(again, dict):
        return again
    return {k: _recorded_part(v, again.get(k)) for k, v in recorded.items()}


def test_replayed_facts_equal_recorded_facts():
    doc = snapshot.load(str(SNAPSHOTS / "h200-uvm-blocked.json"))
    again = snapshot_facts(doc)
    for key in ("host", "driver", "devices", "cuda", "workload"):
        a, b = dict(doc["facts"][key]), dict(again[key])
        for x in (a, b):
            x.pop("duration_s", None)
        assert _recorded_part(a, b) == a, key  # every recorded fact is reproduced (newer gathers add keys)


def test_uvm_blocked_names_the_node_not_cuda_unknown_error():
    d = diagnose(snapshot_facts(snapshot.load(str(SNAPSHOTS / "h200-uvm-blocked.json"))))
    cuda = next(f for f in d.findings if f.id == "cuda.init")
    assert cuda.status.value == "fail" and cuda.blocked_by == "devices.node.major[/dev/nvidia-uvm]"
    nvml = next(f for f in d.findings if f.id == "driver.nvml.init")
    assert nvml.status.value == "ok"
    assert d.chain[0] == "NVML ok" and d.chain[-1].startswith("root cause: /dev/nvidia-uvm is 1:3")


def test_ctl_blocked_names_nvml_17_as_a_symptom():
    d = diagnose(snapshot_facts(snapshot.load(str(SNAPSHOTS / "h200-ctl-blocked.json"))))
    nvml = next(f for f in d.findings if f.id == "driver.nvml.init")
    assert nvml.data["nvml_code"] == 17 and "blocked by the operating system" in nvml.summary
    assert nvml.blocked_by == "devices.node.major[/dev/nvidiactl]"


def test_healthy_reports_real_values():
    d = diagnose(snapshot_facts(snapshot.load(str(SNAPSHOTS / "h200-healthy.json"))))
    by = d.by_key()
    assert by["fabric.pcie.mrrs[0000:00:06.0]"].data == {"mrrs": 4096, "mps": 256}
    assert by["fabric.numa.gpu_node[0000:00:06.0]"].status.value == "info"
    assert re.match(r"cuInit ok: 1 device", by["cuda.init"].summary)


def test_expect_gpus_mismatch_fails():
    facts = snapshot_facts(snapshot.load(str(SNAPSHOTS / "h200-healthy.json")))
    facts["meta"]["context"]["expect_gpus"] = 8
    d = diagnose(facts)
    assert d.exit_code == 2 and d.root_cause.key == "driver.gpu.count"
    assert "1 GPU(s) visible, 8 expected" in d.root_cause.summary


def test_mrrs_policy_turns_report_into_audit():
    facts = snapshot_facts(snapshot.load(str(SNAPSHOTS / "h200-healthy.json")))
    facts["meta"]["context"]["policy"] = {"pcie": {"mrrs": 512}}
    f = diagnose(facts).by_key()["fabric.pcie.mrrs[0000:00:06.0]"]
    assert f.status.value == "warn" and "4096 ≠ policy 512" in f.summary and f.remedy == "fabric.pcie.mrrs"


def test_allreduce_findings_from_deep_facts():
    facts = {"deep": {"groups": [
        {"tp": 4, "gpus": ["GPU0", "GPU1", "GPU2", "GPU3"], "worst_link": "NODE", "numa_nodes": ["0"], "bytes": 256 << 20,
         "iters": 20, "seconds_per_op": 0.004, "algbw_gbs": 67.1, "busbw_gbs": 100.7, "nccl": "2.28.3"},
        {"tp": 4, "gpus": ["GPU4", "GPU5", "GPU6", "GPU7"], "worst_link": "NODE", "numa_nodes": ["1"], "bytes": 256 << 20,
         "iters": 20, "error": "rank probe rc 1: ModuleNotFoundError: No module named 'torch'"}]},
        "meta": {"context": {"policy": {"min_busbw_gbs": 150}}}}
    by = diagnose(facts).by_key()
    ok = by["fabric.nccl.allreduce[TP4:0,1,2,3]"]
    assert ok.status.value == "warn" and "100.7 GB/s" in ok.summary and "NVLS off" in ok.evidence[0]
    bad = by["fabric.nccl.allreduce[TP4:4,5,6,7]"]
    assert bad.status.value == "unknown" and "torch" in bad.evidence[0]
    empty = diagnose({"deep": {"groups": [], "note": "no GPUs"}, "meta": {"context": {}}}).by_key()
    assert empty["fabric.nccl.allreduce"].status.value == "unknown"


def test_single_gpu_allreduce_is_a_code_path_check_not_a_bandwidth():
    # As measured on the H200 (docs/h200/deep-tp1.txt): one rank, NCCL 2.28.9.
    facts = {"deep": {"groups": [{"tp": 1, "gpus": ["GPU0"], "worst_link": "X", "numa_nodes": [], "bytes": 256 << 20,
                                  "iters": 20, "seconds_per_op": 3.1e-05, "algbw_gbs": 8639.7, "busbw_gbs": 0.0,
                                  "nccl": "2.28.9"}]}, "meta": {"context": {}}}
    f = diagnose(facts).by_key()["fabric.nccl.allreduce[TP1:0]"]
    assert f.status.value == "info" and "no bus traffic" in f.summary
