"""Blame follows the cause on real H200 captures (#19, #13 item 2): filtered views keep the full ranking, the
cgroup2 eBPF denials of 2026-12-01 keep their root cause."""

import copy
import io
import json
from pathlib import Path

import jsonschema
from gpudoctor.term import Styled

from gpudoctor import snapshot

from gpudoctor.target import snapshot_facts
from gpudoctor.diagnose import diagnose
from gpudoctor.report import render

from .conftest import SNAPSHOTS

H200_1201 = Path(__file__).resolve().parents[1] / "fixtures" / "captures" / "h200-2026-12-01"
SCHEMA = json.loads((SNAPSHOTS.parents[2] / "gpudoctor" / "data" / "check.schema.json").read_text())


def _no_driver_facts():
    """The healthy H200 with its driver unloaded: no /proc/driver/nvidia, no nvidia modules, no nodes."""
    f = copy.deepcopy(snapshot_facts(snapshot.load(str(SNAPSHOTS / "h200-healthy.json"))))
    f["host"]["modules"] = {"error": None, "nvidia": []}
    f["host"]["driver_version_file"] = {"error": "ENOENT"}
    for name in ("nvidia", "nvidiactl", "nvidia-uvm", "nvidia-caps"):
        f["host"]["proc_devices"]["char"].pop(name, None)
    f["devices"]["nodes"] = {}
    return f


def _text(d) -> str:
    buf = io.StringIO()
    render(d, Styled(buf, width=200, color=False))
    return buf.getvalue()


def test_only_devices_keeps_the_full_ranking_and_says_the_cause_is_outside():
    facts = _no_driver_facts()
    full = diagnose(facts)
    view = diagnose(facts, {"devices"})
    assert full.root_cause.key == "host.driver.loaded"
    assert view.root_cause.key == full.root_cause.key  # not devices.node.present
    present = [f for f in view.findings if f.id == "devices.node.present" and f.bad]
    assert present and all(f.blocked_by == "host.driver.loaded" for f in present)
    assert {f.layer for f in view.findings} == {"devices"}
    out = _text(view)
    assert "Root cause host.driver.loaded (layer host, outside --only devices)" in out
    doc = view.to_json()
    jsonschema.validate(doc, SCHEMA)
    assert doc["only_layers"] == ["devices"] and doc["causes_outside_filter"][0] == "host.driver.loaded"
    assert doc["root_cause"]["key"] == "host.driver.loaded"


def test_only_a_layer_with_its_own_root_cause_is_unchanged():
    d = diagnose(snapshot_facts(snapshot.load(str(SNAPSHOTS / "h200-uvm-blocked.json"))), {"devices"})
    assert d.root_cause.key == "devices.node.major[/dev/nvidia-uvm]" and d.outside == []
    assert "outside --only" not in _text(d)


def test_cgroup2_denied_uvm_on_the_h200_names_the_node_and_ties_cuda_to_it():
    d = diagnose(snapshot_facts(snapshot.load(str(H200_1201 / "h200-uvm-cgroup2-denied.json"))))
    by = d.by_key()
    node = by["devices.node.open[/dev/nvidia-uvm]"]
    assert "EPERM" in node.summary
    # the boundary that explains the node's EPERM (the container's device rules) outranks the node, else the node
    assert d.root_cause is node or (d.root_cause.layer == "boundary" and node.blocked_by == d.root_cause.key)
    assert by["cuda.init"].blocked_by == d.root_cause.key
    assert by["driver.nvml.init"].status.value == "ok"


def test_cgroup2_denied_ctl_nvml_255_says_what_nvidia_smi_printed():
    d = diagnose(snapshot_facts(snapshot.load(str(H200_1201 / "h200-ctl-cgroup2-denied.json"))))
    nvml = d.by_key()["driver.nvml.init"]
    assert "NVML_ERROR_rc" not in nvml.summary and "nvidia-smi exited 255" in nvml.summary
    assert "Unknown Error" in nvml.summary
    assert nvml.blocked_by == d.root_cause.key and d.root_cause.layer in ("boundary", "devices")


def test_a_missing_node_does_not_explain_an_eperm_on_a_present_one():
    """The H200 with c 195:* denied (a Docker/OCI container), and /dev/nvidia-uvm also gone: the container's device
    rules stay the cause of the EPERM on the 195 nodes, not a symptom of the missing uvm node."""
    facts = copy.deepcopy(snapshot_facts(snapshot.load(str(H200_1201 / "h200-ctl-cgroup2-denied.json"))))
    facts["devices"]["nodes"]["/dev/nvidia-uvm"] = {"exists": False, "error": "ENOENT", "path": "/dev/nvidia-uvm"}
    d = diagnose(facts)
    by = d.by_key()
    rules = by.get("boundary.container.device_rules")
    assert rules is not None and rules.status.value == "fail" and rules.blocked_by is None
    assert by["devices.node.present[/dev/nvidia-uvm]"].status.value == "fail"
    assert by["devices.node.open[/dev/nvidia0]"].blocked_by == rules.key
