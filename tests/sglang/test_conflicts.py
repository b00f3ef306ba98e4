"""The refusal classes validate did not model before #28, one test per class (not per case): mutually exclusive
options, device-capability requirements of KV cache dtypes and attention backends, a model path that is neither a
local directory nor a well-formed repo id; and the page size an FP4 KV cache gets on Blackwell. Each finding names
the SGLang 0.5.23 source line that raises. tests/sglang/test_differential.py holds the same rules to SGLang's own
verdicts (tools/sglang_differential.py)."""

import pytest

from gpudoctor.sglang import conflicts
from gpudoctor.sglang.validate import validate


def fails(argv, gpu="h200"):
    r = validate(["--model-path", "org/model", *argv], gpu=gpu)
    return {f.id: f for f in r.findings if f.status.value == "fail"}, r


H, LM, LINK, NORADIX = ("--enable-hierarchical-cache", "--enable-lmcache", "--enable-unified-cache-external-linker",
                         "--disable-radix-cache")
# rule -> (arguments SGLang refuses, arguments one step away that it takes)
CASES = {
    "sglang.exclusive.hicache_radix": ([H, NORADIX], [[H], [NORADIX]]),
    "sglang.exclusive.lmcache_hicache": ([LM, H], [[LM], [H]]),
    "sglang.exclusive.lmcache_linker": ([LM, LINK], [[LM], [LINK]]),
    "sglang.exclusive.lmcache_radix": ([LM, NORADIX], [[LM], [NORADIX]]),
    "sglang.exclusive.lmcache_speculative": ([LM, "--speculative-algorithm", "NGRAM"],
                                             [[LM], ["--speculative-algorithm", "NGRAM"]]),
    "sglang.exclusive.lmcache_attn_dp": ([LM, "--tp-size", "2", "--attn-dp-size", "2"],
                                         [[LM, "--tp-size", "2"], ["--tp-size", "2", "--attn-dp-size", "2"]]),
    "sglang.exclusive.linker_radix": ([LINK, NORADIX], [[LINK]]),
    "sglang.exclusive.linker_hicache": ([LINK, H], [[LINK], [H]]),
    "sglang.exclusive.watermark_logit_processor": (["--enable-watermark", "--enable-custom-logit-processor"],
                                                   [["--enable-watermark"], ["--enable-custom-logit-processor"]]),
    "sglang.exclusive.prefill_dequant_needs_nvfp4": (["--prefill-kv-cache-dequant-dtype", "fp8_e4m3"],
                                                     [["--prefill-kv-cache-dequant-dtype", "auto"]]),
}


def test_every_exclusive_rule_has_a_case():
    assert sorted(CASES) == sorted(fid for fid, *_ in conflicts.EXCLUSIVE)


@pytest.mark.parametrize("fid", sorted(CASES))
def test_mutually_exclusive_options_fail_at_resolve_and_one_step_away_do_not(fid):
    bad, oks = CASES[fid]
    got, r = fails(bad)
    assert fid in got and r.verdict == "invalid"
    f = got[fid]
    assert f.data["stage"] == "resolve" and f.data["source"].startswith("python/sglang/srt/arg_groups/")
    assert f.data["sglang_error"]
    for ok in oks:
        got_ok, _ = fails(ok)
        assert not any(k.startswith("sglang.exclusive.") for k in got_ok), (ok, list(got_ok))


@pytest.mark.parametrize("argv,gpu,fid", [
    (["--attention-backend", "trtllm_mla"], "h200", "sglang.capability.trtllm_mla"),
    (["--attention-backend", "cutedsl_mla"], "h200", "sglang.capability.cutedsl_mla"),
    (["--attention-backend", "cutedsl_mla"], "rtx_pro_6000", "sglang.capability.cutedsl_mla"),
    (["--kv-cache-dtype", "nvfp4", "--prefill-kv-cache-dequant-dtype", "nvfp4"], "rtx_pro_6000",
     "sglang.capability.nvfp4_native_prefill"),
    (["--kv-cache-dtype", "nvfp4", "--decode-attention-backend", "triton"], "b200", "sglang.kv_dtype.nvfp4_decode_backend"),
    (["--kv-cache-dtype", "nvfp4", "--attention-backend", "fa3"], "b200", "sglang.kv_dtype.nvfp4_prefill_backend"),
    (["--kv-cache-dtype", "nvfp4"], "h200", "sglang.kv_dtype.sm"),
])
def test_device_capability_of_backends_and_kv_dtypes(argv, gpu, fid):
    got, _ = fails(argv, gpu)
    assert fid in got, list(got)
    assert got[fid].data["stage"] == "resolve" and got[fid].data["sglang_error"]


@pytest.mark.parametrize("argv,gpu", [
    (["--attention-backend", "trtllm_mla"], "b200"), (["--attention-backend", "trtllm_mla"], "rtx_pro_6000"),
    (["--attention-backend", "cutedsl_mla"], "b200"), (["--kv-cache-dtype", "nvfp4"], "b200"),
    (["--kv-cache-dtype", "nvfp4", "--prefill-kv-cache-dequant-dtype", "nvfp4"], "b200"),
])
def test_the_same_on_a_gpu_that_has_the_capability_is_no_capability_failure(argv, gpu):
    got, _ = fails(argv, gpu)
    assert not any(k.startswith("sglang.capability.") or k.startswith("sglang.kv_dtype.") for k in got), list(got)


def test_without_a_gpu_nothing_is_claimed_about_capability():
    r = validate(["--model-path", "org/model", "--attention-backend", "trtllm_mla"])
    assert not any(f.id.startswith("sglang.capability.") for f in r.findings)


@pytest.mark.parametrize("path,bad", [
    ("/nonexistent/models/llama", True), ("./no-such-model", True), ("meta--llama/x", True), ("a/b/c", True),
    ("org/model.git", True), ("x" * 97, True),
    ("meta-llama/Llama-3.1-8B-Instruct", False), ("gpt2", False), ("Qwen/Qwen3-8B", False),
])
def test_a_model_path_neither_a_directory_nor_a_repo_id_fails(path, bad, tmp_path):
    r = validate(["--model-path", path], gpu="h200")
    ids = [f.id for f in r.findings if f.status.value == "fail"]
    assert ("sglang.model.path_not_found" in ids) is bad, ids
    assert (conflicts.repo_id_problem(path) is not None) is bad


def test_an_existing_directory_or_file_is_never_taken_for_a_repo_id(tmp_path):
    d = tmp_path / "a" / "b" / "model"
    d.mkdir(parents=True)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    for p in (str(d), str(gguf)):
        r = validate(["--model-path", p], gpu="h200")
        assert "sglang.model.path_not_found" not in [f.id for f in r.findings]


@pytest.mark.parametrize("gpu,page,want", [("b200", "1", 64), ("rtx_pro_6000", "1", 64), ("b200", "32", 32),
                                           ("b200", "8", 64), ("h200", "1", 1)])
def test_fp4_kv_cache_page_size_on_blackwell(gpu, page, want):
    """kv_cache_hook.py handle_nvfp4_prefill_kv_dequant_dtype puts decode on trtllm_mha on Blackwell; its page
    constraint (overrides.py) makes a page size outside 16/32/64/128 64."""
    r = validate(["--model-path", "org/model", "--kv-cache-dtype", "nvfp4" if gpu != "h200" else "fp8_e4m3",
                  "--page-size", page], gpu=gpu)
    assert r.resolved["page_size"] == want


@pytest.mark.parametrize("gpu,page,want", [("b200", "1", 128), ("b200", "16", 128), ("rtx_pro_6000", "1", 1),
                                           ("h200", "1", 1)])
def test_fa4_pages_at_128_on_sm100(gpu, page, want):
    """overrides.py _fa4_page_constraint: FA4 on SM100, a non-MLA model, EAGLE topk <= 1 -> page size 128."""
    r = validate(["--model-path", "org/model", "--attention-backend", "fa4", "--page-size", page], gpu=gpu)
    assert r.resolved["page_size"] == want


def test_a_path_of_another_machine_with_its_config_given_is_not_judged_here(tmp_path):
    """A campaign validates with the config read on its target (and --model-config on the CLI): the path is the
    server's, so its absence here says nothing."""
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 768, "num_attention_heads": 6,
           "num_key_value_heads": 2, "num_hidden_layers": 4, "intermediate_size": 2048, "vocab_size": 32000,
           "max_position_embeddings": 4096, "torch_dtype": "bfloat16"}
    r = validate(["--model-path", "/models/only-on-the-server"], cfg, gpu="h200")
    assert "sglang.model.path_not_found" not in [f.id for f in r.findings]

    r = validate(["--model-path", "/models/only-on-the-server"], gpu="h200", paths_here=False)
    assert "sglang.model.path_not_found" not in [f.id for f in r.findings]
