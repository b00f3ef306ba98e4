"""SGLang argument rules, each checked against SGLang's own source (file::function named in every finding).

Rules are pure: (ParsedArgs, ModelFacts, options) -> Findings. `stage` in a finding's data says when SGLang
itself would fail: parse (argparse exits 2 at once), resolve (ServerArgs resolution, seconds after start),
load (after or during the model load: minutes), request (when a request arrives), advice (SGLang runs).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpudoctor.findings import Finding, Status
from gpudoctor.sglang.argparser import FlagTable, ParsedArgs
from gpudoctor.sglang.modelcfg import ModelFacts, mtp_layers

SPEC_HOOK = "python/sglang/srt/arg_groups/speculative_hook.py"
SPEC_INFO = "python/sglang/srt/speculative/spec_info.py"
ARGPARSE = "python/sglang/srt/server_args.py::prepare_server_args (argparse, allow_abbrev=True)"

BUILTIN_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DSPARK", "UNO", "FROZEN_KV_MTP")
EAGLE_FAMILY = ("EAGLE", "EAGLE3", "STANDALONE")
# speculative_hook.py::_handle_eagle_family: targets that carry their own MTP/NEXTN draft layer
SELF_DRAFT_ARCHS = (
    "DeepseekV32ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV4ForCausalLM", "Glm4MoeForCausalLM",
    "Glm4MoeLiteForCausalLM", "GlmMoeDsaForCausalLM", "BailingMoeForCausalLM", "BailingMoeV2ForCausalLM",
    "BailingMoeV2_5ForCausalLM", "MistralLarge3ForCausalLM", "PixtralForConditionalGeneration", "HYV3ForCausalLM",
    "HYV4ForCausalLM", "Qwen4ExpForConditionalGeneration",
)
# configs/model_config.py::ModelConfig._config_draft_model: targets whose checkpoint the draft worker rewrites to its
# MTP/NEXTN form when no draft path is given (the draft worker falls back to --model-path).
MTP_REWRITE_ARCHS = {
    "Qwen3NextForCausalLM": "Qwen3NextForCausalLMMTP", "MiMoForCausalLM": "MiMoMTP", "Step3p5ForCausalLM": "Step3p5MTP",
    "Ernie4_5_MoeForCausalLM": "Ernie4_5_MoeForCausalLMMTP", "LongcatFlashForCausalLM": "LongcatFlashForCausalLMNextN",
    "GigaChat35ForCausalLM": "GigaChat35ForCausalLMNextN", "BailingMoeV3ForCausalLM": "BailingMoeForCausalLMNextN",
    "Glm5NextForConditionalGeneration": "Glm5NextForConditionalGenerationNextN",
}
# speculative_hook.py::_auto_choose_speculative_params
AUTO_5_4_8_ARCHS = ("LlamaForCausalLM", "Grok1ForCausalLM", "Grok1VForCausalLM")
# _handle_eagle_family: topk > 1 with page_size > 1 (0.5.23; older: ["flashinfer", "fa3"], oldest: flashinfer only)
PAGE_TREE_BACKENDS = {"0.5.23": ("flashinfer", "fa3", "triton")}
# Flags a fork adds for its algorithm (sgl-project/sglang#29907 adds DDTREE and --speculative-ddtree-budget).
FORK_FLAGS = {"DDTREE": [{"opts": ["--speculative-ddtree-budget"], "dest": "speculative_ddtree_budget",
                          "kind": "store", "nargs": None, "type": "int", "choices": None, "default": None,
                          "required": False}]}
SPEC_FLAG_DESTS = ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens",
                   "speculative_draft_model_path", "speculative_dflash_block_size")


@dataclass(frozen=True)
class Gpu:
    """What SGLang reads of a GPU: nvidia-smi memory.total (MiB) and the compute capability."""

    name: str
    memory_mib: int
    sm: int  # major*10 + minor


# nvidia-smi --query-gpu=memory.total values of the cards (MiB) and their SM.
GPUS = {
    "h200": Gpu("NVIDIA H200", 143771, 90),
    "h100": Gpu("NVIDIA H100 80GB HBM3", 81559, 90),
    "b200": Gpu("NVIDIA B200", 183359, 100),
    "rtx_pro_6000": Gpu("NVIDIA RTX PRO 6000 Blackwell Server Edition", 97887, 120),
    "a100_80g": Gpu("NVIDIA A100-SXM4-80GB", 81920, 80),
    "l40s": Gpu("NVIDIA L40S", 46068, 89),
}


def gpu_of(opt: "Options") -> Gpu | None:
    return GPUS.get(opt.gpu) if opt.gpu else None


@dataclass
class Options:
    """What the caller knows beyond the arguments: the GPU, the workload, the environment."""

    gpu_mem_gib: float = 141.0
    input_len: int | None = None
    output_len: int | None = None
    env: dict = field(default_factory=dict)
    fork_algorithms: tuple[str, ...] = ()
    gpus: int | None = None
    version: str = "0.5.23"
    gpu: str | None = None  # a launch.GPUS key: the card's nvidia-smi memory and SM


@dataclass
class Resolved:
    """Our prediction of the values SGLang resolves (compared with the real resolver when it is installed)."""

    values: dict = field(default_factory=dict)


def F(fid: str, status, summary: str, *, source: str, fix: str | None = None, stage: str = "advice",
      evidence: list[str] | None = None, subject: str | None = None, error: str | None = None, **data) -> Finding:
    d = {"source": source, "stage": stage}
    if fix:
        d["fix"] = fix
    if error:
        d["sglang_error"] = error
    d.update(data)
    return Finding(id=fid, status=Status(status), summary=summary, layer="workload", subject=subject,
                   evidence=list(evidence or []), hint=fix, data=d)


def _flag(table: FlagTable, dest: str) -> str:
    return table.option_for(dest)


# ---------------------------------------------------------------- argument parsing
def parse_findings(args: ParsedArgs, table: FlagTable) -> list[Finding]:
    out = []
    for p in args.problems:
        if p.kind == "abbreviated":
            out.append(F("sglang.args.abbreviated", "info", p.message, source=ARGPARSE, stage="parse",
                         evidence=[f"argv token {p.token!r} is a unique prefix of {p.flag}"],
                         fix=f"spell it out as {p.flag} (an abbreviation breaks when a later SGLang adds a flag with the same prefix)"))
        elif p.kind == "ambiguous":
            out.append(F("sglang.args.ambiguous", "fail", p.message, source=ARGPARSE, stage="parse",
                         error=f"sglang serve: error: {p.message}", evidence=[f"candidates: {', '.join(p.candidates)}"],
                         fix=f"use the full flag: one of {', '.join(p.candidates)}"))
        elif p.kind == "unknown":
            sugg = f" (did you mean {', '.join(p.candidates)}?)" if p.candidates else ""
            out.append(F("sglang.args.unknown", "fail", p.message + sugg, source=ARGPARSE, stage="parse",
                         error=f"sglang serve: error: {p.message}",
                         evidence=[f"not a flag of SGLang {table.version}: {p.token}"],
                         fix=(f"replace with {p.candidates[0]}" if p.candidates else
                              "remove it, or pass --fork-algorithms/--extra-flag if your SGLang build has it")))
        elif p.kind == "duplicate":
            out.append(F("sglang.args.duplicate", "warn", p.message, source=ARGPARSE, stage="parse",
                         fix=f"keep one {p.flag}"))
        elif p.kind == "deprecated":
            out.append(F("sglang.args.deprecated", "warn", p.message, source="python/sglang/srt/server_args.py::ServerArgs.add_cli_args",
                         stage="parse", fix="use the replacement named in SGLang's --help"))
        else:  # missing_value, bad_value, required, explicit_arg, positional
            out.append(F(f"sglang.args.{p.kind}", "fail", p.message, source=ARGPARSE, stage="parse",
                         error=f"sglang serve: error: {p.message}", evidence=[f"argv: {p.token}"],
                         fix=_parse_fix(p)))
    return out


def _parse_fix(p) -> str:
    if p.kind == "missing_value":
        return f"give {p.flag} a value"
    if p.kind == "required":
        return f"add {p.flag} PATH"
    if p.kind == "explicit_arg":
        return f"{p.flag} takes no value: drop '={p.token.split('=', 1)[-1]}'"
    return f"give {p.flag} a valid value"


# ---------------------------------------------------------------- speculative decoding
def spec_findings(a: ParsedArgs, table: FlagTable, model: ModelFacts | None, draft: ModelFacts | None,
                  opt: Options, res: Resolved) -> list[Finding]:
    out: list[Finding] = []
    raw = a.get("speculative_algorithm")
    if raw is None:
        stray = [table.option_for(d) for d in SPEC_FLAG_DESTS if a.is_set(d)]
        if stray:
            out.append(F("sglang.spec.no_algorithm", "warn",
                         f"{', '.join(stray)} set without --speculative-algorithm: SGLang runs without speculation",
                         source=f"{SPEC_HOOK}::handle_speculative_decoding", stage="advice",
                         evidence=[f"speculative_algorithm=None; given: {', '.join(stray)}"],
                         fix="add --speculative-algorithm EAGLE3 (or the method you meant), or drop the speculative flags"))
        res.values["speculative_algorithm"] = None
        return out
    algo = str(raw).upper()
    if algo == "NEXTN":
        algo = "EAGLE"  # spec_info.py::from_string, _RESERVED_ALIASES
    res.values["speculative_algorithm"] = algo
    out += _common_spec(a, algo, res)
    if algo not in BUILTIN_ALGORITHMS:
        if algo in {x.upper() for x in opt.fork_algorithms}:
            out.append(F("sglang.spec.fork_algorithm", "info",
                         f"{algo} is not an upstream SGLang {opt.version} algorithm; accepted because this build carries it (--fork-algorithms)",
                         source=f"{SPEC_INFO}::SpeculativeAlgorithm.from_string", stage="resolve",
                         evidence=[f"upstream builtins: {', '.join(BUILTIN_ALGORITHMS)}"]))
            if a.get("max_running_requests") is None:
                res.values["max_running_requests"] = 48
            return out
        msg = f"Unknown speculative algorithm name: {raw}"
        hint = " DDTREE exists only on forks (open PR sgl-project/sglang#29907)." if algo == "DDTREE" else ""
        out.append(F("sglang.spec.unknown_algorithm", "fail", msg + "." + hint,
                     source=f"{SPEC_INFO}::SpeculativeAlgorithm.from_string", stage="resolve",
                     error=f"ValueError: {msg}", evidence=[f"--speculative-algorithm {raw}; builtins: {', '.join(BUILTIN_ALGORITHMS)}"],
                     fix=(f"use one of {', '.join(BUILTIN_ALGORITHMS)}, or pass --fork-algorithms {algo} "
                          "when the server runs a fork that has it")))
        return out
    if algo in EAGLE_FAMILY:
        out += _eagle_family(a, table, model, draft, opt, res, algo)
    elif algo == "DFLASH":
        out += _dflash(a, table, draft, opt, res)
    elif algo == "NGRAM":
        out += _ngram(a, table, opt, res)
    elif algo == "DSPARK":
        out += _dspark(a, table, model, draft, opt, res)
    elif algo == "UNO":
        out += _uno(a, table, res)
    elif algo == "FROZEN_KV_MTP":
        _max_running_48(a, res, out, "_handle_frozen_kv_mtp")
    return out


def _common_spec(a: ParsedArgs, algo: str, res: Resolved) -> list[Finding]:
    """speculative_hook.py::handle_speculative_decoding: checks made for every algorithm before its own handler."""
    out: list[Finding] = []
    fn = f"{SPEC_HOOK}::handle_speculative_decoding"
    if a.get("speculative_use_block_verification"):
        if algo not in ("EAGLE", "EAGLE3", "DFLASH", "DSPARK"):
            out.append(F("sglang.spec.block_verification", "fail",
                         f"--speculative-use-block-verification does not support {algo}", source=fn, stage="resolve",
                         error="ValueError: --speculative-use-block-verification only supports EAGLE / EAGLE3 / NEXTN / DFLASH / DSPARK.",
                         fix="drop --speculative-use-block-verification, or use EAGLE3/DFLASH"))
        elif algo in ("EAGLE", "EAGLE3"):
            res.values["speculative_use_rejection_sampling"] = True
    win, sink = a.get("speculative_draft_window_size"), a.get("speculative_draft_sink_size")
    if win is not None:
        if win <= 0:
            out.append(F("sglang.spec.draft_window", "fail", f"--speculative-draft-window-size must be positive (got {win})",
                         source=fn, stage="resolve", error=f"ValueError: --speculative-draft-window-size must be positive, got {win}.",
                         fix="drop --speculative-draft-window-size or give a positive window"))
        elif algo not in ("EAGLE", "EAGLE3", "DFLASH"):
            out.append(F("sglang.spec.draft_window_noop", "warn",
                         f"--speculative-draft-window-size has no effect with {algo}", source=fn, stage="advice",
                         fix="drop --speculative-draft-window-size (honoured by DFLASH and EAGLE/EAGLE3 drafts)"))
    if sink is not None:
        if sink < 0:
            out.append(F("sglang.spec.draft_sink", "fail", f"--speculative-draft-sink-size must be non-negative (got {sink})",
                         source=fn, stage="resolve", error=f"ValueError: --speculative-draft-sink-size must be non-negative, got {sink}.",
                         fix="use --speculative-draft-sink-size 0 or more"))
        if win is None:
            out.append(F("sglang.spec.draft_sink_without_window", "fail",
                         "--speculative-draft-sink-size needs --speculative-draft-window-size", source=fn, stage="resolve",
                         error="ValueError: --speculative-draft-sink-size requires --speculative-draft-window-size.",
                         fix="add --speculative-draft-window-size N or drop the sink size"))
    return out


def attn_dp_size(a: ParsedArgs) -> int:
    """attn_dp_size after parallel_hook.py::handle_deprecated_dp_attention (--dp-size N --enable-dp-attention)."""
    adp = a.get("attn_dp_size") or 1
    if a.get("enable_dp_attention") and adp == 1:
        adp = a.get("dp_size") or 1
    return adp


def _no_attn_dp(a: ParsedArgs, algo: str, fn: str, error: str) -> list[Finding]:
    adp = attn_dp_size(a)
    if adp > 1:
        return [F("sglang.spec.attn_dp", "fail", f"{algo} speculative decoding does not support attention DP (attn_dp_size {adp})",
                  source=fn, stage="resolve", error=error,
                  fix="drop --attn-dp-size/--enable-dp-attention, or use EAGLE3 (or DFLASH with --enable-dp-lm-head)")]
    return []


def _dp_lm_head(a: ParsedArgs, algo: str, fn: str, error: str) -> list[Finding]:
    if attn_dp_size(a) > 1 and not a.get("enable_dp_lm_head"):
        return [F("sglang.spec.attn_dp_lm_head", "fail", f"{algo} with attention DP needs --enable-dp-lm-head",
                  source=fn, stage="resolve", error=error, fix="add --enable-dp-lm-head")]
    return []


def _max_running_48(a: ParsedArgs, res: Resolved, out: list, fn: str) -> None:
    if a.get("max_running_requests") is None:
        res.values["max_running_requests"] = 48
        out.append(F("sglang.spec.max_running_default", "info",
                     "max_running_requests defaults to 48 with speculative decoding",
                     source=f"{SPEC_HOOK}::{fn}", stage="resolve",
                     evidence=["--max-running-requests not given; SGLang logs 'Max running requests is reset to 48 for speculative decoding'"],
                     fix="pass --max-running-requests N to choose it"))
    else:
        res.values["max_running_requests"] = a.get("max_running_requests")


def attention_backends(a: ParsedArgs, resolved: str | None = None) -> tuple[str | None, str | None]:
    """(prefill, decode) backends; None where SGLang auto-selects and `resolved` is unknown (attention_backends_of)."""
    base = a.get("attention_backend") or resolved
    return a.get("prefill_attention_backend") or base, a.get("decode_attention_backend") or base


def default_attention_backend(a: ParsedArgs, model: ModelFacts | None, gpu: Gpu | None) -> str | None:
    """model_override_base.py::get_default_attn_backend on CUDA (flashinfer installed, as on any SGLang host).

    Decided before the speculative handler runs, on the topk and page size as given. None when the GPU is unknown.
    """
    backend = _default_attention_backend(a, model, gpu)
    if backend == "fa3" and a.get("kv_cache_dtype") == "fp8_e5m2":
        return "triton"  # overrides.py::_attention_backend_fa3_fp8_fallback (FA3 does only fp8_e4m3)
    return backend


def _default_attention_backend(a: ParsedArgs, model: ModelFacts | None, gpu: Gpu | None) -> str | None:
    pre, dec = a.get("prefill_attention_backend"), a.get("decode_attention_backend")
    if pre is not None and pre == dec:
        return pre
    if a.get("attention_backend") is not None:
        return a.get("attention_backend")
    if gpu is None:
        return None
    topk, page = a.get("speculative_eagle_topk"), a.get("page_size")
    no_spec_or_topk1 = topk is None or (topk == 1 and page in (None, 1))
    mla = bool(model and model.is_mla)
    if not mla:
        if gpu.sm == 90 and no_spec_or_topk1:
            return "fa3"
        algo = str(a.get("speculative_algorithm") or "").upper()
        if gpu.sm in (100, 103) and no_spec_or_topk1 and (not algo or topk is not None or algo == "DFLASH"):
            return "trtllm_mha"
        return "flashinfer"
    if gpu.sm == 90:
        return "fa3"
    if gpu.sm in (100, 103):
        # model_hook.py (DeepSeek on SM100) prefers trtllm_mla over the generic flashinfer choice
        arch = model.architecture if model else None
        return "trtllm_mla" if arch in ("DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM") else "flashinfer"
    return "triton"


def effective_page_size(a: ParsedArgs, backend: str | None = None) -> tuple[int, str]:
    """page_size after overrides.py::_page_size_default and _mla_backend_page_constraints (CUDA)."""
    page = a.get("page_size")
    src = "--page-size" if page is not None else "default 1 (overrides.py::_page_size_default)"
    page = page if page is not None else 1
    backends = {a.get("attention_backend") or backend, a.get("decode_attention_backend"), a.get("prefill_attention_backend")}
    if "flashmla" in backends and page != 64:
        return 64, "forced to 64 by flashmla (overrides.py)"
    if "trtllm_mla" in backends and page not in (32, 64):
        return 64, "forced to 64 by trtllm_mla (overrides.py)"
    if "trtllm_mha" in backends and page not in (16, 32, 64, 128):
        return 64, "forced to 64 by trtllm_mha (overrides.py)"
    return page, src


def _eagle_family(a, table, model, draft, opt, res, algo) -> list[Finding]:
    out: list[Finding] = []
    fn = f"{SPEC_HOOK}::_handle_eagle_family"
    if algo == "STANDALONE":
        out += _no_attn_dp(a, algo, fn, "ValueError: Currently standalone speculative decoding does not support dp attention.")
    _max_running_48(a, res, out, "_handle_eagle_family")
    arch = model.architecture if model else None
    # Draft model path
    draft_path = a.get("speculative_draft_model_path")
    if draft_path is None:
        if arch in SELF_DRAFT_ARCHS:
            out.append(F("sglang.spec.draft_path_default", "info",
                         f"{arch} carries its own MTP layer: the draft path defaults to --model-path",
                         source=fn, stage="resolve"))
        elif arch in MTP_REWRITE_ARCHS or (model is not None and mtp_layers(model.raw)):
            out.append(F("sglang.spec.draft_path_default", "info",
                         f"{arch} declares {mtp_layers(model.raw) or 'its own'} MTP layer(s): without a draft path the draft "
                         f"worker loads the target checkpoint in its MTP form"
                         + (f" ({MTP_REWRITE_ARCHS[arch]})" if arch in MTP_REWRITE_ARCHS else ""),
                         source="python/sglang/srt/configs/model_config.py::ModelConfig._config_draft_model "
                                "(draft ModelConfig.from_server_args(model_path=None) falls back to --model-path)",
                         stage="resolve"))
        elif arch is None:
            out.append(F("sglang.spec.draft_path_missing", "warn",
                         f"{algo} without --speculative-draft-model-path, and no model config to tell whether the target carries its own draft layer",
                         source=fn, stage="load", fix="add --speculative-draft-model-path DRAFT_DIR (or --model-config so this can be checked)"))
        else:
            out.append(F("sglang.spec.draft_path_missing", "fail",
                         f"{algo} needs --speculative-draft-model-path for {arch}: SGLang resolves the arguments and fails only when it loads the draft, after the target load",
                         source=fn, stage="load",
                         evidence=[f"architecture {arch} is not in the self-draft (MTP) list of _handle_eagle_family"],
                         fix="add --speculative-draft-model-path DRAFT_DIR"))
    steps, topk, ndraft = (a.get("speculative_num_steps"), a.get("speculative_eagle_topk"),
                           a.get("speculative_num_draft_tokens"))
    steps_f, topk_f, draft_f = (_flag(table, "speculative_num_steps"), _flag(table, "speculative_eagle_topk"),
                                _flag(table, "speculative_num_draft_tokens"))
    adaptive = bool(a.get("speculative_adaptive"))
    if adaptive:
        out.append(F("sglang.spec.adaptive", "info", "adaptive speculation: num_steps comes from the adaptive config; topk defaults to 1",
                     source=f"{SPEC_HOOK}::_init_adaptive_speculative_params", stage="resolve"))
        if topk is None:
            topk = 1
    if not adaptive and steps is None:
        if topk is not None or ndraft is not None:
            given = " and ".join(f"{f} {v}" for f, v in ((topk_f, topk), (draft_f, ndraft)) if v is not None)
            sugg_steps = (ndraft - 1) if ndraft and ndraft > 1 else 3
            out.append(F("sglang.spec.draft_without_steps", "fail",
                         f"{given} set without {steps_f}: SGLang stops with a bare AssertionError",
                         source=fn, stage="resolve",
                         error="AssertionError (assert speculative_eagle_topk is None and speculative_num_draft_tokens is None)",
                         evidence=[f"speculative_num_steps=None, speculative_eagle_topk={topk}, speculative_num_draft_tokens={ndraft}"],
                         fix=(f"add {steps_f} {sugg_steps}" + ("" if topk is not None else f" {topk_f} 1")
                              + f" (or drop {given} to let SGLang auto-select)")))
            res.values.update(speculative_num_steps=None, speculative_eagle_topk=topk, speculative_num_draft_tokens=ndraft)
            return out
        auto = (3, 1, 4) if algo == "STANDALONE" else ((5, 4, 8) if arch in AUTO_5_4_8_ARCHS else (3, 1, 4))
        if arch is None and algo != "STANDALONE":
            note = "(3, 1, 4) for most models, (5, 4, 8) for LlamaForCausalLM/Grok1 (no model config given)"
        else:
            note = f"{auto} for {arch or algo}"
        steps, topk, ndraft = auto
        out.append(F("sglang.spec.auto_params", "info",
                     f"(num_steps, eagle_topk, num_draft_tokens) auto-selected: {note}",
                     source=f"{SPEC_HOOK}::_auto_choose_speculative_params", stage="resolve",
                     fix=f"pass {steps_f}, {topk_f} and {draft_f} together to choose them"))
    if adaptive and steps is None:
        # num_steps = the middle of the adaptive config's candidate steps (speculative/adaptive_spec_params.py): not predicted
        res.values.update(speculative_num_steps=None, speculative_eagle_topk=topk, speculative_num_draft_tokens=None)
        return out
    if steps is not None and topk is None:
        out.append(F("sglang.spec.steps_without_topk", "fail",
                     f"{steps_f} set but {topk_f} unset: SGLang compares None > 1 and crashes",
                     source=fn, stage="resolve",
                     error="TypeError: '>' not supported between instances of 'NoneType' and 'int'",
                     evidence=[f"speculative_num_steps={steps}, speculative_eagle_topk=None (auto-selection is skipped once steps is set)"],
                     fix=f"add {topk_f} 1"))
        res.values.update(speculative_num_steps=steps, speculative_eagle_topk=None, speculative_num_draft_tokens=ndraft)
        return out
    pre, dec = attention_backends(a, res.values.get("attention_backend"))
    if "trtllm_mha" in (pre, dec) and topk is not None and topk > 1:
        out.append(F("sglang.spec.trtllm_topk", "fail", f"trtllm_mha supports only {topk_f} 1 (got {topk})",
                     source=fn, stage="resolve",
                     error="ValueError: trtllm_mha backend only supports topk = 1 for speculative decoding.",
                     fix=f"set {topk_f} 1, or choose another --attention-backend (fa3, flashinfer, triton)"))
    rejection = a.get("speculative_use_rejection_sampling") or res.values.get("speculative_use_rejection_sampling")
    if rejection:
        rs = "--speculative-use-rejection-sampling" + ("" if a.get("speculative_use_rejection_sampling")
                                                       else " (turned on by --speculative-use-block-verification)")
        if algo not in ("EAGLE", "EAGLE3"):
            out.append(F("sglang.spec.rejection_sampling", "fail", f"{rs} supports only EAGLE / EAGLE3 / NEXTN, not {algo}",
                         source=fn, stage="resolve",
                         error=f"NotImplementedError: --speculative-use-rejection-sampling is only supported for EAGLE / EAGLE3 / NEXTN, not speculative_algorithm={algo}.",
                         fix="drop --speculative-use-rejection-sampling"))
        elif topk != 1:
            out.append(F("sglang.spec.rejection_sampling_topk", "fail", f"{rs} needs {topk_f} 1 (got {topk})",
                         source=fn, stage="resolve",
                         error="ValueError: --speculative-use-rejection-sampling requires --speculative-eagle-topk=1.",
                         fix=f"use {topk_f} 1 (rejection sampling verifies a linear chain)"))
        if (a.get("speculative_accept_threshold_single") or 1.0) != 1.0 or (a.get("speculative_accept_threshold_acc") or 1.0) != 1.0:
            out.append(F("sglang.spec.rejection_sampling_thresholds", "fail",
                         f"{rs} ignores the accept thresholds and refuses them", source=fn, stage="resolve",
                         error="ValueError: --speculative-use-rejection-sampling is incompatible with --speculative-accept-threshold-single / --speculative-accept-threshold-acc; rejection sampling ignores the accept thresholds.",
                         fix="drop --speculative-accept-threshold-single/--speculative-accept-threshold-acc"))
    if topk == 1 and ndraft != steps + 1:
        if ndraft is None:
            out.append(F("sglang.spec.draft_forced", "info",
                         f"{draft_f} unset: SGLang sets it to num_steps + 1 = {steps + 1} (topk 1)",
                         source=fn, stage="resolve"))
        else:
            out.append(F("sglang.spec.draft_forced", "warn",
                         f"{draft_f} {ndraft} is replaced by num_steps + 1 = {steps + 1} because {topk_f} is 1",
                         source=fn, stage="resolve",
                         error="WARNING: speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when speculative_eagle_topk == 1",
                         evidence=[f"speculative_num_steps={steps}, speculative_eagle_topk=1, speculative_num_draft_tokens={ndraft} -> {steps + 1}"],
                         fix=(f"write {draft_f} {steps + 1} to say what runs, or raise {steps_f} to {ndraft - 1} "
                              f"to really verify {ndraft} tokens")))
        ndraft = steps + 1
    backend = a.get("attention_backend") or res.values.get("attention_backend")
    page, page_src = effective_page_size(a, backend)
    allowed = PAGE_TREE_BACKENDS.get(opt.version, PAGE_TREE_BACKENDS["0.5.23"])
    if topk is not None and topk > 1 and page > 1:
        if backend is None:
            out.append(F("sglang.spec.page_tree_backend", "warn",
                         f"{topk_f} {topk} with page_size {page}: works only if the auto-selected attention backend is one of {', '.join(allowed)}",
                         source=fn, stage="resolve", evidence=[f"page_size {page} ({page_src}); --attention-backend not given"],
                         fix=f"pass --attention-backend {allowed[0]} (or fa3) explicitly"))
        elif backend not in allowed:
            out.append(F("sglang.spec.page_tree_backend", "fail",
                         f"{topk_f} {topk} > 1 with page_size {page} > 1 is not supported by attention backend {backend}",
                         source=fn, stage="resolve",
                         error=(f"ValueError: speculative_eagle_topk > 1 with page_size > 1 is only supported on "
                                f"{tuple(allowed)}; got attention_backend='{backend}'."),
                         evidence=[f"page_size {page} ({page_src})"],
                         fix=f"use --page-size 1, {topk_f} 1, or --attention-backend one of {', '.join(allowed)}"))
    if topk is not None and steps is not None and ndraft is not None and topk >= 1:
        capacity = topk + (steps - 1) * topk * topk
        if ndraft - 1 > capacity:
            out.append(F("sglang.spec.tree_capacity", "fail",
                         f"{draft_f} {ndraft} needs {ndraft - 1} draft candidates but {steps} steps x topk {topk} produce only {capacity}",
                         source="python/sglang/srt/speculative/eagle_utils.py::organize_draft_results (torch.topk over topk + (steps-1)*topk^2 scores)",
                         stage="request", error="RuntimeError: selected index k out of range (inferred; not checked at argument time)",
                         evidence=[f"num_draft_tokens - 1 = {ndraft - 1} > topk + (steps - 1) * topk^2 = {capacity}"],
                         fix=f"lower {draft_f} to at most {capacity + 1} or raise {steps_f}/{topk_f}"))
    res.values.update(speculative_num_steps=steps, speculative_eagle_topk=topk, speculative_num_draft_tokens=ndraft)
    return out


def _dflash(a, table, draft, opt, res) -> list[Finding]:
    out: list[Finding] = []
    fn = f"{SPEC_HOOK}::_handle_dflash"
    out += _dp_lm_head(a, "DFLASH", fn, "ValueError: DFLASH with dp attention requires --enable-dp-lm-head.")
    if attn_dp_size(a) > 1 and (a.get("attn_cp_size") or 1) != 1:
        out.append(F("sglang.spec.attn_dp_cp", "fail", "DFLASH with attention DP does not support context parallel",
                     source=fn, stage="resolve", error="ValueError: DFLASH with dp attention does not support context parallel.",
                     fix="drop --attn-cp-size"))
    if (a.get("pp_size") or 1) != 1:
        out.append(F("sglang.spec.dflash_pp", "fail", "DFLASH supports only pp_size 1", source=fn, stage="resolve",
                     error="ValueError: Currently DFLASH speculative decoding only supports pp_size == 1.",
                     fix="drop --pp-size (use --tp-size)"))
    if a.get("speculative_draft_model_path") is None:
        out.append(F("sglang.spec.draft_path_missing", "fail", "DFLASH needs --speculative-draft-model-path",
                     source=fn, stage="resolve",
                     error="ValueError: DFLASH speculative decoding requires setting --speculative-draft-model-path.",
                     fix="add --speculative-draft-model-path DFLASH_DRAFT_DIR"))
    for dest in ("speculative_num_steps", "speculative_eagle_topk"):
        v = a.get(dest)
        if v is not None and v != 1:
            out.append(F("sglang.spec.dflash_override", "warn",
                         f"DFLASH forces {dest} to 1 (given {v})", source=fn, stage="resolve",
                         fix=f"drop {table.option_for(dest)}"))
    block, ndraft = a.get("speculative_dflash_block_size"), a.get("speculative_num_draft_tokens")
    bf, df = _flag(table, "speculative_dflash_block_size"), _flag(table, "speculative_num_draft_tokens")
    resolved = ndraft
    if block is not None:
        if block <= 0:
            out.append(F("sglang.spec.dflash_block_size", "fail", f"{bf} must be positive (got {block})",
                         source=fn, stage="resolve",
                         error=f"ValueError: DFLASH requires --speculative-dflash-block-size to be positive, got {block}.",
                         fix=f"set {bf} to the draft's block_size (16 for most DFlash drafts)"))
        elif ndraft is not None and ndraft != block:
            out.append(F("sglang.spec.dflash_block_mismatch", "fail",
                         f"{df} {ndraft} and {bf} {block} differ; for DFLASH they must match",
                         source=fn, stage="resolve",
                         error="ValueError: Both --speculative-num-draft-tokens and --speculative-dflash-block-size are set but they differ. For DFLASH they must match.",
                         fix=f"drop {df} (it is an alias of {bf} for DFLASH)"))
        resolved = block
    draft_block = None
    if draft is not None:
        dc = draft.raw.get("dflash_config") if isinstance(draft.raw.get("dflash_config"), dict) else {}
        draft_block = dc.get("block_size", draft.raw.get("block_size"))
    if resolved is None:
        resolved = draft_block if isinstance(draft_block, int) else 16
        out.append(F("sglang.spec.dflash_block_default", "info",
                     f"DFLASH block size {resolved} " + ("from the draft config" if isinstance(draft_block, int) else "(SGLang's default 16; no draft config read)"),
                     source=fn, stage="resolve"))
    elif isinstance(draft_block, int) and draft_block != resolved:
        out.append(F("sglang.spec.dflash_block_vs_draft", "warn",
                     f"DFLASH block size {resolved} differs from the draft's trained block_size {draft_block}",
                     source=fn, stage="advice", fix=f"use {bf} {draft_block}"))
    win = a.get("speculative_draft_window_size")
    if win is not None and win > 0 and isinstance(resolved, int) and win < resolved:
        out.append(F("sglang.spec.dflash_window", "fail",
                     f"--speculative-draft-window-size {win} is smaller than the DFLASH block size {resolved}",
                     source=fn, stage="resolve",
                     error=f"ValueError: --speculative-draft-window-size must be >= --speculative-num-draft-tokens (block_size). window_size={win}, block_size={resolved}.",
                     fix=f"use --speculative-draft-window-size {resolved} or more"))
    _max_running_48(a, res, out, "_handle_dflash")
    res.values.update(speculative_num_steps=1, speculative_eagle_topk=1, speculative_num_draft_tokens=resolved)
    return out


def _ngram(a, table, opt, res) -> list[Finding]:
    out: list[Finding] = []
    fn = f"{SPEC_HOOK}::_handle_ngram"
    _max_running_48(a, res, out, "_handle_ngram")
    topk = a.get("speculative_ngram_max_bfs_breadth") or 10
    ndraft = a.get("speculative_num_draft_tokens") or 12
    steps = a.get("speculative_num_steps") or ndraft // topk
    backend = a.get("attention_backend") or res.values.get("attention_backend")
    page, page_src = effective_page_size(a, backend)
    if topk > 1 and page > 1 and backend != "flashinfer":
        out.append(F("sglang.spec.ngram_page_backend", "fail",
                     f"NGRAM (bfs breadth {topk}) with page_size {page} > 1 needs --attention-backend flashinfer (got {backend or 'auto'})",
                     source=fn, stage="resolve", evidence=[f"page_size {page} ({page_src})"],
                     error="ValueError: speculative_eagle_topk > 1 with page_size > 1 is unstable ... only supported for the 'flashinfer' backend.",
                     fix="use --page-size 1 or --attention-backend flashinfer"))
    out += _no_attn_dp(a, "NGRAM", fn, "ValueError: Currently ngram speculative decoding does not support dp attention.")
    res.values.update(speculative_num_steps=steps, speculative_eagle_topk=topk, speculative_num_draft_tokens=ndraft)
    return out


DSPARK_BUNDLE_KEYS = ("dspark_block_size", "dspark_markov_rank", "dspark_noise_token_id", "dspark_target_layer_ids")
DEFAULT_DSPARK_GAMMA = 7  # speculative/dspark_components/dspark_config.py


def _dspark(a, table, model, draft, opt, res) -> list[Finding]:
    import os

    out: list[Finding] = []
    fn = f"{SPEC_HOOK}::_handle_dspark"
    if attn_dp_size(a) > 1:
        out += _dp_lm_head(a, "DSpark", fn, "ValueError: DSpark with dp attention requires --enable-dp-lm-head.")
        if (a.get("attn_cp_size") or 1) > 1:
            out.append(F("sglang.spec.attn_dp_cp", "fail", "DSpark with attention DP does not support context parallel",
                         source=fn, stage="resolve", error="ValueError: DSpark with dp attention does not support context parallel",
                         fix="drop --attn-cp-size"))
    if (a.get("pp_size") or 1) != 1 and (a.get("disaggregation_mode") or "null") != "prefill":
        out.append(F("sglang.spec.dspark_pp", "fail", "DSpark pipeline parallelism needs PD prefill (--disaggregation-mode prefill)",
                     source=fn, stage="resolve",
                     error="ValueError: DSpark pipeline parallelism requires PD prefill; decode and non-disaggregated serving require pp_size == 1.",
                     fix="drop --pp-size"))
    draft_cfg = draft.raw if draft is not None else None
    if a.get("speculative_draft_model_path") is None:
        mp = a.get("model_path") or ""
        bundled = model is not None and any(model.raw.get(k) is not None for k in DSPARK_BUNDLE_KEYS)
        sub = os.path.join(mp, "dspark", "config.json")
        if bundled:
            out.append(F("sglang.spec.draft_path_default", "info", "DSpark draft bundled in the target checkpoint: draft path = --model-path",
                         source=f"{fn} (dspark_config.py::checkpoint_bundles_dspark_draft)", stage="resolve"))
            draft_cfg = model.raw
        elif os.path.isfile(sub):
            out.append(F("sglang.spec.draft_path_default", "info", f"DSpark draft found in {os.path.dirname(sub)}",
                         source=f"{fn} (_target_checkpoint_dspark_subfolder)", stage="resolve"))
            try:
                from gpudoctor.sglang.modelcfg import read_json
                draft_cfg = read_json(sub)
            except Exception:  # noqa: BLE001 - an unreadable sub-config only loses the gamma default
                draft_cfg = None
        elif model is None and os.path.isdir(mp) is False:
            out.append(F("sglang.spec.draft_path_missing", "warn",
                         "DSPARK without --speculative-draft-model-path: SGLang needs the target checkpoint to bundle the draft "
                         "(dspark_* keys) or carry a dspark/ subfolder; no local model config to check",
                         source=fn, stage="resolve", fix="add --speculative-draft-model-path DRAFT_DIR"))
        else:
            out.append(F("sglang.spec.draft_path_missing", "fail",
                         "DSPARK without --speculative-draft-model-path, and the target checkpoint neither bundles a DSpark draft "
                         "(no dspark_* keys in config.json) nor has a dspark/ subfolder",
                         source=fn, stage="resolve",
                         error="ValueError: DSpark dense speculative decoding requires setting --speculative-draft-model-path.",
                         fix="add --speculative-draft-model-path DSPARK_DRAFT_DIR"))
            return out
    gamma = a.get("speculative_dspark_block_size")
    ndraft = a.get("speculative_num_draft_tokens")
    if gamma is not None and gamma <= 0:
        out.append(F("sglang.spec.dspark_block_size", "fail", f"--speculative-dspark-block-size must be positive (got {gamma})",
                     source=fn, stage="resolve",
                     error=f"ValueError: DSpark requires --speculative-dspark-block-size to be positive, got {gamma}.",
                     fix="drop --speculative-dspark-block-size (gamma comes from the draft config)"))
        return out
    if gamma is None and isinstance(draft_cfg, dict):
        for c in (draft_cfg, draft_cfg.get("dspark_config") if isinstance(draft_cfg.get("dspark_config"), dict) else {}):
            for k in ("dspark_block_size", "block_size", "gamma"):
                if isinstance(c.get(k), int) and c.get(k) > 0:
                    gamma = c[k]
                    break
            if gamma is not None:
                break
    if gamma is None and ndraft is None:
        gamma = DEFAULT_DSPARK_GAMMA
    if gamma is not None:
        if ndraft is not None and ndraft != gamma + 1:
            out.append(F("sglang.spec.dspark_window", "fail", f"DSPARK needs num_draft_tokens = gamma + 1 = {gamma + 1} (got {ndraft})",
                         source=fn, stage="resolve",
                         error=f"ValueError: DSpark speculative_num_draft_tokens must equal gamma + 1 (= {gamma + 1} for gamma={gamma}), but got speculative_num_draft_tokens={ndraft}.",
                         fix="drop --speculative-num-draft-tokens"))
        ndraft = gamma + 1
    if ndraft is not None and ndraft < 2:
        out.append(F("sglang.spec.dspark_window", "fail", f"DSPARK needs num_draft_tokens >= 2 (got {ndraft})", source=fn,
                     stage="resolve", error=f"ValueError: DSpark speculative_num_draft_tokens must be >= 2 (= gamma + 1), got {ndraft}.",
                     fix="drop --speculative-num-draft-tokens"))
    _max_running_48(a, res, out, "_handle_dspark")
    res.values.update(speculative_num_steps=1, speculative_eagle_topk=1, speculative_num_draft_tokens=ndraft)
    return out


def _uno(a, table, res) -> list[Finding]:
    out: list[Finding] = []
    fn = f"{SPEC_HOOK}::_handle_uno"
    if a.get("speculative_draft_model_path") is not None:
        out.append(F("sglang.spec.uno_draft_path", "fail", "UNO reuses the target model and does not accept --speculative-draft-model-path",
                     source=fn, stage="resolve", fix="drop --speculative-draft-model-path"))
    if a.get("uno_lora_path") is None:
        out.append(F("sglang.spec.uno_lora", "fail", "UNO requires --uno-lora-path", source=fn, stage="resolve",
                     fix="add --uno-lora-path LORA_DIR"))
    if a.get("speculative_num_draft_tokens") is None:
        out.append(F("sglang.spec.uno_width", "fail", "UNO requires --speculative-num-draft-tokens", source=fn,
                     stage="resolve", fix="add --speculative-num-draft-tokens Q"))
    if (a.get("tp_size") or 1, a.get("pp_size") or 1) != (1, 1):
        out.append(F("sglang.spec.uno_parallel", "fail", "UNO requires TP=PP=1", source=fn, stage="resolve",
                     fix="drop --tp-size/--pp-size"))
    res.values.update(speculative_num_draft_tokens=a.get("speculative_num_draft_tokens"))
    return out
