"""What the validator needs from a model's config.json (and safetensors index): heads, layers, context, bytes.

Reading follows SGLang: the text config of a multimodal model (ModelConfig.hf_text_config), the context length
rule of utils/hf_transformers/common.py::get_context_length, and KV heads defaulting to attention heads.
Unreadable input raises InputError with the file and line, so the CLI prints one line and exits 3.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from gpudoctor.errors import InputError

# utils/hf_transformers/common.py::CONTEXT_LENGTH_KEYS (order matters: the first present wins)
CONTEXT_LENGTH_KEYS = ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length", "max_position_embeddings")

_DTYPE_BYTES = {"float32": 4, "float": 4, "fp32": 4, "bfloat16": 2, "float16": 2, "half": 2, "bf16": 2, "fp16": 2,
                "float8_e4m3fn": 1, "fp8": 1, "int8": 1}


def read_json(path: str) -> dict:
    """Parse a JSON object file; a bad file is an InputError naming the file and line."""
    from gpudoctor.files.inputs import json_depth_exceeds, read_text

    text = read_text(path, what="model config", max_bytes=16 << 20)  # a regular file (never a FIFO), UTF-8
    if json_depth_exceeds(text, 64) is not None:
        raise InputError("invalid JSON: nests deeper than 64 levels", path=path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"invalid JSON: {exc.msg} (column {exc.colno})", path=path, line=exc.lineno) from exc
    if not isinstance(data, dict):
        raise InputError(f"expected a JSON object, found {type(data).__name__}", path=path, line=1)
    return data


def _int_field(cfg: dict, key: str, path: str | None, text_key: str = "", lo: int = 0) -> int | None:
    from gpudoctor.files.inputs import brief

    v = cfg.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        want = "a non-negative integer" if lo == 0 else f"an integer >= {lo}"
        raise InputError(f"{text_key}{key} must be {want}, found {brief(v, 40)}", path=path,
                         line=_line_of(path, key))
    return v


def _line_of(path: str | None, key: str) -> int | None:
    """The first line of a JSON file that names key (for error messages)."""
    if not path or not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if f'"{key}"' in line:
                    return n
    except OSError:
        return None
    return None


@dataclass
class ModelFacts:
    """The shape of a model as SGLang sees it; None where config.json does not say."""

    path: str | None
    architecture: str | None
    num_attention_heads: int | None
    num_kv_heads: int | None
    head_dim: int | None
    num_layers: int | None
    hidden_size: int | None
    context_length: int  # derived as SGLang derives it
    context_source: str  # which key (and rope factor) gave it
    dtype_bytes: int
    is_mla: bool = False
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    # hybrid / linear attention (Qwen3-Next / Qwen3.5 gated delta net)
    is_hybrid: bool = False
    full_attention_layers: int | None = None
    linear_layers: int = 0
    linear_num_key_heads: int | None = None
    linear_num_value_heads: int | None = None
    linear_key_head_dim: int | None = None
    linear_value_head_dim: int | None = None
    linear_conv_kernel_dim: int | None = None
    hybrid_kind: str | None = None  # "gdn" (modelled) or another family (detected, not modelled)
    weights_bytes: int | None = None
    weights_source: str = ""
    raw: dict = field(default_factory=dict, repr=False)

    @property
    def attention_layers(self) -> int | None:
        return self.full_attention_layers if self.is_hybrid else self.num_layers


# transformers 5.x (modeling_rope_utils.py::RotaryEmbeddingConfigMixin.standardize_rope_params): rope_scaling becomes
# rope_parameters; `type` is copied to `rope_type`; for these types original_max_position_embeddings is inserted
# (= the top-level original_max_position_embeddings if the config has one, else max_position_embeddings).
ROPE_TYPES_WITH_ORIGINAL = ("llama3", "yarn", "longrope")


def standardized_rope(cfg: dict) -> dict | None:
    """The rope dict SGLang reads (getattr(config, 'rope_scaling')) after transformers 5.x rewrote the config."""
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling")
    if not isinstance(rope, dict):
        return None
    rope = dict(rope)
    if any(isinstance(v, dict) for v in rope.values()):  # nested per layer type: not a scaling dict
        return rope
    rope.setdefault("rope_type", rope.get("type", "default"))
    if rope["rope_type"] in ROPE_TYPES_WITH_ORIGINAL:
        if cfg.get("original_max_position_embeddings") is not None:
            rope["original_max_position_embeddings"] = cfg["original_max_position_embeddings"]
        elif cfg.get("max_position_embeddings") is not None:
            rope.setdefault("original_max_position_embeddings", cfg["max_position_embeddings"])
    return rope


# max_position_embeddings a transformers 5.19 config class sets when config.json leaves it out (its __init__ default;
# read from AutoConfig.for_model(model_type)). SGLang then reads that value like any other.
TRANSFORMERS_MAX_POS_DEFAULTS = {
    "llama": 2048, "qwen2": 32768, "qwen3": 32768, "qwen3_moe": 32768, "qwen3_next": 32768, "mistral": 131072,
    "mixtral": 131072, "deepseek_v2": 2048, "deepseek_v3": 4096, "gemma": 8192, "gemma2": 8192, "gemma3_text": 131072,
    "phi3": 4096, "glm4_moe": 131072, "gpt_oss": 131072, "granite": 2048, "olmo2": 2048, "starcoder2": 4096,
    "falcon": 2048, "gpt_neox": 2048, "cohere": 8192, "minimax": 131072,
}


def derive_context_length(cfg: dict) -> tuple[int, str]:
    """utils/hf_transformers/common.py::get_context_length over the config as transformers 5.x loads it."""
    default_note = ""
    if cfg.get("max_position_embeddings") is None and cfg.get("model_type") in TRANSFORMERS_MAX_POS_DEFAULTS:
        cfg = dict(cfg, max_position_embeddings=TRANSFORMERS_MAX_POS_DEFAULTS[cfg["model_type"]])
        default_note = f" (absent from config.json: transformers' {cfg['model_type']} default)"
    raw = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    rope = standardized_rope(cfg)
    factor = 1
    note = ""
    if rope:
        factor = rope.get("factor", 1) or 1
        if isinstance(factor, bool) or not isinstance(factor, (int, float)):
            factor = 1  # not a number: no scaling to apply (a str would repeat, not multiply)
        if "original_max_position_embeddings" in rope:
            if isinstance(raw, dict) and "original_max_position_embeddings" not in raw and factor != 1:
                note = (f" (rope {rope['rope_type']} factor {factor} ignored: transformers inserts "
                        f"original_max_position_embeddings={rope['original_max_position_embeddings']})")
            factor = 1
        if rope.get("rope_type") == "llama3":
            factor = 1
    for key in CONTEXT_LENGTH_KEYS:
        val = cfg.get(key)
        if val is not None:
            try:
                n = int(factor * val)
            except (TypeError, ValueError):
                continue
            src = (key if factor == 1 else f"{key} {val} x rope_scaling.factor {factor}") + note
            if key == "max_position_embeddings":
                src += default_note
            return n, src
    return 2048, "no length key (SGLang's fallback 2048)"


def mtp_layers(cfg: dict) -> int:
    """Draft (MTP/NEXTN) layers the checkpoint declares: num_nextn_predict_layers / mtp_num_hidden_layers."""
    t = _text_config(cfg)
    for key in ("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_layers"):
        for c in (t, cfg):
            v = c.get(key)
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return v
    return 0


def _text_config(cfg: dict) -> dict:
    for k in ("text_config", "language_config", "llm_config"):
        sub = cfg.get(k)
        if isinstance(sub, dict) and sub.get("num_attention_heads") is not None:
            merged = dict(sub)
            merged.setdefault("architectures", cfg.get("architectures"))
            return merged
    return cfg


def _dtype_bytes(cfg: dict) -> int:
    d = cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"
    return _DTYPE_BYTES.get(str(d).replace("torch.", ""), 2)


def facts_from_config(cfg: dict, path: str | None = None) -> ModelFacts:
    """Derive ModelFacts from a parsed config.json dict."""
    arch_list = cfg.get("architectures") or []
    arch = arch_list[0] if isinstance(arch_list, list) and arch_list else None
    t = _text_config(cfg)
    # a model has at least one head, layer and hidden unit: 0 is a broken config, not a tiny model
    heads = _int_field(t, "num_attention_heads", path, lo=1)
    kv = _int_field(t, "num_key_value_heads", path, lo=1)
    if kv is None:
        kv = _int_field(t, "num_kv_heads", path, lo=1)
    if kv is None:
        kv = heads
    hidden = _int_field(t, "hidden_size", path, lo=1)
    head_dim = _int_field(t, "head_dim", path, lo=1)
    if head_dim is None and hidden and heads:
        head_dim = hidden // heads
    layers = _int_field(t, "num_hidden_layers", path, lo=1)
    ctx, ctx_src = derive_context_length(t)
    facts = ModelFacts(path=path, architecture=arch, num_attention_heads=heads, num_kv_heads=kv, head_dim=head_dim,
                       num_layers=layers, hidden_size=hidden, context_length=ctx, context_source=ctx_src,
                       dtype_bytes=_dtype_bytes(t), raw=cfg)
    if t.get("kv_lora_rank"):
        facts.is_mla = True
        facts.kv_lora_rank = _int_field(t, "kv_lora_rank", path)
        facts.qk_rope_head_dim = _int_field(t, "qk_rope_head_dim", path) or 64
    _hybrid(facts, t, path)
    return facts


def _hybrid(facts: ModelFacts, t: dict, path: str | None) -> None:
    layer_types = t.get("layer_types")
    has_linear = any(k in t for k in ("linear_num_value_heads", "linear_num_key_heads"))
    if isinstance(layer_types, list) and any(x in ("linear_attention", "mamba", "mamba2") for x in layer_types):
        facts.is_hybrid = True
        facts.full_attention_layers = sum(1 for x in layer_types if x in ("full_attention", "attention"))
        facts.linear_layers = len(layer_types) - facts.full_attention_layers
    elif has_linear and facts.num_layers:
        interval = t.get("full_attention_interval") or 4
        facts.is_hybrid = True
        facts.full_attention_layers = facts.num_layers // interval
        facts.linear_layers = facts.num_layers - facts.full_attention_layers
    elif any(k in t for k in ("hybrid_override_pattern", "mamba_num_heads", "ssm_state_size", "attn_layer_indices")):
        facts.is_hybrid = True
        facts.hybrid_kind = "other"
        pattern = t.get("hybrid_override_pattern")
        if isinstance(pattern, str):
            facts.full_attention_layers = pattern.count("*")
            facts.linear_layers = pattern.count("M")
        return
    if facts.is_hybrid and has_linear:
        facts.hybrid_kind = "gdn"
        facts.linear_num_key_heads = _int_field(t, "linear_num_key_heads", path)
        facts.linear_num_value_heads = _int_field(t, "linear_num_value_heads", path)
        facts.linear_key_head_dim = _int_field(t, "linear_key_head_dim", path)
        facts.linear_value_head_dim = _int_field(t, "linear_value_head_dim", path)
        facts.linear_conv_kernel_dim = _int_field(t, "linear_conv_kernel_dim", path) or 4
    elif facts.is_hybrid:
        facts.hybrid_kind = "other"


def estimate_param_count(facts: ModelFacts) -> int | None:
    """Parameters of a decoder-only transformer from its config (dense or MoE); None if the config is too thin."""
    t = _text_config(facts.raw)
    h, layers, heads = facts.hidden_size, facts.num_layers, facts.num_attention_heads
    if not (h and layers and heads):
        return None
    vocab = t.get("vocab_size") or 32000
    hd = facts.head_dim or h // heads
    kv = facts.num_kv_heads or heads
    if facts.is_mla:
        q_rank = t.get("q_lora_rank") or 0
        nope, rope, v = t.get("qk_nope_head_dim") or 128, facts.qk_rope_head_dim or 64, t.get("v_head_dim") or 128
        q = (h * q_rank + q_rank * heads * (nope + rope)) if q_rank else h * heads * (nope + rope)
        attn = q + h * (facts.kv_lora_rank + rope) + facts.kv_lora_rank * heads * (nope + v) + heads * v * h
    else:
        attn = h * heads * hd + 2 * h * kv * hd + heads * hd * h
    inter = t.get("intermediate_size") or 4 * h
    n_experts = t.get("n_routed_experts") or t.get("num_experts") or t.get("num_local_experts") or 0
    if n_experts:
        moe_inter = t.get("moe_intermediate_size") or inter
        shared = (t.get("n_shared_experts") or 0) * 3 * h * moe_inter
        if t.get("shared_expert_intermediate_size"):
            shared = 3 * h * t["shared_expert_intermediate_size"]
        dense_layers = t.get("first_k_dense_replace") or 0
        mlp_total = dense_layers * 3 * h * inter + (layers - dense_layers) * (n_experts * 3 * h * moe_inter + shared)
    else:
        mlp_total = layers * 3 * h * inter
    if facts.is_hybrid and facts.hybrid_kind == "gdn":
        kd = (facts.linear_num_key_heads or 0) * (facts.linear_key_head_dim or 0)
        vd = (facts.linear_num_value_heads or 0) * (facts.linear_value_head_dim or 0)
        lin = h * (2 * kd + 2 * vd) + vd * h
        attn_total = (facts.full_attention_layers or 0) * attn + facts.linear_layers * lin
    else:
        attn_total = layers * attn
    embed = vocab * h * (1 if t.get("tie_word_embeddings") else 2)
    return int(embed + attn_total + mlp_total)


def _quant_bytes_per_param(cfg: dict, dtype_bytes: int) -> float:
    q = cfg.get("quantization_config")
    if not isinstance(q, dict):
        return float(dtype_bytes)
    method = str(q.get("quant_method", "")).lower()
    bits = q.get("bits") or q.get("num_bits")
    groups = q.get("config_groups")
    if not bits and isinstance(groups, dict):  # compressed-tensors: config_groups.*.weights.num_bits
        found = [g.get("weights", {}).get("num_bits") for g in groups.values()
                 if isinstance(g, dict) and isinstance(g.get("weights"), dict)]
        found = [b for b in found if isinstance(b, int) and b > 0]
        bits = max(found) if found else None
    if bits:
        return bits / 8
    if "fp8" in method or "fp8" in str(q.get("fmt", "")):
        return 1.0
    if method in ("awq", "gptq", "mxfp4", "nvfp4", "modelopt_fp4"):
        return 0.5
    return float(dtype_bytes)


def load_model(path: str) -> ModelFacts:
    """Read a model directory (config.json + safetensors index) or a config.json file."""
    cfg_path = os.path.join(path, "config.json") if os.path.isdir(path) else path
    cfg = read_json(cfg_path)
    facts = facts_from_config(cfg, cfg_path)
    model_dir = os.path.dirname(cfg_path)
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.isfile(index):
        idx = read_json(index)
        total = (idx.get("metadata") or {}).get("total_size") if isinstance(idx.get("metadata"), dict) else None
        if isinstance(total, int) and total > 0:
            facts.weights_bytes, facts.weights_source = total, f"{index} metadata.total_size"
    if facts.weights_bytes is None:
        single = os.path.join(model_dir, "model.safetensors")
        if os.path.isfile(single):
            facts.weights_bytes, facts.weights_source = os.path.getsize(single), f"size of {single}"
    if facts.weights_bytes is None:
        estimate_weights(facts)
    return facts


def estimate_weights(facts: ModelFacts) -> None:
    n = estimate_param_count(facts)
    if n is not None:
        bpp = _quant_bytes_per_param(facts.raw, facts.dtype_bytes)
        facts.weights_bytes = int(n * bpp)
        facts.weights_source = f"estimated from config.json: {n / 1e9:.2f} B params x {bpp:g} bytes"
