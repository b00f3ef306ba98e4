"""`sglang validate` without --gpu checks against this machine's GPU, read through NVML (#33): the choice is tested
with the cards an injected reader gives; the real reader (pynvml) is only asked what it sees here."""

from __future__ import annotations

import json
import subprocess
import sys

from gpudoctor.sglang.localgpu import pick, read_nvml, this_machine
from gpudoctor.sglang.rules import Gpu
from gpudoctor.sglang.validate import validate

# What NVML answered on the H200 of 2026-12-03 (h200-2026-12-03/nvml-dump.json: nvmlDeviceGetName "NVIDIA H200",
# nvmlDeviceGetCudaComputeCapability [9, 0]) with nvidia-smi's memory.total of that card (143771 MiB).
H200 = Gpu("NVIDIA H200", 143771, 90)
NVFP4 = ["--model-path", "org/model", "--kv-cache-dtype", "nvfp4"]


def run(*args):
    return subprocess.run([sys.executable, "-m", "gpudoctor", "sglang", "validate", *args], capture_output=True,
                          text=True, timeout=60)


def test_one_known_model_is_chosen_and_said():
    key, f = this_machine(reader=lambda: [H200] * 8)
    assert key == "h200" and f.status.value == "info" and f.id == "sglang.gpu.this_machine"
    assert f.summary == "GPU: --gpu h200, read from this machine (NVML: 8 x NVIDIA H200 (143771 MiB, SM90))"
    # the point of it: the KV cache dtype is judged against the card's SM, not warned about for want of a --gpu
    r = validate(NVFP4, gpu=key)
    assert "sglang.kv_dtype.sm" in r.ids("fail") and "sglang.kv_dtype.gpu_unknown" not in r.ids("warn")


def test_no_nvml_no_gpu_mixed_or_unknown_cards_keep_the_old_behaviour():
    assert pick(None) == (None, None) and pick([]) == (None, None)
    key, f = pick([H200, Gpu("NVIDIA B200", 183359, 100)])
    assert key is None and "different GPUs (NVIDIA B200, NVIDIA H200)" in f.summary and "--gpu" in f.hint
    key, f = pick([Gpu("NVIDIA GeForce RTX 4090", 24564, 89)])
    assert key is None and "NVIDIA GeForce RTX 4090 (24564 MiB, SM89), not one --gpu knows" in f.summary
    assert "sglang.kv_dtype.gpu_unknown" in validate(NVFP4, gpu=key).ids("warn")


def test_the_cli_reads_this_machine_unless_told():
    cards = read_nvml()  # this machine's real answer: None without a driver or GPU (CI), else its cards
    assert cards is None or all(isinstance(c, Gpu) and c.sm >= 10 for c in cards)
    key, _ = pick(cards)
    doc = json.loads(run("--json", "--", *NVFP4).stdout)
    ids = {f["id"] for f in doc["findings"]}
    assert ("sglang.gpu.this_machine" in ids) == bool(cards)
    assert ("sglang.kv_dtype.gpu_unknown" in ids) == (key is None)
    for told in (["--gpu", "b200"], ["--gpu-mem-gib", "80"]):  # named, or the memory given: nothing is read
        doc = json.loads(run("--json", *told, "--", *NVFP4).stdout)
        assert "sglang.gpu.this_machine" not in {f["id"] for f in doc["findings"]}
