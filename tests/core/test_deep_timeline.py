"""The deep tier's timeline (#51): each phase's start and end, the parent's and each measuring child's own on one
clock, in the deep facts and in `check --json` — measured live on this machine (nvidia-smi stood in, no GPU: the
child's CUDA context fails, which its timeline shows too)."""

import jsonschema

from gpudoctor.diagnose import diagnose
from gpudoctor.gather.deep_timeline import Timeline, render, started_ago

from .test_deep_outputs import SCHEMA
from .test_deep_tier import _live_deep
from tests.standins import torch_venv

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
    assert own[0]["phase"] == "interpreter start-up" and own[0]["start_s"] == child["start_s"]
    ends = [p for p in own if p["phase"] == "exit"]
    assert len(ends) == 1 and ends[0]["end_s"] == child["end_s"]
    assert {"NVML", "NUMA facts", "CUDA context"} <= {p["phase"] for p in own}, own
    assert all(child["start_s"] - TICK <= p["start_s"] and p["end_s"] <= child["end_s"] + TICK for p in own), own
    steps = [p for p in own if p["phase"] not in ("interpreter start-up", "exit")]
    assert all(a["end_s"] <= b["start_s"] + 1e-3 for a, b in zip(steps, steps[1:])), own
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
    tl.child(0.5, {"startup_s": 0.5, "phases": [["import torch", 0.0, 0.1]]}, ended=1.05, prefix="NCCL rank: ", gpu=0)
    got = [(p["phase"], p["start_s"], p["end_s"]) for p in tl.to_json()["phases"]]
    assert got == [("NCCL rank: interpreter start-up", 0.5, 1.0), ("interpreter start-up", 1.0, 1.05),
                   ("NCCL rank: import torch", 1.0, 1.1), ("NCCL rank: exit", 1.05, 1.05),
                   ("import torch", 1.05, 3.05), ("gemm", 3.05, 3.3), ("exit", 3.3, 3.5)]


# --- the overlap (#51): several children and the NCCL probe start at once, and each touches a GPU only in turn ----


def _standin_torch(tmp_path):
    """A venv whose torch imports in 0.4 s and has no CUDA (the deep child runs `python -I`: its own site only)."""
    return torch_venv.make(tmp_path / "venv", 0.4)


_SMI2 = """#!/bin/sh
case "$1" in
  --query-gpu=*) printf '0, 00000000:18:00.0, NVIDIA H100 80GB HBM3\\n1, 00000000:2a:00.0, NVIDIA H100 80GB HBM3\\n' ;;
  --query-compute-apps=*) ;;
  topo) printf '\\tGPU0\\tGPU1\\tCPU Affinity\\tNUMA Affinity\\tGPU NUMA ID\\nGPU0\\t X \\tNV18\\t0-15\\t0\\t\\tN/A\\nGPU1\\tNV18\\t X \\t0-15\\t0\\t\\tN/A\\n' ;;
  *) exit 0 ;;
esac
"""


def test_children_and_the_nccl_probe_start_at_once_and_touch_a_gpu_only_in_turn(tmp_path):
    from gpudoctor.gather import gather
    from gpudoctor.gather.context import GatherContext
    from gpudoctor.host.local import LocalHost

    py = _standin_torch(tmp_path)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "nvidia-smi").write_text(_SMI2)
    (bindir / "nvidia-smi").chmod(0o755)
    ctx = GatherContext(name="here", policy={"deep": True, "torch_python": py}, timeout=10)
    facts = gather(LocalHost(path_prepend=[str(bindir)]), ctx, only={"deep"})
    tl = facts["deep"]["timeline"]

    def one(phase, gpu=None):
        got = [p for p in tl["phases"] if p["phase"] == phase and p.get("gpu") == gpu]
        assert len(got) == 1, (phase, gpu, render(tl))
        return got[0]

    first, second = one("measuring child", 0), one("measuring child", 1)
    # the second child imported torch while the first ran, then waited until the first had exited
    assert one("import torch", 1)["start_s"] < first["end_s"] - 0.2, render(tl)
    assert one("waiting for its turn", 1)["end_s"] >= first["end_s"] - TICK, render(tl)
    assert one("CUDA context (driver)", 1)["start_s"] >= first["end_s"] - TICK, render(tl)
    # the NCCL ranks imported torch beside the children and touched the GPUs only after both had exited
    for gpu in (0, 1):
        assert one("NCCL rank", gpu)["start_s"] < first["end_s"]
        assert one("NCCL rank: import torch", gpu)["start_s"] < first["end_s"] - 0.2, render(tl)
        assert one("NCCL rank: waiting for the measuring children", gpu)["end_s"] >= second["end_s"] - TICK
        assert one("NCCL rank: CUDA context, NCCL init and warm-up", gpu)["start_s"] >= second["end_s"] - TICK
    assert [g.get("seconds_per_op") is not None for g in facts["deep"]["groups"]] == [True]


# --- each figure sized by its confidence (#51) ------------------------------------------------------------------

def _until_stable():
    from gpudoctor.gather.deep_child import PROGRAM

    text = PROGRAM[PROGRAM.index("MIN_REPS = "):PROGRAM.index("def budget_left")]
    ns = {"A": {"reps": {"gemm": 20, "pinned": 5}}}
    exec(text, ns)  # noqa: S102 - the child's own text, run as the child runs it
    return ns["until_stable"]


def test_a_stable_figure_stops_at_its_minimum_and_a_noisy_one_takes_every_rep():
    until_stable = _until_stable()
    steady = iter([1.000, 1.002, 0.999, 1.001, 1.000] + [1.0] * 20)
    ts, why = until_stable(lambda: next(steady), "gemm")
    assert (len(ts), why) == (5, "stable")
    noisy = iter([1.0, 1.5, 0.7, 1.3, 0.8, 1.2] * 4)
    ts, why = until_stable(lambda: next(noisy), "gemm")
    assert (len(ts), why) == (20, "max") and ts == sorted(ts)
    late = iter([1.0, 1.3, 0.7, 1.02, 1.01, 1.0, 1.0, 1.0])  # settles: stops once half lie within 1 % of the median
    ts, why = until_stable(lambda: next(late), "pinned")
    assert why == "stable" and 3 <= len(ts) <= 5
