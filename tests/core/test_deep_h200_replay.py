"""The three deep snapshots the H200 recorded on 2026-12-03 (issue #33), replayed through the installed command.

healthy: `snapshot --deep --deep-python python3` (torch 2.11 in /opt/torch/.venv, gpudoctor's own python elsewhere);
contended: the same with `--force` beside tools/deep_contend.py (pid 4461); ctypes-default: as README line 1 installs
gpudoctor, no --deep-python (its own python, no torch). Before #33 the first two answered "python3: not in snapshot",
the contended one named the power cap as the root cause and the third was UNKNOWN (exit 3) from an NCCL traceback.
"""

import json

import jsonschema
import pytest

from tests.console import gpudoctor

from .conftest import CAPTURES

H200 = CAPTURES / "h200-2026-12-03"
SCHEMA = json.loads((H200.parents[3] / "gpudoctor" / "data" / "check.schema.json").read_text())


def replay(name, *extra):
    r = gpudoctor("check", "--snapshot", H200 / f"h200-deep-{name}.snapshot.json", "--json", *extra,
                  env={"PATH": "/usr/bin:/bin", "GPUDOCTOR_INVENTORY": ""})
    assert "Traceback" not in r.stderr, r.stderr
    doc = json.loads(r.stdout)
    jsonschema.validate(doc, SCHEMA)
    assert doc["exit_code"] == r.returncode
    return doc


def figures(doc):
    return {f["data"]["kind"]: f["data"] for f in doc["findings"]
            if f["id"] == "fabric.deep.figure" and "value" in f["data"]}


# kind → (value, ratio) as the H200 measured them (the children's JSON lines in the snapshots)
HEALTHY = {"h2d": (55.4, 0.88), "d2h": (55.3, 0.88), "h2d_pageable": (8.8, None), "d2h_pageable": (16.7, None),
           "d2d": (4170.6, 0.87), "gemm": (793.3, 0.8)}


@pytest.mark.parametrize("extra", [(), ("--deep", "--deep-python", "python3"),
                                   ("--deep", "--deep-python", "/somewhere/else/python3")])
def test_the_healthy_h200_deep_snapshot_replays_its_figures(extra):
    doc = replay("healthy", *extra)
    assert doc["exit_code"] == 0 and doc["root_cause"] is None
    got = figures(doc)
    for kind, (value, ratio) in HEALTHY.items():
        assert got[kind]["value"] == pytest.approx(value, abs=0.06), kind
        if ratio is not None:
            assert got[kind]["ratio"] == pytest.approx(ratio, abs=0.006), kind
        assert got[kind]["backend"] == "torch"
    nccl = next(f for f in doc["findings"] if f["id"] == "fabric.nccl.allreduce")
    assert nccl["status"] == "info" and "NCCL initialises and all-reduces" in nccl["summary"]


def test_the_contended_h200_snapshot_names_the_process_first_and_its_power_cap_second():
    doc = replay("contended")
    assert doc["exit_code"] == 1
    root = doc["root_cause"]
    assert root["id"] == "fabric.deep.contention" and "pid 4461 (python3, 2922 MiB)" in root["summary"]
    by = {f["key"]: f for f in doc["findings"]}
    clocks = by["fabric.deep.clocks[GPU 0]"]
    assert "sw_power_cap" in clocks["summary"] and clocks["blocked_by"] == root["key"]
    assert by["fabric.deep.figure[GPU 0 h2d]"]["blocked_by"] == root["key"]
    assert figures(doc)["h2d"]["value"] == pytest.approx(43.9, abs=0.06)
    assert "fabric.deep.clocks[GPU 0]" not in doc["other_causes"]


def test_the_h200_deep_check_as_installed_is_not_unknown():
    """README line 1's install, no torch: copies measured, GEMM and NCCL not measured and why — exit 0, not 3."""
    doc = replay("ctypes-default")
    assert doc["exit_code"] in (0, 1) and doc["verdict"] != "unknown"
    assert not any(f["status"] == "unknown" for f in doc["findings"] if f["id"].startswith("fabric."))
    got = figures(doc)
    assert got["h2d"]["value"] == pytest.approx(55.2, abs=0.06) and got["h2d"]["backend"] == "ctypes"
    assert got["d2d"]["value"] == pytest.approx(4159.8, abs=0.06) and "gemm" not in got
    by = {f["key"]: f for f in doc["findings"]}
    gemm = by["fabric.deep.figure[GPU 0 gemm]"]
    assert gemm["status"] == "info" and "not measured" in gemm["summary"] and "cuBLAS" in gemm["summary"]
    nccl = by["fabric.nccl.allreduce[TP1:0]"]
    assert nccl["status"] == "info" and "not measured: NCCL all-reduce needs torch" in nccl["summary"]
    assert "Traceback" not in json.dumps(doc)
