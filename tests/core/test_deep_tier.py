"""The deep tier: each GPU against its physical limit, a named root cause for every shortfall, replayed from deep
snapshots built from the real H200 capture (tests/core/deep_captures.py), and the measuring child itself on this
CPU-only machine."""

import copy
import json
import subprocess
import sys
import time

import pytest

from gpudoctor import snapshot
from gpudoctor.catalog.deep_limits import link_gbs, sku_for, table, table_problems
from gpudoctor.diagnose import diagnose
from gpudoctor.gather.deep_child import PROGRAM
from gpudoctor.gather.deep_gpu import child_args, parse_child, settings
from gpudoctor.target import snapshot_facts

from . import deep_captures as dc


def judge(doc, tmp_path, name="deep.json"):
    """The snapshot replayed through today's gather and checks, as `gpudoctor check --snapshot` does."""
    path = dc.write(doc, tmp_path / name)
    return diagnose(snapshot_facts(snapshot.load(str(path))))


def figs(d):
    return {f.subject: f for f in d.findings if f.id == "fabric.deep.figure"}


# --- the SKU table and the link maths ---------------------------------------------------------------------------

def test_link_limits_from_generation_and_width():
    assert round(link_gbs(5, 16), 1) == 63.0  # 32 GT/s x 16 x 128/130 / 8, the figure
    assert round(link_gbs(4, 16), 2) == round(link_gbs(5, 8), 2) == 31.51
    assert round(link_gbs(3, 16), 2) == 15.75 and link_gbs(2, 16) == 8.0
    assert link_gbs(None, 16) is None and link_gbs(5, 0) is None


def test_sku_table_has_a_source_for_every_number_and_no_loose_floor():
    assert table_problems() == []
    names = {s["sku"] for s in table()["skus"]}
    assert {"H100 SXM", "H100 PCIe", "H200 SXM", "H200 NVL", "B200", "RTX PRO 6000 Blackwell Server Edition", "L40S",
            "A100 SXM 80GB"} <= names
    assert sku_for("NVIDIA H200")["sku"] == "H200 SXM" and sku_for("NVIDIA H200 NVL")["sku"] == "H200 NVL"
    assert sku_for("NVIDIA H100 80GB HBM3")["sku"] == "H100 SXM" and sku_for("NVIDIA A100-SXM4-80GB")
    assert sku_for("NVIDIA GeForce GT 710") is None


def test_the_h200_healthy_ratios_are_the_measurements_they_cite():
    # the H200's `check --deep` of 2026-12-03 (torch 2.11.0+cu130; h200-deep-healthy.snapshot.json of that round):
    # H2D 55.35, D2H 55.35 GB/s, device copy 4170.58 GB/s, bf16 GEMM 793.3 TFLOP/s (#33: cite that, not the tracker)
    h200 = sku_for("NVIDIA H200")
    assert round(4170.58 / h200["memory_gbs"], 2) == h200["floors"]["d2d"]["healthy"]
    assert round(793.3 / h200["bf16_dense_tflops"], 2) == h200["floors"]["gemm"]["healthy"]
    fd = table()["floors_default"]
    assert round(55.35 / link_gbs(5, 16), 2) == fd["h2d"]["healthy"] == fd["d2h"]["healthy"]
    for f in (fd["h2d"], fd["d2h"], h200["floors"]["d2d"], h200["floors"]["gemm"]):
        assert f["source"].startswith("measured 2026-12-03 on an NVIDIA H200 SXM") and "median of" in f["source"]


@pytest.mark.parametrize("edit, words", [
    (lambda t: t["skus"][0]["floors"]["d2d"].update(floor=0.49), "below 85 % of the healthy"),  # DCGM-style floor
    (lambda t: t["skus"][0]["floors"]["gemm"].update(floor=0.9), "above its healthy ratio"),
    (lambda t: t["skus"][1].update(source="measured somewhere"), "without an NVIDIA source"),
    (lambda t: t["floors_default"]["h2d"].update(source=""), "floor without a source"),
])
def test_a_table_with_a_loose_floor_or_no_source_is_rejected(edit, words):
    t = copy.deepcopy(table())
    edit(t)
    problems = table_problems(t)
    assert len(problems) == 1 and words in problems[0]


# --- replayed deep snapshots: healthy, and each fault as the root cause with its numbers --------------------------

def test_healthy_h200_deep_snapshot_is_ok_with_its_ratios(tmp_path):
    d = judge(dc.build(dc.healthy_child()), tmp_path)
    f = figs(d)
    assert d.verdict.value == "ok" and d.root_cause is None
    assert f["GPU 0 h2d"].status.value == "ok" and f["GPU 0 h2d"].data["ratio"] == 0.841
    assert "H2D pinned 53.0 GB/s = 0.84 of the Gen5 x16 link (63.0 GB/s), floor 0.75" in f["GPU 0 h2d"].summary
    assert f["GPU 0 d2h"].data["ratio"] == 0.877 and f["GPU 0 d2d"].data["ratio"] == 0.881
    assert f["GPU 0 gemm"].data["ratio"] == 0.807 and f["GPU 0 gemm"].data["backend"] == "torch"
    assert f["GPU 0 h2d_pageable"].status.value == "info" and f["GPU 0 h2d_pageable"].data["value"] == 6.6
    assert not [x for x in d.findings if x.id.startswith("fabric.deep.") and x.id != "fabric.deep.figure"]


def _low(child, kind, value, memory=None, placement=None, **sample_kw):
    t = dc.test_of(child, kind, memory, placement)
    t["gbs" if kind != "gemm" else "tflops"] = value
    if sample_kw:
        t["samples"] = dc.samples(**sample_kw)
    return t


def _root(d):
    assert d.root_cause is not None, [f.key for f in d.findings if f.bad]
    return d.root_cause


def test_link_trained_at_gen4_on_a_gen5_card_is_the_root_cause(tmp_path):
    c = dc.healthy_child()
    _low(c, "h2d", 26.4, "pinned", link=(4, 16))
    _low(c, "d2h", 27.6, "pinned", link=(4, 16))
    doc = dc.build(c, xml_edits=[("<current_link_gen>5</current_link_gen>", "<current_link_gen>4</current_link_gen>")])
    d = judge(doc, tmp_path)
    root = _root(d)
    assert root.id == "fabric.deep.link" and root.subject == "GPU 0"
    assert "Gen4 x16 under load, below its Gen5 x16 (Gen4 of Gen5): limit 31.5 of 63.0 GB/s" in root.summary
    assert any("H2D pinned 26.4 GB/s = 0.42 of the Gen5 x16 link" in e for e in root.evidence)
    h2d = figs(d)["GPU 0 h2d"]
    assert h2d.status.value == "warn" and h2d.blocked_by == root.key and "0.84 of the Gen4 x16 it ran at" in h2d.summary


def test_link_at_x8_of_x16_is_the_root_cause(tmp_path):
    c = dc.healthy_child()
    _low(c, "h2d", 26.5, "pinned", link=(5, 8))
    _low(c, "d2h", 27.7, "pinned", link=(5, 8))
    d = judge(dc.build(c, xml_edits=[("<current_link_width>16x</current_link_width>",
                                      "<current_link_width>8x</current_link_width>")]), tmp_path)
    root = _root(d)
    # nvidia-smi already sees the width at idle (driver.pcie.width); the deep tier's loaded link and figures are
    # its symptoms, so the chain runs from the shortfall to the width.
    assert root.id == "driver.pcie.width" and "x8 below its maximum x16" in root.summary
    link = d.by_key()["fabric.deep.link[GPU 0]"]
    assert link.blocked_by == root.key and "x8 of x16" in link.summary
    assert figs(d)["GPU 0 h2d"].blocked_by == root.key
    assert any("H2D pinned 26.5 GB/s = 0.42" in step for step in d.chain)


def test_mrrs_below_policy_is_the_root_cause_of_a_slow_h2d(tmp_path):
    c = dc.healthy_child()
    _low(c, "h2d", 33.1, "pinned")
    d = judge(dc.build(c, policy={"pcie": {"mrrs": 4096}}, mrrs=128), tmp_path)
    root = _root(d)
    assert root.id == "fabric.pcie.mrrs" and "MaxReadReq 128 ≠ policy 4096" in root.summary
    h2d = figs(d)["GPU 0 h2d"]
    assert h2d.blocked_by == root.key and "H2D pinned 33.1 GB/s = 0.53" in h2d.summary
    assert "MaxReadReq 128 < policy 4096 (config space of 0000:00:06.0, fabric.pcie.mrrs)" in h2d.evidence
    assert figs(d)["GPU 0 d2h"].status.value == "ok"  # device writes to the host do not use read requests


def test_pinned_memory_on_a_remote_numa_node_is_the_root_cause(tmp_path):
    c = dc.healthy_child()
    c["numa"].update(gpu_node=0, nodes=[0, 1], mems_allowed="1", cpus_allowed="16-31")
    for t in c["tests"]:
        if t.get("page_nodes"):
            t["page_nodes"], t["node"] = {"1": 16}, 0
    _low(c, "h2d", 40.2, "pinned")
    _low(c, "d2h", 44.1, "pinned")
    remote = [dict(dc.test_of(c, k, "pinned"), placement="remote", node=1) for k in ("h2d", "d2h")]
    c["tests"][2:2] = remote
    d = judge(dc.build(c), tmp_path)
    root = _root(d)
    assert root.id == "fabric.deep.numa"
    assert "NUMA node 0 landed on node(s) 1 (16 of 16 sampled pages remote)" in root.summary
    assert any("Mems_allowed 1" in e for e in root.evidence)
    assert any("bound to the wrong node: Cpus_allowed 16-31 has none of the GPU's CPUs 0-15" in e
               for e in root.evidence)
    assert any("H2D pinned 40.2 GB/s = 0.64" in e for e in root.evidence)
    assert figs(d)["GPU 0 h2d_remote"].status.value == "info"


def test_a_power_cap_clock_event_is_the_root_cause_of_a_slow_gemm(tmp_path):
    c = dc.healthy_child()
    c["before"]["power_limit_w"] = 450.0
    _low(c, "gemm", 588.0, reasons=("sw_power_cap",), power=(446.0, 450.2), sm=(1215, 1410))
    d = judge(dc.build(c), tmp_path)
    root = _root(d)
    assert root.id == "fabric.deep.clocks" and "sw_power_cap" in root.summary
    assert any("SM 1215-1410 MHz" in e and "power 446-450.2 W" in e for e in root.evidence)
    assert any("enforced power limit 450.0 W" in e for e in root.evidence)
    assert any("bf16 GEMM 588.0 TFLOP/s = 0.59" in e for e in root.evidence)
    assert figs(d)["GPU 0 d2d"].status.value == "ok"


def test_a_foreign_process_during_the_test_is_the_root_cause_with_its_pid(tmp_path):
    c = dc.healthy_child()
    who = [{"pid": 31337, "used_mib": 20480, "name": "python3"}]
    c["idle"].update(util=[96, 100], procs=who)
    for kind, value in (("h2d", 41.0), ("d2h", 43.2), ("d2d", 2350.0), ("gemm", 430.0)):
        _low(c, kind, value, "pinned" if kind in ("h2d", "d2h") else None, procs=who, util=(100, 100))
    doc = dc.build(c, policy={"deep_force": True}, apps=f"31337, python3, 20480, {dc.BUS}\n")
    d = judge(doc, tmp_path)
    root = _root(d)
    assert root.id == "fabric.deep.contention" and "pid 31337 (python3, 20480 MiB)" in root.summary
    assert {f["kind"] for f in root.data["figures"]} == {"h2d", "d2h", "d2d", "gemm"}
    assert all(figs(d)[f"GPU 0 {k}"].blocked_by == root.key for k in ("h2d", "d2h", "d2d", "gemm"))


def test_a_gpu_held_by_a_server_is_not_measured_without_force(tmp_path):
    doc = dc.build(None, apps=f"4242, sglang::scheduler, 71234, {dc.BUS}\n")
    d = judge(doc, tmp_path)
    f = figs(d)["GPU 0"]
    assert f.status.value == "unknown" and "pid 4242 (sglang::scheduler, 71234 MiB) holds it" in f.summary
    assert "--deep --force" in f.summary
    nccl = d.by_key()["fabric.nccl.allreduce[TP1:0]"]
    assert nccl.status.value == "unknown" and "--deep --force" in nccl.evidence[0]


def test_a_shortfall_without_a_cause_says_so_with_its_numbers(tmp_path):
    c = dc.healthy_child()
    _low(c, "d2d", 3100.0)
    d = judge(dc.build(c), tmp_path)
    root = _root(d)
    assert root.key == "fabric.deep.figure[GPU 0 d2d]"
    assert root.summary == ("GPU 0: device copy 3100 GB/s = 0.65 of the H200 SXM's memory bandwidth (4800 GB/s), "
                            "floor 0.80: below floor, cause unknown")


def test_ecc_errors_appearing_during_the_run_are_a_failure(tmp_path):
    c = dc.healthy_child()
    c["after"] = copy.deepcopy(c["before"])
    c["after"]["ecc_uncorrected"] = 2
    d = judge(dc.build(c), tmp_path)
    root = _root(d)
    assert root.id == "fabric.deep.errors" and root.status.value == "fail"
    assert "ecc uncorrected 0 → 2" in root.summary


def test_a_child_killed_at_its_deadline_keeps_what_it_measured(tmp_path):
    c = dc.healthy_child()
    c["tests"] = c["tests"][:2]
    doc = dc.build(c)
    key = next(k for k in doc["transcript"] if '\\"budget_s\\"' in k)
    doc["transcript"][key].update(rc=None, timed_out=True, timeout_s=45.0)
    d = judge(doc, tmp_path)
    f = figs(d)
    assert set(f) == {"GPU 0 h2d", "GPU 0 d2h"} and f["GPU 0 h2d"].status.value == "ok"
    assert any("did not finish in 45 s" in e for e in f["GPU 0 h2d"].evidence)


def test_the_committed_deep_example_is_what_the_builder_builds():
    path = dc.ROOT / "examples" / "h200-deep-healthy.json"
    assert json.loads(path.read_text()) == json.loads(json.dumps(dc.build(dc.healthy_child()), sort_keys=True))


# --- the measuring child on this machine (no GPU: its no-CUDA answers, its host half) ----------------------------

def _child(args, timeout=20):
    t = time.monotonic()
    r = subprocess.run([sys.executable, "-I", "-c", PROGRAM, args], capture_output=True, text=True, timeout=timeout)
    return r, parse_child(r.stdout), time.monotonic() - t


def test_child_without_cuda_answers_cleanly_within_its_deadline():
    r, out, secs = _child(child_args(0, [1], settings({"deep_backend": "ctypes"})))
    assert r.returncode == 0 and secs < 10, r.stderr
    assert out["backend"] == "ctypes" and out["tests"] == []
    assert out["error"].startswith("RuntimeError: no CUDA: libcuda.so.1 cannot be loaded")


def test_child_asked_for_torch_says_why_it_cannot_measure():
    import importlib.util

    r, out, _ = _child(child_args(0, [], settings({"deep_backend": "torch"})))
    assert r.returncode == 0 and out["tests"] == []
    if importlib.util.find_spec("torch") is None:
        assert out["error"].startswith("RuntimeError: torch does not import")
    else:  # a CPU-only torch
        assert out["backend"] == "torch" and "sees no CUDA device" in out["error"]


def test_child_places_host_memory_on_the_node_it_binds():
    args = json.loads(child_args(0, [], settings({})))
    args.update(host_only=True, bytes=8 << 20)
    r, out, _ = _child(json.dumps(args))
    assert r.returncode == 0 and out["error"] is None, r.stderr
    placed = [t for t in out["tests"] if t["kind"] == "host_placement"]
    assert placed and len(placed) == len(out["numa"]["nodes"])
    for t in placed:
        assert t["page_nodes"] == {str(t["node"]): 16}, t  # move_pages: every sampled page on the bound node


def test_child_runs_from_stdin_and_records_under_a_key_the_deep_snapshots_use():
    """The gather runs `python3 - ARGS` with the program on stdin; the recording host's key is what
    deep_captures writes, so a deep snapshot taken live replays the same way the built ones do."""
    from gpudoctor.host.local import LocalHost
    from gpudoctor.host.replay import RecordingHost

    args = child_args(0, [], settings({"deep": True}))
    rec = RecordingHost(inner=LocalHost())
    res = rec.run([*rec.python, "-", args], timeout=20, input=PROGRAM.encode())
    assert res.ok and parse_child(res.stdout)["error"].startswith("RuntimeError: no CUDA")
    built = dc.build(dc.healthy_child())["transcript"]
    assert set(rec.transcript) <= set(built)


def test_two_gpus_peer_copy_over_nvlink_is_judged_against_its_links(tmp_path):
    d = judge(dc.build_x2([dc.healthy_child_x2(0, p2p_gbs=372.0), dc.healthy_child_x2(1)]), tmp_path)
    f = figs(d)
    assert d.verdict.value == "ok", [x.key for x in d.findings if x.bad]
    assert "P2P copy 372.0 GB/s = 0.83 of 18 NVLinks x 25 GB/s (450.0 GB/s)" in f["GPU 0 p2p-1"].summary
    assert f["GPU 1 h2d"].status.value == "ok" and "GPU 1 p2p-0" not in f


def test_a_pair_without_p2p_is_the_root_cause_of_a_slow_peer_copy(tmp_path):
    doc = dc.build_x2([dc.healthy_child_x2(0, p2p_gbs=9.8, can_access=False), dc.healthy_child_x2(1)],
                      topo="PHB", p2p="CNS")
    d = judge(doc, tmp_path)
    root = _root(d)
    assert root.key == "fabric.deep.p2p_path[GPU 0-1]"
    assert "can_access_peer False, nvidia-smi topo -p2p r: CNS" in root.summary and "ACS or the IOMMU" in root.summary
    assert any("P2P copy 9.8 GB/s = 0.16 of the Gen5 x16 link (63.0 GB/s)" in e for e in root.evidence)
    assert figs(d)["GPU 0 p2p-1"].blocked_by == root.key


def test_the_child_reads_the_card_and_never_sets_it():
    """Item 4: no NVML or CUDA call that changes a clock, a power limit, a mode or resets the GPU."""
    import re

    calls = set(re.findall(r"\b(nvml[A-Za-z_0-9]+|cu[A-Z][A-Za-z_0-9]+|cuda[A-Z][A-Za-z_0-9]+)", PROGRAM))
    setters = {c for c in calls if re.search(r"Set|Reset|Clear|Enable|Disable|Lock", c) and c != "cuCtxSetCurrent"}
    assert setters == set(), setters
    assert {"nvmlDeviceGetCurrPcieLinkGeneration", "nvmlDeviceGetComputeRunningProcesses_v3",
            "nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetRemappedRows"} <= calls


def test_a_deep_snapshot_from_before_the_per_gpu_tier_replays_as_it_did(tmp_path):
    doc = dc.build(dc.healthy_child())
    for key in [k for k in doc["transcript"] if "--query-gpu" in k or '\\"budget_s\\"' in k]:
        del doc["transcript"][key]
    d = judge(doc, tmp_path)
    assert d.verdict.value == "ok" and not figs(d)
    assert d.by_key()["fabric.nccl.allreduce[TP1:0]"].status.value == "info"


def test_an_xid_logged_while_measuring_is_named(tmp_path):
    xid = [5004.2, "NVRM: Xid (PCI:0000:00:06): 63, pid=4711, name=python3, Row Remapper: New row marked for Remapping"]
    before = [3100.0, "NVRM: Xid (PCI:0000:00:06): 13, pid=1, name=x, Graphics Exception"]  # before the run
    d = judge(dc.build(dc.healthy_child(), xids=[before, xid]), tmp_path)
    root = _root(d)
    assert root.id == "fabric.deep.errors" and "Xid 63 during the run" in root.summary
    assert not any("Xid 13" in e for e in root.evidence)


def test_mig_mode_names_why_a_whole_gpu_figure_is_low(tmp_path):
    c = dc.healthy_child()
    c["before"]["mig"] = 1
    _low(c, "gemm", 120.0)
    root = _root(judge(dc.build(c), tmp_path))
    assert root.id == "fabric.deep.mig" and "MIG mode is enabled" in root.summary
    assert any("bf16 GEMM 120.0 TFLOP/s = 0.12" in e for e in root.evidence)


# --- the whole gather on this machine: real processes, nvidia-smi stood in (no GPU driver here) ------------------

_SMI = """#!/bin/sh
case "$1" in
  --query-gpu=*) printf '0, 00000000:00:06.0, NVIDIA H200\\n1, 00000000:00:07.0, NVIDIA H200\\n' ;;
  --query-compute-apps=*) printf "4242, sglang::scheduler, tp0, 71234, 00000000:00:07.0\\n" ;;
  *) exit 0 ;;
esac
"""


def _live_deep(tmp_path, policy):
    from gpudoctor.gather import gather
    from gpudoctor.gather.context import GatherContext
    from gpudoctor.host.local import LocalHost

    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "nvidia-smi").write_text(_SMI)
    (bindir / "nvidia-smi").chmod(0o755)
    ctx = GatherContext(name="here", policy={"deep": True, "deep_backend": "ctypes", **policy}, timeout=10)
    t = time.monotonic()
    facts = gather(LocalHost(path_prepend=[str(bindir)]), ctx, only={"deep"})
    return facts, time.monotonic() - t


def test_live_gather_runs_the_child_per_free_gpu_and_refuses_the_held_one(tmp_path):
    facts, secs = _live_deep(tmp_path, {})
    recs = facts["deep"]["gpus"]
    assert [r["index"] for r in recs] == [0, 1] and secs < 20
    assert recs[0]["result"]["error"].startswith("RuntimeError: no CUDA") and recs[0]["command"]["rc"] == 0
    assert recs[1]["refused"]["pids"][0]["pid"] == 4242 and "result" not in recs[1]
    by = {f.subject: f for f in diagnose(facts).findings if f.id == "fabric.deep.figure"}
    assert by["GPU 0"].status.value == "unknown"
    assert "deep measurement failed: RuntimeError: no CUDA" in by["GPU 0"].summary
    assert "pid 4242 (sglang::scheduler, tp0, 71234 MiB) holds it" in by["GPU 1"].summary


def test_live_gather_with_force_measures_the_held_gpu_too(tmp_path):
    facts, _ = _live_deep(tmp_path, {"deep_force": True})
    recs = facts["deep"]["gpus"]
    assert facts["deep"]["force"] is True and all(r.get("result") for r in recs)
    assert json.loads(child_args(1, [], settings({})))["dev"] == recs[1]["result"]["device"] == 1
