"""Rules that need the model's config.json: tensor parallel vs heads, context length, and a memory plan."""

from __future__ import annotations

from gpudoctor.findings import Finding
from gpudoctor.sglang.argparser import ParsedArgs
from gpudoctor.sglang.modelcfg import ModelFacts
from gpudoctor.sglang.rules import F, Options, Resolved

GIB = 1 << 30
LLAMA_ATTN = "python/sglang/srt/models/llama.py::LlamaAttention.__init__"
QWEN_GDN = ("python/sglang/srt/models/qwen3_next.py::Qwen3GatedDeltaNet (MergedColumnParallelLinear output_sizes "
            "[num_v_heads]*2 -> layers/linear.py asserts output_size % tp_size == 0)")
MODEL_CFG = "python/sglang/srt/configs/model_config.py::ModelConfig._derive_context_length"
TOKENIZER = "python/sglang/srt/managers/tokenizer_manager.py::TokenizerManager._validate_one_request (input/total length)"
MEM_HOOK = "python/sglang/srt/arg_groups/memory_hook.py::handle_gpu_memory_settings"
KV_CFG = "python/sglang/srt/mem_cache/kv_cache_configurator.py::resolve_max_num_reqs"
TRUE = ("1", "true", "yes", "on")


def parallel_findings(a: ParsedArgs, model: ModelFacts | None, draft: ModelFacts | None, opt: Options) -> list[Finding]:
    out: list[Finding] = []
    tp, pp = a.get("tp_size") or 1, a.get("pp_size") or 1
    dp = a.get("dp_size") or 1
    if opt.gpus is not None and tp * pp * dp > opt.gpus:
        out.append(F("sglang.tp.gpus", "fail", f"tp {tp} x pp {pp} x dp {dp} = {tp * pp * dp} GPUs wanted, host has {opt.gpus}",
                     source="python/sglang/srt/entrypoints/engine.py (one scheduler process per GPU)", stage="load",
                     fix=f"lower --tp-size to at most {opt.gpus // max(1, pp * dp)}"))
    from gpudoctor.sglang.rules import attn_dp_size

    adp = attn_dp_size(a)
    if tp < 1 or adp < 1 or tp % adp:
        return out  # --tp-size 0 / attention DP not dividing tp: their own findings (launch.py); no head split to judge
    attn_tp = tp // adp
    for facts, who in ((model, "model"), (draft, "draft")):
        if facts is not None:
            out += _heads(facts, attn_tp, who)
    return out


def _heads(m: ModelFacts, tp: int, who: str) -> list[Finding]:
    out: list[Finding] = []
    subj = who
    heads, kv = m.num_attention_heads, m.num_kv_heads
    ev = [f"{m.path}: num_attention_heads={heads}, num_key_value_heads={kv}, attention tp={tp}"]
    if heads is None:
        return [F("sglang.tp.heads_unknown", "info", f"{who} config has no num_attention_heads: head split not checked",
                  source=LLAMA_ATTN, subject=subj)]
    if heads % tp:
        divisors = [d for d in (1, 2, 4, 8, 16) if heads % d == 0]
        out.append(F("sglang.tp.attention_heads", "fail",
                     f"{who}: {heads} attention heads do not split over tp {tp}", source=LLAMA_ATTN, stage="load",
                     error="AssertionError (assert self.total_num_heads % tp_size == 0)", evidence=ev, subject=subj,
                     fix=f"use --tp-size in {divisors}"))
    if not m.is_mla and kv:
        if kv >= tp and kv % tp:
            out.append(F("sglang.tp.kv_heads", "fail", f"{who}: {kv} KV heads do not split over tp {tp}",
                         source=LLAMA_ATTN, stage="load", error="AssertionError (assert self.total_num_kv_heads % tp_size == 0)",
                         evidence=ev, subject=subj, fix=f"use a --tp-size that divides {kv} or is a multiple of it"))
        elif kv < tp and tp % kv:
            out.append(F("sglang.tp.kv_heads", "fail", f"{who}: tp {tp} is not a multiple of its {kv} KV heads",
                         source=LLAMA_ATTN, stage="load", error="AssertionError (assert tp_size % self.total_num_kv_heads == 0)",
                         evidence=ev, subject=subj, fix=f"use a --tp-size that divides {kv} or is a multiple of it"))
        elif kv < tp:
            rep = tp // kv
            out.append(F("sglang.tp.kv_heads_replicated", "warn",
                         f"{who}: {kv} KV heads over tp {tp}: SGLang replicates each KV head on {rep} GPUs (it loads and runs); "
                         f"KV cache per GPU per token stays at tp {kv}'s size",
                         source=LLAMA_ATTN + " (kv_heads < tp: assert tp % kv_heads == 0, then replicate)", stage="advice",
                         evidence=ev + [f"kv heads per GPU = max(1, {kv} // {tp}) = 1 (configs/model_config.py::get_num_kv_heads)"],
                         subject=subj, replicas=rep,
                         fix=f"fine to run; --tp-size {kv} holds the same KV tokens per GPU with fewer all-reduce peers"))
    if m.is_hybrid and m.hybrid_kind == "gdn":
        for name, n in (("linear_num_key_heads", m.linear_num_key_heads), ("linear_num_value_heads", m.linear_num_value_heads)):
            if n and n % tp:
                out.append(F("sglang.tp.linear_heads", "fail", f"{who}: {name}={n} does not split over tp {tp}",
                             source=QWEN_GDN, stage="load", evidence=[f"{m.path}: {name}={n}"], subject=subj,
                             error="AssertionError in MergedColumnParallelLinear / divide()",
                             fix=f"use a --tp-size that divides {n}"))
    return out


def context_length(a: ParsedArgs, model: ModelFacts | None) -> tuple[int | None, str]:
    explicit = a.get("context_length")
    if explicit is not None:
        return explicit, "--context-length"
    if model is not None:
        return model.context_length, f"config.json {model.context_source}"
    return None, "unknown (no --context-length and no model config)"


def context_findings(a: ParsedArgs, model: ModelFacts | None, opt: Options, res: Resolved) -> list[Finding]:
    out: list[Finding] = []
    ctx, src = context_length(a, model)
    explicit = a.get("context_length")
    if model is not None and explicit is not None and explicit > model.context_length:
        allowed = str(opt.env.get("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", "")).lower() in TRUE
        ev = [f"--context-length {explicit} > derived {model.context_length} ({model.context_source} in {model.path})"]
        if allowed:
            out.append(F("sglang.context.over_model_limit", "warn",
                         f"--context-length {explicit} exceeds the model's {model.context_length}; allowed by SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 (outputs past {model.context_length} may be wrong)",
                         source=MODEL_CFG, stage="resolve", evidence=ev,
                         fix=f"use --context-length {model.context_length} unless the model was trained longer (rope scaling)"))
        else:
            out.append(F("sglang.context.over_model_limit", "fail",
                         f"--context-length {explicit} exceeds the model's derived {model.context_length}",
                         source=MODEL_CFG, stage="resolve", evidence=ev,
                         error=f"ValueError: User-specified context_length ({explicit}) is greater than the derived context_length ({model.context_length}).",
                         fix=f"use --context-length {model.context_length}, or set SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 if you know the model holds it"))
        ctx = explicit
    res.values["context_len"] = ctx
    il, ol = opt.input_len, opt.output_len
    if ctx is not None and il is not None:
        total = il + (ol or 0)
        ev = [f"context length {ctx} ({src}); input {il} + output {ol or 0} = {total}"]
        if il >= ctx:
            out.append(F("sglang.context.input_too_long", "fail",
                         f"input {il} tokens is not shorter than the context length {ctx}: every such request is rejected",
                         source=TOKENIZER, stage="request", evidence=ev,
                         error=f"ValueError: The input ({il} tokens) is longer than the model's context length ({ctx} tokens).",
                         fix=f"keep prompts under {ctx} tokens"))
        elif ol is not None and total > ctx:
            if a.get("allow_auto_truncate"):
                out.append(F("sglang.context.request_too_long", "warn",
                             f"input {il} + output {ol} = {total} > context {ctx}: --allow-auto-truncate cuts max_new_tokens to {ctx - il}",
                             source=TOKENIZER, stage="request", evidence=ev, fix=f"use output length at most {ctx - il}"))
            else:
                out.append(F("sglang.context.request_too_long", "fail",
                             f"input {il} + output {ol} = {total} > context length {ctx}: every such request gets HTTP 400",
                             source=TOKENIZER, stage="request", evidence=ev,
                             error=f"Requested token count exceeds the model's maximum context length of {ctx} tokens. You requested a total of {total} tokens",
                             fix=f"use input at most {ctx - ol} tokens or output at most {ctx - il}, or raise --context-length (model allows {model.context_length if model else '?'})"))
    return out


# ---------------------------------------------------------------- memory
def _prefill_graph_sizes(max_bs: int) -> list[int]:
    """arg_groups/cuda_graph_hook.py::generate_prefill_cuda_graph_batch_sizes."""
    sizes = (list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32)) + list(range(576, 1025, 64))
             + list(range(1280, 4097, 256)) + list(range(4608, max_bs + 1, 512)))
    return [x for x in sizes if x <= max_bs]


def resolve_memory_defaults(a: ParsedArgs, model: ModelFacts | None, opt: Options, res: Resolved) -> None:
    """memory_hook.py::handle_gpu_memory_settings then parallel_hook.py::handle_data_parallelism, as resolved values.

    Sets chunked_prefill_size (after the attention-DP split), cuda_graph_max_bs_decode, page_size and
    mem_fraction_static (SGLang's default when not given) in res.values.
    """
    from gpudoctor.sglang.rules import default_attention_backend, effective_page_size, gpu_of

    gpu_mib = opt.gpu_mem_gib * 1024
    tp, pp = a.get("tp_size"), a.get("pp_size")
    tp = tp if isinstance(tp, int) else 1  # --tp-size 0 or -1 resolves: the reserve uses tp*pp as given
    pp = pp if isinstance(pp, int) else 1
    adp = a.get("attn_dp_size") or 1
    if a.get("enable_dp_attention") and adp == 1:
        adp = a.get("dp_size") or 1  # parallel_hook.py::handle_deprecated_dp_attention
    chunked = a.get("chunked_prefill_size")
    tier = (2048 if gpu_mib < 20480 else 4096 if gpu_mib < 61440 else 8192 if gpu_mib < 163840 else 16384)
    chunked_src = "--chunked-prefill-size"
    if chunked is None:
        chunked, chunked_src = tier, f"SGLang's default for a {gpu_mib:.0f} MiB GPU"
    max_bs = a.get("cuda_graph_max_bs_decode")
    if max_bs is None:
        max_bs = (8 if gpu_mib < 20480 else (48 if tp < 4 else 160) if gpu_mib < 35840 else
                  (32 if tp < 4 else 160) if gpu_mib < 61440 else (256 if tp < 4 else 512) if gpu_mib < 163840 else 512)
        mrr = a.get("max_running_requests")
        if mrr is not None and max_bs > mrr:
            max_bs = mrr
    mla = bool(model and model.is_mla)
    disabled = bool(a.get("disable_cuda_graph"))
    decode_on = not (disabled or a.get("disable_decode_cuda_graph") or a.get("cuda_graph_backend_decode") == "disabled")
    prefill_on = not (disabled or a.get("disable_prefill_cuda_graph") or a.get("cuda_graph_backend_prefill") == "disabled")
    disagg = a.get("disaggregation_mode") or "null"
    frac = a.get("mem_fraction_static")
    if frac is None:
        if disagg == "decode":
            activation = max((a.get("max_running_requests") or max_bs or 1) * (a.get("speculative_num_draft_tokens") or 1), 2048)
        elif chunked > 0:
            activation = max(chunked, 2048)
        else:
            activation = max(a.get("max_prefill_tokens") or 16384, 2048)
        reserved = 512 + activation * 1.5 + tp * pp / 8 * 1024
        graph = 0.0  # memory_hook.py::reserve_for_graph_mb
        if disagg != "prefill" and decode_on:
            graph += max_bs * 2
        if adp > 1 and disagg != "prefill":
            graph += max_bs * adp * 3 + (max_bs * adp * 1.5 if max_bs > 300 else 0)
        if disagg != "decode" and prefill_on:
            prefill_max = a.get("cuda_graph_max_bs_prefill") or (min(8192, chunked) if mla else chunked)
            if a.get("max_total_tokens") is not None:
                prefill_max = min(prefill_max, a.get("max_total_tokens"))
            graph += 1536 if mla else len(_prefill_graph_sizes(prefill_max)) * 8
        reserved += graph
        if gpu_mib > 60 * 1024:
            reserved = max(reserved, 10 * 1024)
        frac = round((gpu_mib - reserved) / gpu_mib, 3)
        res.values["mem_fraction_source"] = (f"SGLang's default for a {gpu_mib:.0f} MiB GPU: reserved {reserved:.0f} MiB "
                                             f"(activations {activation} x 1.5, tp x pp {tp * pp}, graphs {graph:.0f})")
    if adp > 1 and chunked > 0:
        chunked //= adp  # parallel_hook.py::handle_data_parallelism
        chunked_src += f", divided by attention DP {adp}"
    res.values.update(chunked_prefill_size=chunked, chunked_prefill_source=chunked_src, cuda_graph_max_bs_decode=max_bs,
                      mem_fraction_static=frac)
    backend = default_attention_backend(a, model, gpu_of(opt))
    res.values["attention_backend"] = backend
    res.values["page_size"] = effective_page_size(a, backend)[0]
    gpu = gpu_of(opt)
    if (a.get("kv_cache_dtype") == "nvfp4" and gpu is not None and gpu.sm // 10 in (10, 12)
            and a.get("decode_attention_backend") in (None, "trtllm_mha")
            and res.values["page_size"] not in (16, 32, 64, 128)):
        # NVFP4 KV on Blackwell (SM100 and SM120, whatever --attention-backend says): kv_cache_hook.py:85
        # handle_nvfp4_prefill_kv_dequant_dtype declares decode_attention_backend=trtllm_mha, and overrides.py:1183
        # (_page_size_constraints) then makes any page size outside 16/32/64/128 64 (#28)
        res.values["page_size"] = 64
    backends = {backend, a.get("decode_attention_backend"), a.get("prefill_attention_backend")}
    if ("fa4" in backends and gpu is not None and gpu.sm // 10 == 10 and not (model is not None and model.is_mla)
            and (a.get("speculative_eagle_topk") or 0) <= 1):
        # overrides.py:1274 _fa4_page_constraint: FA4 on SM100 (not MLA, EAGLE topk <= 1) pages at 128, whatever was
        # given (#28)
        res.values["page_size"] = 128


def default_mem_fraction(a: ParsedArgs, gpu_mib: float, model: ModelFacts | None = None) -> float:
    """memory_hook.py::handle_gpu_memory_settings default mem_fraction_static (no VLM adjustment)."""
    from gpudoctor.sglang.rules import Options, Resolved

    res = Resolved()
    b = ParsedArgs(values={k: v for k, v in a.values.items() if k != "mem_fraction_static"}, given=a.given,
                   problems=a.problems, defaults=a.defaults)
    resolve_memory_defaults(b, model, Options(gpu_mem_gib=gpu_mib / 1024), res)
    return res.values["mem_fraction_static"]


def _kv_dtype_bytes(a: ParsedArgs, m: ModelFacts) -> float:
    d = a.get("kv_cache_dtype") or "auto"
    if d in ("auto",):
        return m.dtype_bytes
    if d in ("bf16", "bfloat16"):
        return 2
    if d in ("fp8_e4m3", "fp8_e5m2", "mxfp8"):
        return 1
    return 0.5625  # 4-bit formats with block scales


def kv_bytes_per_token(a: ParsedArgs, m: ModelFacts, tp: int, pp: int) -> float | None:
    layers = m.attention_layers
    if not layers:
        return None
    layers = -(-layers // pp)
    b = _kv_dtype_bytes(a, m)
    if m.is_mla:
        return layers * (m.kv_lora_rank + m.qk_rope_head_dim) * b
    if not (m.num_kv_heads and m.head_dim):
        return None
    return 2 * layers * max(1, m.num_kv_heads // tp) * m.head_dim * b


def _gdn_state_per_req(a: ParsedArgs, m: ModelFacts, tp: int) -> float:
    """Bytes of recurrent state one request holds per GPU (conv window + SSM state over all linear layers)."""
    kd = (m.linear_num_key_heads or 0) * (m.linear_key_head_dim or 0)
    vd = (m.linear_num_value_heads or 0) * (m.linear_value_head_dim or 0)
    conv = (2 * kd + vd) / tp * ((m.linear_conv_kernel_dim or 4) - 1) * 2
    ssm_dtype = a.get("mamba_ssm_dtype") or m.raw.get("mamba_ssm_dtype") or "float32"
    ssm_b = 4 if str(ssm_dtype) in ("float32", "torch.float32") else 2
    ssm = (m.linear_num_value_heads or 0) / tp * (m.linear_value_head_dim or 0) * (m.linear_key_head_dim or 0) * ssm_b
    return m.linear_layers * (conv + ssm)


def not_judged(a: ParsedArgs, model: ModelFacts, draft: ModelFacts | None) -> Finding:
    """The memory plan without a GPU to plan for: a warning that says what is known (the weights per GPU) and what
    would judge it — never a plan on an assumed card."""
    tp, pp = a.get("tp_size") or 1, a.get("pp_size") or 1
    w = model.weights_bytes / (tp * pp)
    ev = [f"weights {model.weights_bytes / GIB:.1f} GiB / (tp {tp} x pp {pp}) = {w / GIB:.1f} GiB per GPU "
          f"({model.weights_source})", "no --gpu, no --gpu-mem-gib, and no GPU read from this machine (NVML)"]
    if draft is not None and draft.weights_bytes:
        ev.append(f"draft weights {draft.weights_bytes / GIB:.2f} GiB / tp {tp} = {draft.weights_bytes / tp / GIB:.2f} "
                  "GiB per GPU")
    return F("sglang.memory.not_judged", "warn",
             f"memory plan not judged: no GPU to plan for ({w / GIB:.1f} GiB of weights per GPU; whether they, the KV "
             "cache and max_running_requests fit depends on the GPU's memory)", source="gpudoctor", evidence=ev,
             fix="pass --gpu (h200, h100, b200, ...) or --gpu-mem-gib for the GPU the server runs on")


def memory_findings(a: ParsedArgs, model: ModelFacts | None, draft: ModelFacts | None, opt: Options,
                    res: Resolved) -> tuple[list[Finding], dict | None]:
    out: list[Finding] = []
    if model is None or model.weights_bytes is None:
        return out, None
    tp, pp = a.get("tp_size") or 1, a.get("pp_size") or 1
    gpu_b = opt.gpu_mem_gib * GIB
    frac = a.get("mem_fraction_static")
    frac_src = "--mem-fraction-static"
    if frac is None:
        frac = res.values.get("mem_fraction_static") or default_mem_fraction(a, opt.gpu_mem_gib * 1024, model)
        frac_src = f"{res.values.get('mem_fraction_source', 'SGLang default')} ({MEM_HOOK})"
    res.values.setdefault("mem_fraction_static", frac)
    budget = gpu_b * frac
    w = model.weights_bytes / (tp * pp)
    dw = (draft.weights_bytes / tp) if draft is not None and draft.weights_bytes else 0.0
    rest = budget - w - dw
    plan = {"gpu_mem_gib": opt.gpu_mem_gib, "mem_fraction_static": frac, "budget_gib": budget / GIB,
            "weights_per_gpu_gib": w / GIB, "draft_weights_per_gpu_gib": dw / GIB, "weights_source": model.weights_source,
            "rest_gib": rest / GIB}
    ev = [f"budget {opt.gpu_mem_gib:g} GiB x mem_fraction_static {frac} ({frac_src}) = {budget / GIB:.1f} GiB per GPU",
          f"weights {model.weights_bytes / GIB:.1f} GiB / (tp {tp} x pp {pp}) = {w / GIB:.1f} GiB per GPU ({model.weights_source})"]
    if dw:
        ev.append(f"draft weights {draft.weights_bytes / GIB:.2f} GiB / tp {tp} = {dw / GIB:.2f} GiB per GPU")
    if rest <= 0:
        out.append(F("sglang.memory.weights_exceed", "fail",
                     f"weights need {(w + dw) / GIB:.1f} GiB per GPU but the static budget is {budget / GIB:.1f} GiB",
                     source="python/sglang/srt/model_executor/pool_configurator.py::MemoryPoolConfig.__post_init__",
                     stage="load", evidence=ev, error="RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.",
                     fix=f"raise --tp-size (weights split {tp} ways now) or use a quantized checkpoint", plan=plan))
        return out, plan
    kvb = kv_bytes_per_token(a, model, tp, pp)
    if draft is not None and a.get("speculative_algorithm"):
        dkv = kv_bytes_per_token(a, draft, tp, 1)
        kvb = (kvb or 0) + (dkv or 0)
    if not kvb:
        out.append(F("sglang.memory.estimate", "info", "memory plan: KV bytes per token unknown (config lacks heads/layers)",
                     source=MEM_HOOK, evidence=ev, plan=plan))
        return out, plan
    requested = a.get("max_running_requests")
    if requested is None:
        requested = res.values.get("max_running_requests")  # 48 with speculation
    kv_budget = rest
    mamba_cap = None
    if model.is_hybrid and model.hybrid_kind == "gdn":
        per_req = _gdn_state_per_req(a, model, tp)
        r = a.get("mamba_full_memory_ratio") or 0.9
        # auto resolves to extra_buffer for GDN hybrids on CUDA (seen in the differential): 3 + 2 slots with overlap
        strategy = a.get("mamba_radix_cache_strategy") or "auto"
        ratio = 3 + (2 if strategy in ("auto", "extra_buffer") and not a.get("disable_overlap_schedule") else
                     1 if strategy in ("auto", "extra_buffer") else 0)
        mbudget = rest * r / (1 + r)
        D = res.values.get("speculative_num_draft_tokens") if res.values.get("speculative_algorithm") else None
        if D:
            K = int((mbudget - per_req * (1 + D)) // (per_req * (1 + D / ratio)))
            capped = min(requested or 1, max(K, 0) // ratio)
            inter = per_req * (capped + 1) * D
        else:
            K = int((mbudget - per_req) // per_req)
            inter = 0.0
        mamba_mem = (max(K, 0) + 1) * per_req + inter
        kv_budget = rest - mamba_mem
        mamba_cap = max(K, 0) // ratio
        plan.update(mamba_state_per_req_mib=per_req / (1 << 20), max_mamba_cache_size=K, mamba_ratio=ratio,
                    mamba_state_gib=mamba_mem / GIB, intermediate_ssm_gib=inter / GIB)
        ev.append(f"hybrid state {per_req / (1 << 20):.1f} MiB per request per GPU; mamba budget {mbudget / GIB:.1f} GiB "
                  f"(ratio {r}) -> max_mamba_cache_size {K}, {ratio} slots per request -> at most {mamba_cap} running"
                  + (f"; intermediate SSM states for {D} draft tokens {inter / GIB:.1f} GiB" if D else ""))
        src = "python/sglang/srt/mem_cache/kv_cache_configurator.py (mamba pool sizing, resolve_max_num_reqs)"
        if K <= 0 or mamba_cap <= 0:
            out.append(F("sglang.memory.mamba_state", "fail",
                         f"hybrid state cache too small: max_mamba_cache_size {K}, {mamba_cap} requests can run",
                         source=src, stage="load", evidence=ev,
                         error="RuntimeError: Hybrid (mamba/linear-attention) state cache is too small to serve any requests.",
                         fix="raise --mem-fraction-static or --tp-size, lower --speculative-num-draft-tokens, or --mamba-ssm-dtype bfloat16",
                         plan=plan))
            return out, plan
        if requested and mamba_cap < requested:
            out.append(F("sglang.memory.mamba_state", "warn",
                         f"hybrid state cache caps running requests at {mamba_cap} (asked {requested})",
                         source=src, stage="load", evidence=ev,
                         fix="lower --max-running-requests to the cap, or --mamba-ssm-dtype bfloat16 to halve the state", plan=plan))
    tokens = int(kv_budget // kvb)
    ctx = res.values.get("context_len") or model.context_length
    est = max(min(int(tokens / ctx * 512), 4096), 2048)
    running = min(requested if requested is not None else est, tokens // 2)
    if mamba_cap is not None:
        running = min(running, mamba_cap)
    plan.update(kv_bytes_per_token=kvb, max_total_num_tokens=tokens, max_running_requests=running, context_len=ctx)
    ev.append(f"KV {kvb / 1024:.1f} KiB per token per GPU -> {tokens} tokens in the KV cache")
    ev.append(f"max_running_requests = min({requested if requested is not None else f'estimate {est}'}, tokens // 2)"
              + (f", mamba cap {mamba_cap}" if mamba_cap is not None else "") + f" = {running} ({KV_CFG})")
    res.values["max_running_requests_effective"] = running
    total = (opt.input_len or 0) + (opt.output_len or 0)
    if total:
        plan["full_length_concurrency"] = tokens // total
        ev.append(f"requests of {total} tokens that fit at once: {tokens // total}")
    if tokens <= 0:
        out.append(F("sglang.memory.kv_none", "fail", "no memory left for the KV cache after weights and state",
                     source="python/sglang/srt/model_executor/pool_configurator.py::MemoryPoolConfig.__post_init__", stage="load",
                     evidence=ev, error="RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.",
                     fix="raise --tp-size or --mem-fraction-static", plan=plan))
    elif total and tokens < total:
        out.append(F("sglang.memory.request_does_not_fit", "fail",
                     f"the KV cache holds {tokens} tokens, fewer than one request of {total}",
                     source="python/sglang/srt/managers/tp_worker.py (max_req_len = min(context_len - 1, max_total_num_tokens - 1))",
                     stage="request", evidence=ev, fix="raise --tp-size or --mem-fraction-static, or shorten the request", plan=plan))
    elif tokens < ctx:
        fits = bool(total) and tokens >= total  # the workload's requests fit: only longer ones would be refused
        out.append(F("sglang.memory.kv_below_context", "info" if fits else "warn",
                     f"the KV cache holds {tokens} tokens, less than the context length {ctx}: longer requests are rejected",
                     source="python/sglang/srt/managers/tp_worker.py (max_req_len = min(context_len - 1, max_total_num_tokens - 1))",
                     stage="request", evidence=ev, fix=f"use --context-length {tokens} or free memory (higher --tp-size)", plan=plan))
    elif requested is not None and requested > tokens // 2:
        out.append(F("sglang.memory.running_reduced", "warn",
                     f"max_running_requests {requested} is reduced to {tokens // 2} by the KV cache size",
                     source=KV_CFG, stage="load", evidence=ev, fix=f"use --max-running-requests {tokens // 2}", plan=plan))
    else:
        out.append(F("sglang.memory.estimate", "ok",
                     f"memory plan fits: {tokens} KV tokens per GPU, max_running_requests {running}",
                     source=MEM_HOOK + " + " + KV_CFG, stage="advice", evidence=ev, plan=plan))
    return out, plan
