"""The deep tier's timeline (#51): each phase's start and end, the parent's and each measuring child's own on one
clock, in the deep facts and in `check --json` — measured live on this machine (nvidia-smi stood in, no GPU: the
child's CUDA context fails, which its timeline shows too)."""

import jsonschema

from gpudoctor.diagnose import diagnose
from gpudoctor.gather.deep_timeline import Timeline, render, started_ago

from .test_deep_outputs import SCHEMA
from .test_deep_tier import _live_deep

TICK = 0.02  # /proc/self/stat's start time is in clock ticks (10 ms)


def _phases(tl, **where):
    return [p for p in tl["phases"] if all(p.get(k) == v for k, v in where.items())]


def test_a_live_deep_run_records_each_phase_of_the_parent_and_the_child(tmp_path):
    facts, _ = _live_deep(tmp_path, {})
    tl = facts["deep"]["timeline"]
    assert tl["origin"] == "gpudoctor's process start"
    names = [p["phase"] for p in tl["phases"]]
    for want in ("gpudoctor start-up", "deep tier", "nvidia-smi topo -m", "python search", "nvidia-smi --query-gpu",
                 "nvidia-smi --query-compute-apps", "measuring child", "kernel log (Xid lines)"):
        assert want in names, names
    assert all(0 <= p["start_s"] <= p["end_s"] for p in tl["phases"])
    deep = _phases(tl, phase="deep tier")[0]
    assert all(deep["start_s"] - 1e-3 <= p["start_s"] and p["end_s"] <= deep["end_s"] + 1e-3
               for p in tl["phases"] if p["phase"] != "gpudoctor start-up")
    # GPU 0's child: its own phases (interpreter start-up, NVML, NUMA, the failing CUDA context, its exit) inside
    # the parent's window for it, in order; GPU 1 is held by another process and never started
    child = _phases(tl, phase="measuring child", gpu=0)[0]
    own = sorted((p for p in _phases(tl, gpu=0) if p is not child), key=lambda p: (p["start_s"], p["end_s"]))
    assert [p["phase"] for p in own][:1] == ["interpreter start-up"] and own[-1]["phase"] == "exit"
    assert {"NVML", "NUMA facts", "CUDA context"} <= {p["phase"] for p in own}, own
    assert all(child["start_s"] - TICK <= p["start_s"] and p["end_s"] <= child["end_s"] + TICK for p in own), own
    assert all(a["end_s"] <= b["start_s"] + 1e-3 for a, b in zip(own, own[1:])), own
    assert not _phases(tl, gpu=1)
    assert "phases" not in facts["deep"]["gpus"][0]["result"]  # the timeline's, not kept twice


def test_check_json_shows_the_timeline_and_validates(tmp_path):
    facts, _ = _live_deep(tmp_path, {})
    doc = diagnose(facts).to_json()
    jsonschema.validate(doc, SCHEMA)
    assert doc["deep_timeline"] == facts["deep"]["timeline"]
    lines = render(doc["deep_timeline"])
    assert any(ln.endswith("measuring child GPU 0") for ln in lines)
    assert "deep_timeline" not in diagnose({"schema": facts["schema"], "meta": facts["meta"]}).to_json()


def test_the_clock_starts_at_this_process_start():
    ago = started_ago()
    assert ago is not None and 0 < ago < 3600
    tl = Timeline()
    assert abs(tl.now() - started_ago()) < TICK
    tl.child(1.0, {"startup_s": 0.05, "phases": [["import torch", 0.0, 2.0], ["gemm", 2.0, 2.25]]}, ended=3.5, gpu=0)
    got = [(p["phase"], p["start_s"], p["end_s"]) for p in tl.to_json()["phases"]]
    assert got == [("interpreter start-up", 1.0, 1.05), ("import torch", 1.05, 3.05), ("gemm", 3.05, 3.3),
                   ("exit", 3.3, 3.5)]
