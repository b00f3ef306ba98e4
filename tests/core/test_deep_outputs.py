"""The deep tier everywhere a check goes: the CLI (--force), the text report, JSON (schema), Prometheus, the gate."""

import json
import os
import subprocess
import sys

import jsonschema

from . import deep_captures as dc
from .test_deep_tier import _low

SCHEMA = json.loads((dc.ROOT / "gpudoctor" / "data" / "check.schema.json").read_text())
HEALTHY = str(dc.ROOT / "examples" / "h200-deep-healthy.json")


def gd(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "gpudoctor", *args], capture_output=True, text=True, timeout=60,
                          cwd=cwd, env=dict(os.environ, GPUDOCTOR_INVENTORY=""))


def _foreign(tmp_path):
    c = dc.healthy_child()
    who = [{"pid": 31337, "used_mib": 20480, "name": "python3"}]
    c["idle"].update(util=[96, 100], procs=who)
    _low(c, "gemm", 430.0, procs=who, util=(100, 100))
    return str(dc.write(dc.build(c, policy={"deep_force": True}, apps=f"31337, python3, 20480, {dc.BUS}\n"),
                        tmp_path / "foreign.json"))


def test_force_without_deep_is_bad_input():
    r = gd("check", "--force")
    assert r.returncode == 3 and "--force only applies to --deep" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_deep_snapshot_json_validates_and_carries_the_figures():
    r = gd("check", "--snapshot", HEALTHY, "--json")
    doc = json.loads(r.stdout)
    jsonschema.validate(doc, SCHEMA)
    assert r.returncode == 0 and doc["verdict"] == "ok"
    got = {f["data"]["kind"]: f["data"]["ratio"] for f in doc["findings"] if f["id"] == "fabric.deep.figure"}
    assert got == {"h2d": 0.841, "d2h": 0.877, "h2d_pageable": 0.105, "d2h_pageable": 0.259, "d2d": 0.881,
                   "gemm": 0.807}


def test_schema_rejects_a_deep_figure_without_its_ratio():
    doc = json.loads(gd("check", "--snapshot", HEALTHY, "--json").stdout)
    fig = next(f for f in doc["findings"] if f["id"] == "fabric.deep.figure")
    del fig["data"]["ratio"]
    try:
        jsonschema.validate(doc, SCHEMA)
    except jsonschema.ValidationError as exc:
        assert "ratio" in exc.message
    else:
        raise AssertionError("a deep figure without its ratio validated")


def test_text_report_names_the_cause_and_its_numbers(tmp_path):
    r = gd("check", "--snapshot", _foreign(tmp_path))
    assert r.returncode == 1
    assert "Root cause fabric.deep.contention[GPU 0]" in r.stdout and "pid 31337 (python3, 20480 MiB)" in r.stdout
    assert "bf16 GEMM 430.0 TFLOP/s = 0.43" in r.stdout


def test_prometheus_has_each_figure_ratio_and_floor(tmp_path):
    prom = tmp_path / "g.prom"
    assert gd("check", "--snapshot", HEALTHY, "--prom", str(prom)).returncode == 0
    text = prom.read_text()
    assert 'gpudoctor_gpu_bandwidth_ratio{gpu="0",host="vm",kind="h2d"} 0.841' in text
    assert 'gpudoctor_gpu_bandwidth_floor{gpu="0",host="vm",kind="gemm"} 0.72' in text
    from prometheus_client.parser import text_string_to_metric_families

    fams = {f.name: f for f in text_string_to_metric_families(text)}
    assert fams["gpudoctor_gpu_bandwidth_ratio"].type == "gauge"
    assert {s.labels["kind"] for s in fams["gpudoctor_gpu_bandwidth_ratio"].samples} == {
        "h2d", "d2h", "h2d_pageable", "d2h_pageable", "d2d", "gemm"}


def _inventory(tmp_path):
    inv = tmp_path / "inventory.yaml"
    inv.write_text("version: 1\nhosts:\n  vm:\n    address: 127.0.0.1\n"
                   "profiles:\n  deep:\n    require: [fabric.deep.figure]\n    deep_floors: true\n")
    return str(inv)


def test_gate_with_deep_floors_opens_on_a_healthy_deep_snapshot(tmp_path):
    r = gd("gate", "--inventory", _inventory(tmp_path), "--profile", "deep", "--snapshot", HEALTHY, "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["pass"] is True


def test_gate_with_deep_floors_blocks_on_the_named_cause(tmp_path):
    r = gd("gate", "--inventory", _inventory(tmp_path), "--profile", "deep", "--snapshot", _foreign(tmp_path),
           "--json")
    doc = json.loads(r.stdout)
    assert r.returncode == 2 and doc["pass"] is False
    assert doc["headline"].startswith("GPU 0: another process used the GPU during the measurement: pid 31337")
    keys = {b["key"]: b for b in doc["blockers"]}
    assert keys["fabric.deep.figure[GPU 0 gemm]"]["symptom_of"] == "fabric.deep.contention[GPU 0]"


def test_gate_with_deep_floors_blocks_when_nothing_was_measured(tmp_path):
    r = gd("gate", "--inventory", _inventory(tmp_path), "--profile", "deep", "--snapshot",
           str(dc.ROOT / "examples" / "h200-healthy.json"), "--json")
    doc = json.loads(r.stdout)
    assert r.returncode == 2 and doc["blockers"][0]["status"] == "missing"
    assert "run with --deep" in doc["blockers"][0]["hint"]
