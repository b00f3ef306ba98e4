"""SGLang 0.5.23 refusals at resolve time that validate did not model before #28, each cited to its source line:

1. options that are mutually exclusive (the cache family: hierarchical cache, LMCache, the unified-cache linker,
   radix cache off; watermarking vs custom logit processors; an NVFP4-only option without NVFP4),
2. device-capability requirements of KV cache dtypes and attention backends (the GPU's SM major: is_sm90 = 9,
   is_sm100 = 10, is_sm120 = 12, is_blackwell = 10/11/12 in utils/common.py),
3. a model path that is neither a local directory nor a well-formed Hugging Face repo id.

Each rule is a row: when its condition holds on the parsed arguments, SGLang raises the quoted error.
"""

from __future__ import annotations

import os
import re

from gpudoctor.findings import Finding
from gpudoctor.sglang.argparser import ParsedArgs

KV_HOOK = "python/sglang/srt/arg_groups/kv_cache_hook.py"
HICACHE_HOOK = "python/sglang/srt/arg_groups/hicache_hook.py"
VALIDATION_HOOK = "python/sglang/srt/arg_groups/validation_hook.py"
ATTN_HOOK = "python/sglang/srt/arg_groups/attention_hook.py"
OVERRIDES = "python/sglang/srt/arg_groups/overrides.py"


def _on(a: ParsedArgs, dest: str) -> bool:
    return bool(a.get(dest))


def _algo(a: ParsedArgs) -> str | None:
    v = a.get("speculative_algorithm")
    return str(v).upper() if v else None


def _attn_dp(a: ParsedArgs) -> bool:
    from gpudoctor.sglang.rules import attn_dp_size

    return _on(a, "enable_dp_attention") or attn_dp_size(a) > 1


# (id, condition, summary, SGLang's error, source, fix)
EXCLUSIVE = [
    ("sglang.exclusive.hicache_radix",
     lambda a: _on(a, "enable_hierarchical_cache") and _on(a, "disable_radix_cache"),
     "--enable-hierarchical-cache and --disable-radix-cache are mutually exclusive",
     "ValueError: The arguments enable-hierarchical-cache and disable-radix-cache are mutually exclusive and cannot "
     "be used at the same time. Please use only one of them.",
     f"{KV_HOOK}:393::handle_cache_compatibility", "drop one of them (the hierarchical cache extends the radix cache)"),
    ("sglang.exclusive.lmcache_hicache",
     lambda a: _on(a, "enable_lmcache") and _on(a, "enable_hierarchical_cache"),
     "--enable-lmcache and --enable-hierarchical-cache are mutually exclusive",
     "ValueError: --enable-lmcache and --enable-hierarchical-cache are mutually exclusive",
     f"{KV_HOOK}:434::handle_cache_compatibility", "use one KV offload: LMCache or the hierarchical cache"),
    ("sglang.exclusive.lmcache_linker",
     lambda a: _on(a, "enable_lmcache") and _on(a, "enable_unified_cache_external_linker"),
     "--enable-lmcache and --enable-unified-cache-external-linker are mutually exclusive",
     "ValueError: --enable-lmcache and --enable-unified-cache-external-linker are mutually exclusive",
     f"{KV_HOOK}:439::handle_cache_compatibility", "use one of them"),
    ("sglang.exclusive.lmcache_radix",
     lambda a: _on(a, "enable_lmcache") and _on(a, "disable_radix_cache"),
     "--enable-lmcache needs the radix cache; --disable-radix-cache turns it off",
     "ValueError: --enable-lmcache requires radix cache to be enabled",
     f"{KV_HOOK}:444::handle_cache_compatibility", "drop --disable-radix-cache (or --enable-lmcache)"),
    ("sglang.exclusive.lmcache_speculative",
     lambda a: _on(a, "enable_lmcache") and _algo(a) not in (None, "NONE"),
     "--enable-lmcache does not support speculative decoding",
     "NotImplementedError: LMCacheUnifiedRadixCache does not yet support speculative decoding",
     f"{KV_HOOK}:449::handle_cache_compatibility", "drop --enable-lmcache or --speculative-algorithm"),
    ("sglang.exclusive.lmcache_attn_dp",
     lambda a: _on(a, "enable_lmcache") and _algo(a) in (None, "NONE") and _attn_dp(a),
     "--enable-lmcache does not support DP attention",
     "NotImplementedError: LMCacheUnifiedRadixCache does not yet support DP attention",
     f"{KV_HOOK}:453::handle_cache_compatibility", "drop --enable-lmcache or DP attention"),
    ("sglang.exclusive.linker_radix",
     lambda a: _on(a, "enable_unified_cache_external_linker") and (
         _on(a, "disable_radix_cache") or a.get("radix_cache_backend") is not None),
     "--enable-unified-cache-external-linker needs the default radix cache (not disabled, no --radix-cache-backend)",
     "ValueError: --enable-unified-cache-external-linker requires the default UnifiedRadixCache with radix caching "
     "enabled.", f"{HICACHE_HOOK}:44::handle_hicache", "drop --disable-radix-cache / --radix-cache-backend"),
    ("sglang.exclusive.linker_hicache",
     lambda a: _on(a, "enable_unified_cache_external_linker") and not (
         _on(a, "disable_radix_cache") or a.get("radix_cache_backend") is not None)
     and _on(a, "enable_hierarchical_cache"),
     "--enable-unified-cache-external-linker and --enable-hierarchical-cache are mutually exclusive",
     "ValueError: --enable-unified-cache-external-linker and --enable-hierarchical-cache are mutually exclusive.",
     f"{HICACHE_HOOK}:49::handle_hicache", "use one of them"),
    ("sglang.exclusive.watermark_logit_processor",
     lambda a: _on(a, "enable_watermark") and _on(a, "enable_custom_logit_processor"),
     "--enable-watermark and --enable-custom-logit-processor are mutually exclusive",
     "ValueError: --enable-watermark is incompatible with --enable-custom-logit-processor",
     f"{VALIDATION_HOOK}:74", "drop one of them"),
    ("sglang.exclusive.prefill_dequant_needs_nvfp4",
     lambda a: (a.get("kv_cache_dtype") or "auto") != "nvfp4" and (a.get("prefill_kv_cache_dequant_dtype") or "auto") != "auto",
     "--prefill-kv-cache-dequant-dtype applies only with --kv-cache-dtype nvfp4",
     "ValueError: --prefill-kv-cache-dequant-dtype applies only with --kv-cache-dtype=nvfp4.",
     f"{KV_HOOK}:39::handle_nvfp4_prefill_kv_dequant_dtype", "drop --prefill-kv-cache-dequant-dtype"),
]


def exclusive_findings(a: ParsedArgs) -> list[Finding]:
    from gpudoctor.sglang.rules import F

    return [F(fid, "fail", summary, source=src, stage="resolve", error=err, fix=fix)
            for fid, cond, summary, err, src, fix in EXCLUSIVE if cond(a)]


# --- 2. device capability -------------------------------------------------------------------------------------------

def capability_findings(a: ParsedArgs, sm: int | None) -> list[Finding]:
    """Attention backends and KV cache dtypes that SGLang allows only on some GPU generations. sm: major*10+minor of
    the GPU (--gpu), None when unknown (then nothing is claimed)."""
    from gpudoctor.sglang.rules import F

    if sm is None:
        return []
    major = sm // 10
    out: list[Finding] = []
    attn, pre_b, dec_b = a.get("attention_backend"), a.get("prefill_attention_backend"), a.get("decode_attention_backend")
    kv = a.get("kv_cache_dtype") or "auto"

    def fail(fid, summary, err, src, fix):
        out.append(F(fid, "fail", summary, source=src, stage="resolve", error=err, fix=fix,
                     evidence=[f"GPU SM{sm} (compute capability {major}.{sm % 10})"]))

    if "trtllm_mla" in (attn, dec_b) and major not in (10, 11, 12):
        fail("sglang.capability.trtllm_mla", f"the trtllm_mla attention backend needs a Blackwell GPU; this one is SM{sm}",
             "ValueError: TRTLLM MLA backend is only supported on Blackwell GPUs (SM100/SM12x). Please use a different "
             "backend.", f"{OVERRIDES}:1210::_mla_kv_cache_dtype_checks", "use --attention-backend flashinfer (or fa3)")
    if "cutedsl_mla" in (attn, dec_b) and pre_b != "cutedsl_mla" and major != 10:
        fail("sglang.capability.cutedsl_mla", f"the cutedsl_mla attention backend needs an SM100 GPU; this one is SM{sm}",
             "ValueError: CuteDSL MLA backend is only supported on Blackwell GPUs (SM100). Please use a different "
             "backend.", f"{OVERRIDES}:1244::_cutedsl_prefill_backend_fill", "use --attention-backend flashinfer (or fa3)")
    if kv == "nvfp4" and major == 12 and (a.get("prefill_kv_cache_dequant_dtype") or "auto") == "nvfp4":
        fail("sglang.capability.nvfp4_native_prefill", f"native NVFP4 prefill needs SM100; this GPU is SM{sm}",
             "ValueError: Native NVFP4 prefill currently requires SM100; use --prefill-kv-cache-dequant-dtype=fp8_e4m3 "
             "on this platform.", f"{KV_HOOK}:59::handle_nvfp4_prefill_kv_dequant_dtype",
             "use --prefill-kv-cache-dequant-dtype fp8_e4m3 (or auto)")
    return out


def nvfp4_backend_findings(a: ParsedArgs, sm: int | None) -> list[Finding]:
    """handle_nvfp4_prefill_kv_dequant_dtype (Blackwell, --kv-cache-dtype nvfp4): the backends NVFP4 selects itself."""
    from gpudoctor.sglang.rules import F

    if (a.get("kv_cache_dtype") or "auto") != "nvfp4" or sm is None or sm // 10 not in (10, 12):
        return []
    fn = f"{KV_HOOK}::handle_nvfp4_prefill_kv_dequant_dtype"
    explicit = a.get("prefill_attention_backend") or a.get("attention_backend")
    if (a.get("prefill_kv_cache_dequant_dtype") or "auto") == "auto" and explicit is not None \
            and explicit not in ("flashinfer", "trtllm_mha"):
        return [F("sglang.kv_dtype.nvfp4_prefill_backend", "fail",
                  f"--kv-cache-dtype nvfp4 prefills through flashinfer (FP8 workspace) or trtllm_mha (native); "
                  f"{explicit} provides neither", source=f"{KV_HOOK}:53::handle_nvfp4_prefill_kv_dequant_dtype",
                  stage="resolve", error=f"ValueError: NVFP4 prefill supports an FP8 E4M3 workspace or native NVFP4, "
                                         f"but backend {explicit!r} provides neither.",
                  fix="drop --attention-backend: NVFP4 selects its backends")]
    dec = a.get("decode_attention_backend")
    if dec not in (None, "trtllm_mha"):
        return [F("sglang.kv_dtype.nvfp4_decode_backend", "fail",
                  f"--kv-cache-dtype nvfp4 decodes only with trtllm_mha; --decode-attention-backend is {dec}",
                  source=f"{KV_HOOK}:78::handle_nvfp4_prefill_kv_dequant_dtype", stage="resolve",
                  error=f"ValueError: NVFP4 decode requires --decode-attention-backend=trtllm_mha; got {dec!r}. Remove "
                        f"the backend option; NVFP4 selects the supported decode implementation automatically.",
                  fix="drop --decode-attention-backend")]
    del fn
    return []


# --- 3. the model path ----------------------------------------------------------------------------------------------

# huggingface_hub/utils/_validators.py::validate_repo_id (what transformers' AutoConfig.from_pretrained calls on a
# path that is not a local directory): at most one "/", [\w-.] characters, no "--" or "..", no leading/trailing
# "-" or ".", at most 96 characters.
_REPO_ID = re.compile(r"^(\b[\w\-.]+\b/)?\b[\w\-.]+\b$")


def repo_id_problem(s: str) -> str | None:
    """Why `s` is not a well-formed Hugging Face repo id (None when it is one)."""
    if not _REPO_ID.match(s):
        return "a repo id is 'name' or 'namespace/name' of letters, digits, '-', '_', '.'"
    if "--" in s or ".." in s:
        return "'--' and '..' are forbidden in a repo id"
    if s.endswith(".git"):
        return "a repo id cannot end with '.git'"
    if len(s) > 96:
        return "a repo id has at most 96 characters"
    return None


# The tokenizer is not read at resolve time (the differential: a missing --tokenizer-path passes resolution; it fails
# at load): ranges.py's warning covers it.
MODEL_PATHS = {"model_path": "model"}


def model_path_findings(a: ParsedArgs) -> list[Finding]:
    """A --model-path that is not a local directory (or file: a GGUF) is taken for a Hugging Face repo id; one that is
    not a well-formed repo id either is refused at resolve (model config), before any download is tried. An absent
    path that is a well-formed repo id is not judged: with network it is downloaded (without, it fails: an
    environment, not the arguments)."""
    from gpudoctor.files.inputs import brief
    from gpudoctor.sglang.rules import F

    out: list[Finding] = []
    for dest, what in MODEL_PATHS.items():
        p = a.values.get(dest) if a.is_set(dest) else None
        if not isinstance(p, str) or not p or os.path.exists(os.path.expanduser(p)):
            continue
        why = repo_id_problem(p)
        if why is None:
            continue
        flag = a.given.get(dest, "--" + dest.replace("_", "-"))
        out.append(F("sglang.model.path_not_found", "fail",
                     f"{flag} {brief(p, 80)}: not a directory on this machine and not a Hugging Face repo id ({why})",
                     source=MODEL_PATH_SOURCE, stage="resolve", subject=flag, evidence=[f"stat({p}) → ENOENT"],
                     error=f"HFValidationError: Repo id must be in the form 'repo_name' or 'namespace/repo_name': "
                           f"'{p}'. Use `repo_type` argument if needed.",
                     fix=f"point {flag} at the {what} directory (validate on the server, where it exists)"))
    return out


MODEL_PATH_SOURCE = ("python/sglang/srt/configs/model_config.py::ModelConfig -> hf_transformers_utils.py::get_config "
                     "-> huggingface_hub validate_repo_id")
