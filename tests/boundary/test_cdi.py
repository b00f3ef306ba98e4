"""CDI specs (#14 acceptance 1): parse YAML and JSON as the toolkit and the device plugin write them, audit each
deviceNodes entry against the live /proc/devices and the node on disk, name the stale entry as the root cause when
cuInit fails, and fix it — `nvidia-ctk cdi generate` when present, else the exact edit — with a diff; a second plan
after apply is empty.

Real: the spec files, the nodes (mknod), the edit (gpudoctor.files.edit on a LocalHost root), the audit. Stand-ins: the
H200's /proc/devices (nvidia-uvm at 238) on the host root; `nvidia-ctk` (tests/boundary/standins/nvidia-ctk) prints a
spec file instead of probing a driver.
"""

import copy
import json
import shutil
from pathlib import Path

import pytest

from gpudoctor.boundary import cdi

from gpudoctor import snapshot
from gpudoctor.target import snapshot_facts
from gpudoctor.diagnose import diagnose
from gpudoctor.findings import Status
from gpudoctor.remedies.cdi import CdiSpec
from gpudoctor.remedy import AuditLog, Engine, RemedyContext
from tests.remedies.hostroot import NAME, HostRoot

FIX = Path(__file__).resolve().parents[1] / "fixtures"
CDI = FIX / "cdi"
STANDINS = Path(__file__).resolve().parent / "standins"
YAML = (CDI / "nvidia-uvm-510.yaml").read_text()
JSON = (CDI / "k8s-device-plugin-uvm-510.json").read_text()
ONLY = ("host", "devices", "tools", "cdi", "platform")


# --- parsing -------------------------------------------------------------------------------------------------

def test_toolkit_yaml_is_located_to_the_line():
    s = cdi.parse("/etc/cdi/nvidia.yaml", YAML)
    assert (s.version, s.kind, s.fmt) == ("0.5.0", "nvidia.com/gpu", "yaml")
    assert s.devices == ["0", "GPU-9080faa3-9b06-b30c-4d94-1fbabe49afae", "all"]
    uvm = next(e for e in s.entries if e.path == "/dev/nvidia-uvm")
    assert (uvm.where, uvm.line, uvm.major, uvm.minor, uvm.type) == ("containerEdits.deviceNodes[1]", 6, 510, 0, "c")
    assert YAML.splitlines()[uvm.line - 1].strip() == "- hostPath: /dev/nvidia-uvm"
    gpu = [e for e in s.entries if e.path == "/dev/nvidia0"]
    assert [e.where for e in gpu][-1] == "devices[all].containerEdits.deviceNodes[0]" and gpu[0].major is None


def test_device_plugin_json_on_one_line_is_located_too():
    s = cdi.parse("/var/run/cdi/k8s-device-plugin.json", JSON)
    assert s.fmt == "json" and s.kind == "k8s.device-plugin.nvidia.com/gpu"
    uvm = next(e for e in s.entries if e.path == "/dev/nvidia-uvm")
    start, end = uvm.spans["major"]
    assert JSON[start:end] == "510" and uvm.line == 1


@pytest.mark.parametrize("text,line,words", [
    ((CDI / "broken.yaml").read_text(), 8, "not valid YAML"),
    ('{"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu",\n "devices": [}', 2, "not valid JSON"),
    ("cdiVersion: 0.6.0\nkind: gpu\n", 2, "vendor/class"),
    ("kind: nvidia.com/gpu\n", 1, "no cdiVersion"),
    ("cdiVersion: 0.6.0\nkind: a.com/b\ncontainerEdits:\n  deviceNodes:\n  - path: /dev/x\n    major: five\n", 6,
     "non-negative integer"),
])
def test_bad_specs_name_their_line(text, line, words):
    path = "/etc/cdi/x.json" if text.startswith("{") else "/etc/cdi/x.yaml"
    with pytest.raises(cdi.SpecError) as exc:
        cdi.parse(path, text)
    assert exc.value.line == line and words in str(exc.value)


def test_edit_changes_only_the_digits():
    s = cdi.parse("/etc/cdi/nvidia.yaml", YAML)
    uvm = [e for e in s.entries if e.major == 510]
    out = cdi.edited(YAML, [(e, "major", 238) for e in uvm])
    assert out == YAML.replace("major: 510", "major: 238")


# --- the audit as a diagnosis --------------------------------------------------------------------------------

def stale_container_facts(major=509):
    """The real H200 capture of a container whose /dev/nvidia-uvm is 509:0 (ENXIO, cuInit 999; live uvm 238), with
    the CDI spec it was made from visible at /etc/cdi/nvidia.yaml."""
    f = snapshot_facts(snapshot.load(str(FIX / "snapshots" / "h200-uvm-stale-major.json")))
    f = copy.deepcopy(f)
    f["cdi"] = {"dirs": {"/etc/cdi": ["nvidia.yaml"], "/var/run/cdi": "ENOENT"},
                "specs": [{"path": "/etc/cdi/nvidia.yaml", "text": YAML.replace("major: 510", f"major: {major}"),
                           "error": None}],
                "host_nodes": {}, "nvidia_ctk": None}
    return f


def test_stale_uvm_entry_is_the_root_cause_when_cuinit_fails():
    d = diagnose(stale_container_facts())
    rc = d.root_cause
    assert rc.key == "boundary.cdi.device_nodes[/dev/nvidia-uvm]" and rc.status == Status.FAIL
    text = " ".join([rc.summary, *rc.evidence])
    for w in ("/etc/cdi/nvidia.yaml", "containerEdits.deviceNodes[1]", "major 509", "238", ":6 "):
        assert w in text, w
    by = {f.key: f for f in d.findings}
    assert by["cuda.init"].blocked_by == rc.key and by["devices.node.major[/dev/nvidia-uvm]"].blocked_by == rc.key
    assert d.chain[-1].startswith("root cause: /dev/nvidia-uvm: the CDI spec /etc/cdi/nvidia.yaml")
    assert "999" in " ".join(d.chain)


def test_right_spec_is_ok_and_blames_nothing():
    d = diagnose(stale_container_facts(major=238))
    f = next(x for x in d.findings if x.key == "boundary.cdi.device_nodes[/dev/nvidia-uvm]")
    assert f.status == Status.OK
    assert d.root_cause.key == "devices.node.major[/dev/nvidia-uvm]"


def test_spec_without_numbers_is_judged_by_the_host_node():
    """On the host: the runtime stats the host node at container creation, so a stale or missing node is the fault
    (inside a container its own /dev is not the host's, so a node missing there is not held against the spec)."""
    f = stale_container_facts()
    f["host"]["container"] = {"kind": "bare", "evidence": []}
    f["cdi"]["specs"][0]["text"] = (CDI / "nvidia-generated-238.yaml").read_text().replace(
        "    major: 238\n    minor: 0\n", "").replace("    major: 238\n    minor: 1\n", "")
    f["cdi"]["host_nodes"] = {"/dev/nvidia-uvm": {"exists": True, "kind": "char", "major": 509, "minor": 0},
                              "/dev/nvidia-uvm-tools": {"exists": False, "error": "ENOENT"}}
    out = {x.key: x for x in diagnose(f).findings if x.id == "boundary.cdi.device_nodes"}
    assert out["boundary.cdi.device_nodes[/dev/nvidia-uvm]"].status == Status.FAIL
    assert "takes its numbers from /dev/nvidia-uvm, which is 509:0" in out["boundary.cdi.device_nodes[/dev/nvidia-uvm]"].summary
    assert "missing" in out["boundary.cdi.device_nodes[/dev/nvidia-uvm-tools]"].summary


def test_spec_findings_report_versions_and_bad_files():
    f = stale_container_facts(major=238)
    f["cdi"]["specs"] += [{"path": "/etc/cdi/broken.yaml", "text": (CDI / "broken.yaml").read_text(), "error": None},
                          {"path": "/var/run/cdi/new.yaml", "text": "cdiVersion: 9.0.0\nkind: x.com/y\n", "error": None},
                          {"path": "/etc/cdi/secret.json", "text": None, "error": "EACCES"}]
    out = {x.subject: x for x in diagnose(f).findings if x.id == "boundary.cdi.specs"}
    assert out["/etc/cdi/nvidia.yaml"].status == Status.OK and "CDI 0.5.0" in out["/etc/cdi/nvidia.yaml"].summary
    assert out["/etc/cdi/broken.yaml"].status == Status.WARN and "/etc/cdi/broken.yaml:8" in out["/etc/cdi/broken.yaml"].summary
    assert out["/var/run/cdi/new.yaml"].status == Status.WARN and "9.0.0" in out["/var/run/cdi/new.yaml"].summary
    assert out["/etc/cdi/secret.json"].status == Status.UNKNOWN


# --- the remedy on a real root -------------------------------------------------------------------------------

@pytest.fixture
def host_root(tmp_path, monkeypatch):
    r = HostRoot(tmp_path, uvm_major=238)
    r.healthy_nodes(uvm_major=238)
    r.node("/dev/nvidia-modeset", 195, 254)
    r.write("/etc/cdi/nvidia.yaml", YAML)
    r.write("/var/run/cdi/k8s-device-plugin.json", JSON)
    return r


def engine(r):
    ctx = RemedyContext(hosts={NAME: r.host()}, backup_dir="/var/lib/gpudoctor/backups", timeout=5)
    return Engine([CdiSpec()], ctx, audit_log=AuditLog(str(r.root.parent / "audit.jsonl")),
                  lock_dir=str(r.root.parent / "locks"))


def stale_keys(facts):
    return sorted(f.key for f in diagnose(facts).findings if f.id == "boundary.cdi.device_nodes" and f.bad)


def test_edit_route_plans_a_diff_applies_verifies_and_then_has_nothing_to_do(host_root):
    r = host_root
    facts = r.facts(only=ONLY)
    assert facts["cdi"]["nvidia_ctk"] is None
    assert stale_keys(facts) == ["boundary.cdi.device_nodes[/dev/nvidia-uvm-tools]",
                                 "boundary.cdi.device_nodes[/dev/nvidia-uvm]"]
    before = {p: r.read(p) for p in ("/etc/cdi/nvidia.yaml", "/var/run/cdi/k8s-device-plugin.json")}
    eng = engine(r)
    plan = eng.plan(facts)
    assert len(plan.changes) == 1, plan.to_json()
    ch = plan.changes[0]
    assert "-    major: 510\n+    major: 238\n" in ch.diff and '"major":510' in ch.diff and '"major":238' in ch.diff
    assert r.read("/etc/cdi/nvidia.yaml") == before["/etc/cdi/nvidia.yaml"], "plan writes nothing"
    [out] = eng.apply(plan)
    assert out.result == "applied" and out.verify.status == Status.OK, out.to_json()
    assert r.read("/etc/cdi/nvidia.yaml") == before["/etc/cdi/nvidia.yaml"].replace("major: 510", "major: 238")
    assert r.read("/var/run/cdi/k8s-device-plugin.json") == JSON.replace('"major":510', '"major":238')
    assert out.applied["backup"].startswith("/var/lib/gpudoctor/backups/")
    assert r.read(out.applied["backup"]) in before.values()
    again = r.facts(only=ONLY)
    assert stale_keys(again) == []
    assert engine(r).plan(again).changes == []


def test_generator_route_uses_nvidia_ctk_and_shows_its_diff(host_root, monkeypatch):
    r = host_root
    (r.bin / "nvidia-ctk").unlink(missing_ok=True)  # never write through a symlink into another stand-in
    shutil.copy(STANDINS / "nvidia-ctk", r.bin / "nvidia-ctk")
    monkeypatch.setenv("GPUDOCTOR_STANDIN_CTK_SPEC", str(CDI / "nvidia-generated-238.yaml"))
    facts = r.facts(only=ONLY)
    assert facts["cdi"]["nvidia_ctk"] == str(r.bin / "nvidia-ctk")
    plan = engine(r).plan(facts)
    [ch] = plan.changes
    assert "/etc/cdi/nvidia.yaml (regenerated by nvidia-ctk" in ch.summary
    assert "cdi generate --format=yaml --output=/etc/cdi/nvidia.yaml" in ch.commands[0] and len(ch.commands) == 1
    # the device plugin's spec is not the toolkit's: it keeps its content and gets the exact edit
    assert "k8s-device-plugin.json (edited in place" in ch.summary
    assert "+    major: 238" in ch.diff
    [out] = engine(r).apply(plan)
    assert out.result == "applied", out.to_json()
    assert r.read("/etc/cdi/nvidia.yaml") == (CDI / "nvidia-generated-238.yaml").read_text()
    assert r.read("/var/run/cdi/k8s-device-plugin.json") == JSON.replace('"major":510', '"major":238')
    assert engine(r).plan(r.facts(only=ONLY)).changes == []


def test_a_generator_that_is_still_wrong_is_refused_and_nothing_changes(host_root, monkeypatch):
    r = host_root
    (r.bin / "nvidia-ctk").unlink(missing_ok=True)  # never write through a symlink into another stand-in
    shutil.copy(STANDINS / "nvidia-ctk", r.bin / "nvidia-ctk")
    monkeypatch.setenv("GPUDOCTOR_STANDIN_CTK_SPEC", str(CDI / "nvidia-uvm-510.yaml"))
    plan = engine(r).plan(r.facts(only=ONLY))
    assert plan.changes == [] and "would not be right" in plan.refusals[0].reason
    assert "510" in plan.refusals[0].reason and r.read("/etc/cdi/nvidia.yaml") == YAML


def test_inside_a_container_the_spec_is_the_hosts(host_root):
    r = host_root
    r.container("docker")
    plan = engine(r).plan(r.facts(only=ONLY))
    assert plan.changes == [] and "on the host" in plan.refusals[0].reason


def test_failed_validation_leaves_the_spec_byte_identical(host_root):
    r = host_root
    facts = r.facts(only=ONLY)
    plan = engine(r).plan(facts)
    # the kernel moves uvm again between plan and apply: the planned text would be stale, so it is refused
    plan.changes[0].data["live"]["nvidia-uvm"] = 237
    [out] = engine(r).apply(plan)
    assert out.result == "failed" and "failed validation" in out.detail
    assert r.read("/etc/cdi/nvidia.yaml") == YAML and r.read("/var/run/cdi/k8s-device-plugin.json") == JSON


def test_snapshot_of_a_cdi_host_replays_to_the_same_verdict(host_root, tmp_path):
    from gpudoctor.gather.context import GatherContext

    r = host_root
    doc = snapshot.take(r.host(), GatherContext(name=NAME, timeout=5))
    p = tmp_path / "snap.json"
    p.write_text(json.dumps(doc))
    again = snapshot_facts(snapshot.load(str(p)))
    assert stale_keys(again) == stale_keys(doc["facts"]) != []
