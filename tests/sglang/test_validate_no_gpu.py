"""`sglang validate` with no GPU to plan for — no --gpu, no --gpu-mem-gib, none read from this machine — says the
memory plan is not judged (a warning, exit 1), never "valid" on an assumed card (#41 item 1: a 70B model at --tp 2
was "valid (exit 0)" with 403,806 KV tokens planned for an H200 nobody named; on an H100 1,579 fit).
docs/sglang-validate.md: the checks that need a GPU model warn without one."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gpudoctor.sglang.validate import validate

# meta-llama/Llama-3.1-70B-Instruct's shape
LLAMA_70B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192,
             "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64,
             "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 131072,
             "rope_theta": 500000.0, "torch_dtype": "bfloat16", "tie_word_embeddings": False,
             "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                              "original_max_position_embeddings": 8192, "rope_type": "llama3"}}
ARGS = ["--model-path", "meta-llama/Llama-3.1-70B-Instruct", "--tp", "2"]
# The CLI as it runs on a machine where NVML finds no GPU (this machine in CI; injected so a GPU host gives the same)
NO_GPU_HERE = ("import sys, gpudoctor.sglang.localgpu as l; l.this_machine = lambda: (None, None); "
               "from gpudoctor.entry import main; sys.argv[0] = 'gpudoctor'; main()")


@pytest.fixture
def model(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_70B))
    return str(tmp_path)


def cli(*args):
    return subprocess.run([sys.executable, "-c", NO_GPU_HERE, "sglang", "validate", *args], capture_output=True,
                          text=True, timeout=60)


def test_no_gpu_means_the_memory_plan_is_not_judged(model):
    r = validate(ARGS, model, gpu_mem_gib=None)
    assert r.verdict == "warnings" and r.exit_code == 1
    [f] = [f for f in r.findings if f.id == "sglang.memory.not_judged"]
    assert f.status.value == "warn" and "memory plan not judged: no GPU to plan for" in f.summary
    assert "GiB of weights per GPU" in f.summary and "--gpu" in f.hint
    assert r.memory is None and not [x for x in r.findings if x.id == "sglang.memory.estimate"]
    assert "assumed: no GPU given or found" in r.resolved["mem_fraction_source"]


def test_the_cli_without_a_gpu_warns_instead_of_valid(model):
    r = cli("--model-config", model, "--", *ARGS)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "WARN sglang.memory.not_judged: memory plan not judged: no GPU to plan for" in r.stdout
    assert "verdict: warnings (exit 1)" in r.stdout and "KV tokens" not in r.stdout
    doc = json.loads(cli("--json", "--model-config", model, "--", *ARGS).stdout)
    assert doc["verdict"] == "warnings" and doc["memory"] is None


def test_a_named_gpu_is_judged(model):
    """Told the GPU, the plan is made for it: the H100's 80 GB is not the H200's 141."""
    h100 = json.loads(cli("--json", "--gpu", "h100", "--model-config", model, "--", *ARGS).stdout)
    big = json.loads(cli("--json", "--gpu-mem-gib", "141", "--model-config", model, "--", *ARGS).stdout)
    for doc in (h100, big):
        assert "sglang.memory.not_judged" not in {f["id"] for f in doc["findings"]}
        assert doc["memory"]["max_total_num_tokens"] > 0
    assert h100["memory"]["max_total_num_tokens"] < big["memory"]["max_total_num_tokens"] / 10
