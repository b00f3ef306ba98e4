"""The H100 SXM's captures of 2026-12-05 (tests/fixtures/captures/h100-2026-12-05/) replayed through the installed
command, judged against the floors measured on that card (gpu_skus.json's H100 SXM entry), and that entry being what
the documented rule (tools/sku_from_snapshots.py, docs/deep.md) derives from the capture.

healthy deep: ok, every figure shown with the H100 SXM named; eBPF-denied: root cause
boundary.container.device_rules; busy (20.5 GiB held by another process): `gate --profile benchmark` blocks.
"""

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from gpudoctor.catalog.deep_limits import derive_floor, sku_for
from tests.console import gpudoctor

from .conftest import CAPTURES

H100 = CAPTURES / "h100-2026-12-05"
CAPTURE = H100 / "h100-deep-healthy.snapshot.json"
RUNS = [CAPTURES / "h100-2026-12-06" / f"h100-deep-run{i}.snapshot.json" for i in (1, 2, 3)]
REPO = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((REPO / "gpudoctor" / "data" / "check.schema.json").read_text())
ENV = {"PATH": "/usr/bin:/bin", "GPUDOCTOR_INVENTORY": ""}


def replay(name, *extra):
    r = gpudoctor("check", "--snapshot", H100 / f"h100-{name}.snapshot.json", "--json", *extra, env=ENV)
    assert "Traceback" not in r.stderr, r.stderr
    doc = json.loads(r.stdout)
    jsonschema.validate(doc, SCHEMA)
    assert doc["exit_code"] == r.returncode
    return doc


# kind -> (value, ratio, floor) as the H100's child measured them and the measured floors judge them
HEALTHY = {"h2d": (55.26, 0.877, 0.75), "d2h": (55.12, 0.875, 0.75), "d2d": (2926.81, 0.874, 0.78),
           "gemm": (753.45, 0.762, 0.68)}


def test_the_healthy_h100_deep_snapshot_is_ok_with_every_figure_and_the_sku_named():
    doc = replay("deep-healthy")
    assert doc["exit_code"] == 0 and doc["root_cause"] is None
    figs = {f["data"]["kind"]: f for f in doc["findings"] if f["id"] == "fabric.deep.figure" and "value" in f["data"]}
    for kind, (value, ratio, floor) in HEALTHY.items():
        d = figs[kind]["data"]
        assert figs[kind]["status"] == "ok", figs[kind]["summary"]
        assert d["value"] == pytest.approx(value, abs=0.01) and d["ratio"] == pytest.approx(ratio, abs=0.001), kind
        assert d["floor"] == floor and d["backend"] == "torch", kind
    assert "of the H100 SXM's memory bandwidth (3350 GB/s), floor 0.78" in figs["d2d"]["summary"]
    assert "of the H100 SXM's dense bf16 peak (989.0 TFLOP/s), floor 0.68" in figs["gemm"]["summary"]
    # measured on this SKU: the text carries no "assumed", the evidence the measurement it rests on
    for kind in ("d2d", "gemm"):
        assert "assumed" not in figs[kind]["summary"]
        assert any(e.startswith("floor ") and "measured 2026-12-05 and 2026-12-06 on an NVIDIA H100 80GB HBM3" in e
                   for e in figs[kind]["evidence"]), figs[kind]["evidence"]
    # the text report with every finding (-a; #41's renderer decides what the default folds) shows each figure
    r = gpudoctor("check", "-a", "--snapshot", H100 / "h100-deep-healthy.snapshot.json", env=ENV)
    assert r.returncode == 0
    for words in ("H2D pinned 55.3 GB/s", "D2H pinned 55.1 GB/s", "device copy 2927 GB/s", "bf16 GEMM 753.5 TFLOP/s",
                  "H100 SXM's memory bandwidth", "H100 SXM's dense bf16 peak"):
        assert words in " ".join(r.stdout.split()), words


def test_the_ebpf_denied_h100_capture_names_the_device_rules():
    doc = replay("uvm-ebpf-denied")
    assert doc["exit_code"] == 2
    assert doc["root_cause"]["id"] == "boundary.container.device_rules", doc["root_cause"]


def test_the_busy_h100_capture_blocks_the_benchmark_gate():
    r = gpudoctor("gate", "--profile", "benchmark", "--snapshot", H100 / "h100-busy-20g.snapshot.json", env=ENV)
    assert r.returncode == 2, r.stdout + r.stderr
    block = [ln for ln in r.stdout.splitlines() if ln.startswith("BLOCK workload.gpu.foreign_memory")]
    assert block and "20.5 GiB held by pid 9891" in block[0], r.stdout


def test_the_healthy_h100_capture_without_deep_is_ok():
    doc = replay("healthy")
    assert doc["exit_code"] == 0 and doc["root_cause"] is None


def test_the_h100_sxm_entry_is_what_the_rule_derives_from_its_four_runs():
    """tools/sku_from_snapshots.py on the four healthy runs (the 2026-12-05 capture and tools/h100_floors_proof.sh's
    three of 2026-12-06, another H100 SXM) gives the shipped H100 SXM entry — floors and sources — under the rule's
    own minimum of 3 runs; with fewer it refuses in one line (exit 3)."""
    tool = [sys.executable, "-I", str(REPO / "tools" / "sku_from_snapshots.py")]
    r = subprocess.run([*tool, str(CAPTURE), *map(str, RUNS)], capture_output=True, text=True, env=ENV, timeout=180)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    shipped = sku_for("NVIDIA H100 80GB HBM3")
    assert got["sku"] == shipped["sku"] == "H100 SXM"
    assert got["floors"] == shipped["floors"]
    assert "2927 (0.874), 2991 (0.893), 2991 (0.893), 2993 (0.893) of 3350 GB/s, 4 runs" in got["floors"]["d2d"]["source"]
    assert "753 (0.762), 794 (0.803), 795 (0.804), 794 (0.803) of 989 TFLOP/s, 4 runs" in got["floors"]["gemm"]["source"]
    r = subprocess.run([*tool, str(CAPTURE)], capture_output=True, text=True, env=ENV, timeout=120)
    assert r.returncode == 3 and r.stdout == "", r.stdout
    assert r.stderr.strip().count("\n") == 0 and "1 run(s), the rule needs 3 healthy runs" in r.stderr, r.stderr
    # the rule itself: the lowest run, rounded; 0.90 of it, rounded down
    assert derive_floor([0.874, 0.893, 0.893, 0.893]) == {"healthy": 0.87, "floor": 0.78}
    assert derive_floor([0.762, 0.803, 0.804, 0.803]) == {"healthy": 0.76, "floor": 0.68}
    assert derive_floor([0.80]) == {"healthy": 0.8, "floor": 0.72}  # the H200 SXM's GEMM floor, by the same rule


@pytest.mark.parametrize("run", [1, 2, 3])
def test_the_proof_runs_replay_ok_against_the_measured_floors(run):
    """tools/h100_floors_proof.sh's deep snapshots (an H100 80GB HBM3, 2026-12-06): every figure ok above its floor."""
    r = gpudoctor("check", "--snapshot", RUNS[run - 1], "--json", env=ENV)
    doc = json.loads(r.stdout)
    assert doc["exit_code"] == r.returncode == 0 and doc["root_cause"] is None
    figs = {f["data"]["kind"]: f for f in doc["findings"] if f["id"] == "fabric.deep.figure" and "value" in f["data"]}
    for kind in ("h2d", "d2h", "d2d", "gemm"):
        assert figs[kind]["status"] == "ok" and figs[kind]["data"]["ratio"] > figs[kind]["data"]["floor"], kind
    assert 2990 <= figs["d2d"]["data"]["value"] <= 2994 and 793 <= figs["gemm"]["data"]["value"] <= 796


def test_a_contended_run_is_refused_as_a_floor_source():
    snap = str(CAPTURES / "h200-2026-12-03" / "h200-deep-contended.snapshot.json")
    r = subprocess.run([sys.executable, "-I", str(REPO / "tools" / "sku_from_snapshots.py"), "--min-runs", "1", snap],
                       capture_output=True, text=True, env=ENV, timeout=120)
    assert r.returncode == 3 and "is not a healthy run" in r.stderr and "contention" in r.stderr, r.stderr


def test_the_same_run_given_twice_counts_once():
    snap = str(H100 / "h100-deep-healthy.snapshot.json")
    r = subprocess.run([sys.executable, "-I", str(REPO / "tools" / "sku_from_snapshots.py"), "--min-runs", "2", snap,
                        snap], capture_output=True, text=True, env=ENV, timeout=120)
    assert r.returncode == 3 and "each run counts once" in r.stderr, r.stderr
