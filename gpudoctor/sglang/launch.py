"""What SGLang 0.5.23 checks once the arguments are resolved and before (or right after) the target model loads.

- check_server_args (arg_groups/validation_hook.py), which the engine runs right after resolve_once: seconds after
  start, after the user waited for the environment and the launch.
- the resolution hooks that judge parallel layout, page size, quantization and KV cache dtype against the GPU
  (arg_groups/parallel_hook.py, kv_cache_hook.py, configs/model_config.py::ModelConfig._verify_quantization).
- the draft worker's context check (speculative/eagle_worker_v2.py, draft_worker_common.py build the draft's
  ModelConfig at the target's context length; configs/model_config.py::ModelConfig._derive_context_length raises):
  after the 10-minute target load.

Each finding names the SGLang file::function that enforces it; stages as in rules.py (`launch` = check_server_args,
`draft` = the draft worker, after the target load).
"""

from __future__ import annotations

from gpudoctor.findings import Finding
from gpudoctor.sglang.argparser import ParsedArgs
from gpudoctor.sglang.modelcfg import ModelFacts
from gpudoctor.sglang.rules import F, Options, Resolved, attention_backends, gpu_of

VALIDATION = "python/sglang/srt/arg_groups/validation_hook.py::check_server_args"
PARALLEL = "python/sglang/srt/arg_groups/parallel_hook.py"
KV_HOOK = "python/sglang/srt/arg_groups/kv_cache_hook.py"
MODEL_CFG = "python/sglang/srt/configs/model_config.py"
TRUE = ("1", "true", "yes", "on")


# layers/quantization/__init__.py: BASE_QUANTIZATION_METHODS, plus mxfp4 on CUDA. The parser's choices also list
# gptq (NPU/CPU/XPU only) and mlx_q4/mlx_q8 (MPS only): on CUDA those end in "Unknown quantization method"
# (unquant is an opt-out, resolved to None).
CUDA_QUANT_METHODS = (
    "fp8", "mxfp8", "minimax_m3_nvfp4", "blockwise_int8", "modelopt", "modelopt_fp8", "modelopt_fp4", "nvfp4_online",
    "modelopt_mixed", "w8a8_int8", "w8a8_fp8", "awq", "awq_marlin", "bitsandbytes", "gguf", "gptq_marlin",
    "moe_wna16", "compressed-tensors", "w4afp8", "petit_nvfp4", "quark", "quark_mxfp4", "auto-round",
    "auto-round-int8", "modelslim", "quark_int4fp8_moe", "humming", "mxfp_w4a8", "mxfp4",
)
# model_config.py::ModelConfig._verify_quantization compatible_quantization_methods / REQUANTIZATION_METHODS
COMPATIBLE_QUANT = {
    "modelopt_fp8": ("modelopt",), "modelopt_fp4": ("modelopt", "fp8"), "modelopt_mixed": ("modelopt",),
    "nvfp4_online": ("fp8", "modelopt_fp8"), "minimax_m3_nvfp4": ("mxfp8",), "petit_nvfp4": ("modelopt",),
    "w8a8_int8": ("compressed-tensors", "compressed_tensors"), "w8a8_fp8": ("compressed-tensors", "compressed_tensors"),
    "auto-round-int8": ("compressed-tensors", "compressed_tensors"),
}
REQUANT = ("quark_mxfp4",)
# Checkpoint methods whose override rules we reproduce; others (modelopt, quark, ...) are not judged.
MODELLED_CKPT_METHODS = ("fp8", "awq", "gptq", "compressed-tensors", "mxfp4", "bitsandbytes", "w8a8_int8", "w8a8_fp8")


# ---------------------------------------------------------------- resolution hooks
def resolve_findings(a: ParsedArgs, model: ModelFacts | None, opt: Options, res: Resolved,
                     draft: ModelFacts | None = None) -> list[Finding]:
    out: list[Finding] = []
    tp, dp, adp = a.get("tp_size"), a.get("dp_size") or 1, a.get("attn_dp_size")
    if a.get("enable_dp_attention") and (adp or 1) == 1:
        adp = dp  # parallel_hook.py::handle_deprecated_dp_attention: --dp-size N --enable-dp-attention -> attn_dp_size N
        dp = 1
    adp = 1 if adp is None else adp
    res.values["attn_dp_size"] = adp
    fn = f"{PARALLEL}::handle_data_parallelism"
    if adp < 1:
        out.append(F("sglang.parallel.attn_dp_size", "fail", f"--attn-dp-size must be positive (got {adp})",
                     source=fn, stage="resolve", error=f"ValueError: --attn-dp-size must be positive (got {adp}).",
                     fix="drop --attn-dp-size or give a positive divisor of --tp-size"))
    elif adp > 1 and dp > 1:
        out.append(F("sglang.parallel.dp_with_attn_dp", "fail",
                     f"--dp-size {dp} with --attn-dp-size {adp}: replicas and attention DP cannot be combined",
                     source=fn, stage="resolve",
                     error=f"ValueError: --dp-size {dp} with --attn-dp-size {adp}: data-parallel replicas combined with attention data parallelism are not supported.",
                     fix="use one of --dp-size (replicas) or --attn-dp-size (attention DP inside one TP group)"))
    elif adp > 1 and isinstance(tp, int) and tp > 0 and tp % adp:
        out.append(F("sglang.parallel.attn_dp_divides_tp", "fail",
                     f"--tp-size {tp} is not divisible by attention DP size {adp}: SGLang stops with a bare AssertionError",
                     source=fn, stage="resolve", error="AssertionError (assert cfg.tp_size % cfg.attn_dp_size == 0)",
                     evidence=[f"tp_size {tp} % attn_dp_size {adp} = {tp % adp}"],
                     fix=f"use an --attn-dp-size that divides {tp} ({', '.join(str(d) for d in range(1, tp + 1) if tp % d == 0)})"))
    out += _kv_dtype(a, model, opt, res)
    algo = str(a.get("speculative_algorithm") or "").upper() or None
    out += _quantization(a, model, opt, draft, "EAGLE" if algo == "NEXTN" else algo)
    return out


KV4_MHA_BACKENDS = ("triton", "torch_native", "flex_attention", "trtllm_mha")
KV4_MLA_BACKENDS = ("flashinfer", "trtllm_mla")


def _kv_dtype(a: ParsedArgs, model: ModelFacts | None, opt: Options, res: Resolved) -> list[Finding]:
    d = a.get("kv_cache_dtype") or "auto"
    gpu = gpu_of(opt)
    if d not in ("nvfp4", "mxfp8", "fp4_mx_block16"):
        return []
    out: list[Finding] = []
    if d in ("nvfp4", "fp4_mx_block16") and (gpu is None or d != "nvfp4" or gpu.sm in (100, 103, 110, 120, 121)):
        pre, dec = attention_backends(a, res.values.get("attention_backend"))
        if d == "nvfp4" and gpu is not None and gpu.sm in (120, 121) and pre == "flashinfer" and \
                a.get("decode_attention_backend") is None:
            dec = "trtllm_mha"  # NVFP4 on SM120 decodes with trtllm_mha (kv_cache_hook.py: uses_mixed_nvfp4)
        mla = bool(model and model.is_mla)
        if pre is not None and pre == dec and pre != "fa4":
            allowed = KV4_MLA_BACKENDS if mla else KV4_MHA_BACKENDS
            if pre not in allowed:
                how = "auto-selected for this GPU" if not a.get("attention_backend") else "given"
                out.append(F("sglang.kv_dtype.backend", "fail",
                             f"--kv-cache-dtype {d} with {'MLA' if mla else 'MHA'} attention needs one of {', '.join(allowed)} "
                             f"as attention backend; {pre} is {how}",
                             source=f"{KV_HOOK}::handle_kv4_compatibility", stage="resolve",
                             error=f"AssertionError: KV4 {'MLA' if mla else 'MHA'} expects attention_backend to be one of {list(allowed)}, but got {pre}",
                             fix=f"add --attention-backend {allowed[0]}, or use --kv-cache-dtype fp8_e4m3"))
    if d not in ("nvfp4", "mxfp8"):
        return out
    if gpu is None:
        return out + [F("sglang.kv_dtype.gpu_unknown", "warn", f"--kv-cache-dtype {d} needs a Blackwell GPU; no --gpu given to check",
                  source=f"{KV_HOOK}::handle_kv4_compatibility / handle_mxfp8_kv_cache_compatibility", stage="resolve",
                  fix="pass --gpu (h200, b200, rtx_pro_6000, ...) so the GPU's SM is checked")]
    if d == "nvfp4" and gpu.sm not in (100, 103, 110, 120, 121):
        return out + [F("sglang.kv_dtype.sm", "fail", f"--kv-cache-dtype nvfp4 needs Blackwell SM100 or SM120; {gpu.name} is SM{gpu.sm}",
                  source=f"{KV_HOOK}::handle_kv4_compatibility", stage="resolve",
                  error="RuntimeError: --kv-cache-dtype=nvfp4 requires Blackwell SM100 or SM120. Use --kv-cache-dtype=fp4_mx_block16 for the block-size-16 FP4 recipe.",
                  fix="use --kv-cache-dtype fp8_e4m3 (or fp4_mx_block16) on this GPU")]
    if d == "mxfp8" and gpu.sm < 100:
        return out + [F("sglang.kv_dtype.sm", "fail", f"--kv-cache-dtype mxfp8 needs an SM100+ (Blackwell) GPU; {gpu.name} is SM{gpu.sm}",
                  source=f"{KV_HOOK}::handle_mxfp8_kv_cache_compatibility", stage="resolve",
                  error="ValueError: --kv-cache-dtype mxfp8 requires an SM100+ (Blackwell) GPU for the block-scaled operands used by the FA4 MXFP8 attention path.",
                  fix="use --kv-cache-dtype fp8_e4m3 on this GPU")]
    return out


def checkpoint_quant(model: ModelFacts | None) -> dict | None:
    if model is None:
        return None
    q = model.raw.get("quantization_config")
    if not isinstance(q, dict):
        t = model.raw.get("text_config")
        q = t.get("quantization_config") if isinstance(t, dict) else None
    return q if isinstance(q, dict) else None


def _marlin_ok(q: dict, method: str) -> bool:
    """gptq.py::GPTQMarlinConfig.is_gptq_marlin_compatible / awq.py::AWQMarlinConfig.is_awq_marlin_compatible (CUDA SM80+)."""
    bits, group = q.get("bits"), q.get("group_size", -1)
    if method == "gptq":
        return bits in (4, 8) and group in (-1, 32, 64, 128) and bool(q.get("sym", True)) \
            and not q.get("checkpoint_format") == "marlin"
    return bits == 4 and group in (-1, 32, 64, 128) and "zero_point" in q


def _quantization(a: ParsedArgs, model: ModelFacts | None, opt: Options, draft: ModelFacts | None = None,
                  algo: str | None = None) -> list[Finding]:
    """The target's quantization at resolve time; the draft's when the draft worker builds its ModelConfig."""
    user = a.get("quantization")
    user = user.lower() if isinstance(user, str) else None
    out = _verify_quantization(user, model, opt, is_draft=False)
    if draft is not None and algo in ("EAGLE", "EAGLE3", "STANDALONE", "FROZEN_KV_MTP", "DFLASH", "DSPARK"):
        # serving_hook.py::handle_missing_default_values: the draft inherits --quantization unless
        # --speculative-draft-model-quantization is given
        du = a.get("speculative_draft_model_quantization")
        du = du.lower() if isinstance(du, str) else user
        out += _verify_quantization(du, draft, opt, is_draft=True)
    return out


def _verify_quantization(user: str | None, model: ModelFacts | None, opt: Options, is_draft: bool) -> list[Finding]:
    """model_config.py::ModelConfig._verify_quantization for one checkpoint (target or draft)."""
    out: list[Finding] = []
    if user == "unquant":
        return out  # serving_hook.py::handle_missing_default_values: an explicit opt-out (quantization None, no auto-detection)
    fn = f"{MODEL_CFG}::ModelConfig._verify_quantization" + (" (draft ModelConfig, built after the target load)" if is_draft else "")
    stage = "draft" if is_draft else "resolve"
    who = "the draft" if is_draft else "the checkpoint"
    q = checkpoint_quant(model)
    final = user
    if q is not None:
        ck = str(q.get("quant_method", user or "")).lower()
        if ck not in MODELLED_CKPT_METHODS:
            return out
        if user not in REQUANT:
            if ck in ("gptq", "awq") and _marlin_ok(q, ck) and user in (None, "marlin", f"{ck}_marlin") \
                    and (gpu_of(opt) is None or gpu_of(opt).sm >= 80):
                ck = user = f"{ck}_marlin"
        if user is None:
            final = ck
        elif user != ck:
            if ck in COMPATIBLE_QUANT.get(user, ()) or user in REQUANT:
                final = user
            elif is_draft:
                final = ck  # a draft keeps its own checkpoint's method ("Using draft model's detected quantization")
            else:
                out.append(F("sglang.quant.mismatch", "fail",
                             f"--quantization {user} does not match the checkpoint's quantization_config.quant_method {ck}",
                             source=fn, stage=stage,
                             error=f"ValueError: Quantization method specified in the model config ({ck}) does not match the quantization method specified in the `quantization` argument ({user}).",
                             evidence=[f"{model.path}: quantization_config.quant_method = {q.get('quant_method')!r}"],
                             fix=f"drop --quantization (SGLang reads {ck} from the checkpoint)"))
                return out
    if final is not None and final not in CUDA_QUANT_METHODS:
        hint = {"gptq": "drop --quantization (a marlin-compatible GPTQ checkpoint runs as gptq_marlin); other GPTQ "
                        "layouts (3-bit, asymmetric) have no CUDA kernel in this release"}.get(
            final, "drop --quantization or pick a CUDA method")
        if is_draft:
            hint = ("use a draft checkpoint in a CUDA format, or pass --speculative-draft-model-quantization "
                    "gptq_marlin / unquant as fits it (the draft inherits --quantization otherwise)")
        out.append(F("sglang.quant.not_on_cuda", "fail",
                     f"{who}'s quantization {final} is not registered on CUDA in SGLang {opt.version}",
                     source=f"{fn} (layers/quantization/__init__.py::BASE_QUANTIZATION_METHODS)", stage=stage,
                     error=f"ValueError: Unknown quantization method: {final}. Must be one of [...]",
                     evidence=["CUDA methods: " + ", ".join(CUDA_QUANT_METHODS)], fix=hint, subject="draft" if is_draft else None))
    return out


# ---------------------------------------------------------------- check_server_args
def launch_findings(a: ParsedArgs, model: ModelFacts | None, opt: Options, res: Resolved) -> list[Finding]:
    """validation_hook.py::check_server_args over the resolved values (run right after resolve_once)."""
    out: list[Finding] = []

    def fail(fid: str, summary: str, error: str, fix: str, **kw):
        out.append(F(f"sglang.launch.{fid}", "fail", summary, source=VALIDATION, stage="launch",
                     error=error, fix=fix, **kw))

    tp, pp, nnodes = a.get("tp_size"), a.get("pp_size"), a.get("nnodes")
    if a.get("ep_join_mode") != "scale" and nnodes == 0:
        fail("nnodes_zero", "--nnodes 0: check_server_args divides tp_size x pp_size by it",
             "ZeroDivisionError: integer modulo by zero", "use --nnodes 1 (or the number of machines)")
    elif a.get("ep_join_mode") != "scale" and all(isinstance(x, int) for x in (tp, pp, nnodes)) \
            and (tp * pp) % nnodes:
        fail("nnodes", f"tp_size {tp} x pp_size {pp} is not divisible by nnodes {nnodes}",
             "AssertionError: tp_size must be divisible by number of nodes", f"choose --tp-size a multiple of {nnodes}")
    mb = a.get("pp_max_micro_batch_size")
    if mb is not None and mb < 1:
        fail("pp_micro_batch", f"--pp-max-micro-batch-size {mb} must be >= 1",
             f"AssertionError: pp_max_micro_batch_size must be a positive integer or None (for auto-compute). Got: {mb}",
             "drop --pp-max-micro-batch-size (auto) or give a positive value")
    if a.get("disable_cuda_graph_padding") and a.get("enable_torch_compile"):
        fail("graph_padding_compile", "--disable-cuda-graph-padding is incompatible with --enable-torch-compile",
             "AssertionError: --disable-cuda-graph-padding is incompatible with --enable-torch-compile.",
             "remove --disable-cuda-graph-padding or --enable-torch-compile")
    dp = a.get("dp_size") or 1
    if a.get("enable_dp_attention") and (a.get("attn_dp_size") or 1) == 1:
        dp = 1
    if dp > 1 and nnodes not in (None, 1):
        fail("dp_multinode", f"--dp-size {dp} across {nnodes} nodes: multi-node data-parallel replicas are not supported",
             "AssertionError: multi-node data-parallel replicas are not supported; use attention DP (--attn-dp-size) across nodes",
             "use --attn-dp-size across nodes, or one replica per node")
    if (a.get("base_gpu_id") or 0) < 0:
        fail("base_gpu_id", f"--base-gpu-id {a.get('base_gpu_id')} is negative", "AssertionError: base_gpu_id must be non-negative",
             "use --base-gpu-id 0 or higher")
    if (a.get("gpu_id_step") if a.get("gpu_id_step") is not None else 1) < 1:
        fail("gpu_id_step", f"--gpu-id-step {a.get('gpu_id_step')} must be >= 1", "AssertionError: gpu_id_step must be positive",
             "use --gpu-id-step 1")
    mdt = a.get("moe_dense_tp_size")
    if mdt not in (None, 1, tp):
        fail("moe_dense_tp_size", f"--moe-dense-tp-size {mdt} must be 1 or --tp-size ({tp})",
             "AssertionError: moe_dense_tp_size only supports None, 1, or tp_size currently", "use --moe-dense-tp-size 1, or drop it")
    served = a.get("served_model_name") or a.get("model_path") or ""
    if ":" in str(served) and not str(served).startswith("runai://"):
        fail("served_model_name", f"served model name {served!r} contains ':' (reserved for model:adapter LoRA syntax)",
             f"AssertionError: served_model_name cannot contain a colon (':') character. ... Invalid value: '{served}'",
             "pass --served-model-name without ':'" + (" (it defaults to --model-path)" if not a.get("served_model_name") else ""))
    mlb = a.get("max_loras_per_batch")
    if isinstance(mlb, int) and mlb <= 0:
        out.append(F("sglang.launch.max_loras_per_batch", "fail", f"--max-loras-per-batch {mlb} must be positive",
                     source="python/sglang/srt/arg_groups/lora_hook.py::check_lora_server_args (from check_server_args)",
                     stage="launch", error="AssertionError: max_loras_per_batch must be positive",
                     fix="use --max-loras-per-batch 8 (the default)"))
    algo = res.values.get("speculative_algorithm")
    if algo is not None and a.get("enable_mixed_chunk") and algo not in ("EAGLE", "EAGLE3", "DFLASH", "DSPARK", "STANDALONE", "NGRAM",
                                                                        "FROZEN_KV_MTP"):
        # spec_info.py::SpeculativeAlgorithm.supports_mixed_chunk: EAGLE, EAGLE3, DFLASH, DSPARK; speculative_hook.py
        # turns it off for STANDALONE, NGRAM and FROZEN_KV_MTP (_handle_eagle_family, _handle_ngram, _handle_frozen_kv_mtp).
        fail("mixed_chunk_spec", f"--enable-mixed-chunk is not supported with {algo}",
             f"AssertionError: enable_mixed_chunk is not supported with speculative_algorithm={algo}", "drop --enable-mixed-chunk")
    chunked = res.values.get("chunked_prefill_size")
    page = res.values.get("page_size")
    if isinstance(chunked, int) and chunked > 0 and a.get("disaggregation_mode") != "decode" and isinstance(page, int):
        if page == 0:
            fail("page_size_zero", "--page-size 0: check_server_args divides chunked_prefill_size by it",
                 "ZeroDivisionError: integer modulo by zero", "drop --page-size (1) or use a positive page size")
        elif chunked % page:
            fail("chunked_page", f"chunked_prefill_size {chunked} is not divisible by page_size {page}",
                 "AssertionError: chunked_prefill_size must be divisible by page_size",
                 f"use a --page-size that divides {chunked} (1, 16, 32, 64) or set --chunked-prefill-size to a multiple of {page}",
                 evidence=[f"chunked_prefill_size {chunked} ({res.values.get('chunked_prefill_source', 'resolved')}), page_size {page}"])
    if a.get("enable_pdmux"):
        if (pp or 1) != 1:
            fail("pdmux_pp", "PD-Multiplexing needs pp_size 1", "AssertionError: PD-Multiplexing is only supported with pipeline parallelism disabled (pp_size=1).", "drop --pp-size")
        if chunked != -1:
            fail("pdmux_chunked", "PD-Multiplexing needs chunked prefill off (--chunked-prefill-size -1)",
                 "AssertionError: PD-Multiplexing is not compatible with chunked prefill.", "add --chunked-prefill-size -1")
        if (a.get("disaggregation_mode") or "null") != "null":
            fail("pdmux_disagg", "PD-Multiplexing is not compatible with disaggregation mode",
                 "AssertionError: PD-Multiplexing is not compatible with disaggregation mode.", "drop --disaggregation-mode")
        if not a.get("disable_overlap_schedule"):
            fail("pdmux_overlap", "PD-Multiplexing needs --disable-overlap-schedule",
                 "AssertionError: PD-Multiplexing is not compatible with overlap schedule.", "add --disable-overlap-schedule")
    for dest, flag, lo in (("tokenizer_worker_num", "--tokenizer-worker-num", 1), ("detokenizer_worker_num", "--detokenizer-worker-num", 1),
                           ("mm_processor_worker_num", "--mm-processor-worker-num", 0), ("mm_io_worker_num", "--mm-io-worker-num", 0)):
        v = a.get(dest)
        if isinstance(v, int) and v < lo:
            name = {"tokenizer_worker_num": "Tokenizer worker num must >= 1", "detokenizer_worker_num": "Detokenizer worker num must >= 1",
                    "mm_processor_worker_num": "Multimodal processor worker num must >= 0",
                    "mm_io_worker_num": "Multimodal I/O worker num must >= 0"}[dest]
            fail("worker_num", f"{flag} {v} must be >= {lo}", f"AssertionError: {name}", f"use {flag} {max(lo, 1)}")
    prio = bool(a.get("enable_priority_scheduling"))
    if prio and a.get("schedule_policy") not in ("fcfs", "lof"):
        fail("priority_policy", f"--enable-priority-scheduling needs --schedule-policy fcfs or lof (got {a.get('schedule_policy')})",
             f"AssertionError: To use priority scheduling, schedule_policy must be 'fcfs' or 'lof'. '{a.get('schedule_policy')}' is not supported.",
             "use --schedule-policy fcfs (or lof)")
    if a.get("retraction_policy") == "priority" and not prio:
        fail("retraction_priority", "--retraction-policy priority needs --enable-priority-scheduling",
             "ValueError: --retraction-policy priority requires --enable-priority-scheduling", "add --enable-priority-scheduling")
    if not prio:
        for dest, flag in (("disable_priority_preemption", "--disable-priority-preemption"),
                           ("default_priority_value", "--default-priority-value")):
            if a.is_set(dest):
                out.append(F("sglang.launch.priority_noop", "warn", f"{flag} has no effect without --enable-priority-scheduling",
                             source=VALIDATION, stage="advice", fix=f"add --enable-priority-scheduling or drop {flag}"))
    sc = a.get("schedule_conservativeness")
    if isinstance(sc, (int, float)) and sc < 0:
        fail("conservativeness", f"--schedule-conservativeness {sc} must be >= 0",
             "AssertionError: schedule_conservativeness must be non-negative", "use --schedule-conservativeness 1.0")
    if a.get("load_format") == "instanttensor" and (a.get("device") or "cuda") != "cuda":
        fail("instanttensor", "--load-format instanttensor needs a CUDA device",
             "ValueError: InstantTensor requires a CUDA-compatible device", "drop --load-format instanttensor")
    if a.get("tokenizer_metrics_allowed_custom_labels") and not a.get("tokenizer_metrics_custom_labels_header"):
        fail("metrics_labels", "--tokenizer-metrics-allowed-custom-labels needs --tokenizer-metrics-custom-labels-header",
             "ValueError: Please set --tokenizer-metrics-custom-labels-header when setting --tokenizer-metrics-allowed-custom-labels.",
             "add --tokenizer-metrics-custom-labels-header HEADER")
    if a.get("export_metrics_to_file") and a.get("export_metrics_to_file_dir") is None:
        fail("metrics_dir", "--export-metrics-to-file needs --export-metrics-to-file-dir",
             "ValueError: --export-metrics-to-file-dir is required when --export-metrics-to-file is enabled",
             "add --export-metrics-to-file-dir DIR")
    if a.get("enable_quant_communications"):
        if tp == 1:
            fail("quant_comm_tp", "--enable-quant-communications needs tp_size > 1",
                 "ValueError: Communications quantization is only used with tp_size != 1", "drop --enable-quant-communications")
        fail("quant_comm_npu", "--enable-quant-communications is NPU-only",
             "ValueError: Communications quantization is only supported for NPU device", "drop --enable-quant-communications")
    grpc = a.get("grpc_port")
    if not (a.get("smg_grpc_mode") or a.get("grpc_mode")) and grpc is not None and grpc == a.get("port"):
        fail("grpc_port", f"--grpc-port {grpc} equals --port", f"ValueError: --grpc-port ({grpc}) must differ from --port ({a.get('port')})",
             f"use another --grpc-port than {grpc}")
    gc = a.get("gc_threshold")
    if gc and not 1 <= len(gc) <= 3:
        fail("gc_threshold", f"--gc-threshold takes 1 to 3 integers (got {len(gc)})",
             "ValueError: When setting gc_threshold, it must contain 1 to 3 integers.", "give 1 to 3 values")
    if (a.get("kv_canary_sweep_interval") or 0) > 0 and (a.get("kv_canary") or "none") == "none":
        fail("kv_canary", "--kv-canary-sweep-interval needs --kv-canary log or raise",
             "ValueError: --kv-canary-sweep-interval requires --kv-canary in {log, raise}", "add --kv-canary log")
    if a.get("sampling_backend") in ("ascend", "intel_xpu"):
        fail("sampling_backend", f"--sampling-backend {a.get('sampling_backend')} is not a CUDA sampling backend",
             "ValueError (validation_hook.py::validate_device_sampling_backend)", "use --sampling-backend flashinfer or pytorch")
    return out


# ---------------------------------------------------------------- the draft worker (after the target load)
def draft_context_findings(a: ParsedArgs, model: ModelFacts | None, draft: ModelFacts | None, opt: Options,
                           res: Resolved) -> list[Finding]:
    """The draft worker runs at the target's context length; a shorter draft context raises after the target load."""
    algo = res.values.get("speculative_algorithm")
    if algo not in ("EAGLE", "EAGLE3", "STANDALONE", "FROZEN_KV_MTP", "DFLASH", "DSPARK") or draft is None:
        return []
    target_ctx = res.values.get("context_len")
    if target_ctx is None and model is not None:
        target_ctx = model.context_length
    if target_ctx is None or target_ctx <= draft.context_length:
        return []
    env = opt.env
    allowed = any(str(env.get(k, "")).lower() in TRUE for k in ("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", "SGLANG_IS_IN_CI"))
    src = (f"{MODEL_CFG}::ModelConfig._derive_context_length (draft built by speculative/eagle_worker_v2.py / "
           "draft_worker_common.py with context_length=target context_len)")
    ev = [f"target context {target_ctx} ({'--context-length' if a.get('context_length') is not None else 'derived from the target config'})",
          f"draft {draft.path}: derived context {draft.context_length} ({draft.context_source})"]
    fix_ctx = (f"pass --context-length {draft.context_length} (the draft's limit)"
               if a.get("context_length") is None else f"lower --context-length to {draft.context_length}")
    if allowed:
        return [F("sglang.spec.draft_context", "warn",
                  f"the draft's context {draft.context_length} is shorter than the target's {target_ctx}; "
                  f"allowed by SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN (the draft's max_position_embeddings is raised to {target_ctx}; "
                  f"acceptance past {draft.context_length} tokens may drop)",
                  source=src, stage="draft", evidence=ev, fix=fix_ctx + " if long prompts matter")]
    msg = (f"Warning: Target model's context_length ({target_ctx}) is greater than the derived context_length "
           f"({draft.context_length}).")
    return [F("sglang.spec.draft_context", "fail",
              f"the draft's derived context {draft.context_length} is shorter than the target's {target_ctx}: the draft worker "
              f"fails after the target model has loaded",
              source=src, stage="draft", evidence=ev,
              error=f"ValueError: {msg} ... To allow overriding this maximum, set the env var SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1",
              fix=f"{fix_ctx}, or set SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 to run the draft past its trained length",
              target_context=target_ctx, draft_context=draft.context_length)]


def tp_zero_findings(a: ParsedArgs) -> list[Finding]:
    tp = a.get("tp_size")
    if isinstance(tp, int) and tp < 1:
        return [F("sglang.parallel.tp_size", "fail", f"--tp-size {tp}: SGLang's resolver accepts it and the model load divides by it",
                  source="python/sglang/srt/layers/linear.py / models/*.py attention (divide(num_heads, tp_size)); not checked by resolve_once or check_server_args",
                  stage="load", error="ZeroDivisionError: integer division or modulo by zero (while building the attention layers)",
                  fix="use --tp-size 1 or the number of GPUs the model is split over")]
    return []


# Values SGLang's resolver and check_server_args accept (the differential shows it) that break later:
# (dest, flag, bad(value), what, SGLang source, stage, fix, error)
LATE_VALUES = (
    ("max_running_requests", "--max-running-requests", lambda v: v <= 0, "the worker starts with no request slot",
     "python/sglang/srt/managers/tp_worker.py (assert model_runner.max_running_requests > 0)", "load",
     "drop --max-running-requests (SGLang sizes it) or give a positive value", "AssertionError: max_running_request is zero"),
    ("context_length", "--context-length", lambda v: v <= 0,
     "every request is at least as long as the context and is refused",
     f"{MODEL_CFG}::ModelConfig._derive_context_length (only a length above the derived one is refused); "
     "managers/tokenizer_manager.py::TokenizerManager._validate_one_request", "request",
     "drop --context-length (the model's own) or give a positive length",
     "ValueError: The input (N tokens) is longer than the model's context length"),
    ("pp_size", "--pp-size", lambda v: v < 1, "no pipeline stage to hold the layers",
     "python/sglang/srt/distributed/utils.py::get_pp_indices (layers split over pp_size)", "load", "use --pp-size 1", None),
    ("page_size", "--page-size", lambda v: v < 0, "the KV pool cannot be built with a negative page",
     "python/sglang/srt/mem_cache/ (token-to-KV pool sized in pages)", "load", "drop --page-size (1) or use 16/32/64", None),
    ("mem_fraction_static", "--mem-fraction-static", lambda v: v > 1, "asks for more than the whole GPU",
     "python/sglang/srt/model_executor/pool_configurator.py::MemoryPoolConfig (budget = total x mem_fraction_static)",
     "load", "drop --mem-fraction-static (SGLang's default) or use a fraction below 1",
     "RuntimeError / CUDA out of memory while allocating the KV cache"),
    ("max_total_tokens", "--max-total-tokens", lambda v: v <= 0, "a KV cache of no tokens",
     "python/sglang/srt/model_executor/pool_configurator.py (max_total_num_tokens capped by --max-total-tokens)",
     "load", "drop --max-total-tokens or give a positive count",
     "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."),
    ("dp_size", "--dp-size", lambda v: v < 1, "no data-parallel replica is started",
     "python/sglang/srt/entrypoints/engine.py (one scheduler group per dp replica)", "load", "use --dp-size 1", None),
)


def late_value_findings(a: ParsedArgs, res: Resolved) -> list[Finding]:
    """LATE_VALUES, plus draft steps/topk of 0 (a warning: speculation that proposes nothing)."""
    out: list[Finding] = []
    for dest, flag, bad, what, source, stage, fix, error in LATE_VALUES:
        v = a.get(dest)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and bad(v):
            out.append(F(f"sglang.value.{dest}", "fail", f"{flag} {v}: {what} (SGLang's resolution accepts it)",
                         source=source, stage=stage, fix=fix, error=error))
    if res.values.get("speculative_algorithm") in ("EAGLE", "EAGLE3", "STANDALONE"):
        for dest, flag in (("speculative_num_steps", "--speculative-num-steps"), ("speculative_eagle_topk", "--speculative-eagle-topk")):
            v = a.get(dest)
            if isinstance(v, int) and v <= 0:
                out.append(F(f"sglang.value.{dest}", "warn",
                             f"{flag} {v}: no draft token is proposed, speculation does no work (SGLang's resolution accepts it)",
                             source="python/sglang/srt/arg_groups/speculative_hook.py::_handle_eagle_family (no lower bound)",
                             stage="request", fix=f"use {flag} 1 or more"))
    return out
