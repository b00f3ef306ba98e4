"""SGLang argument rules, each checked against SGLang's own source (file::function named in every finding).

Rules are pure: (ParsedArgs, ModelFacts, options) -> Findings. `stage` in a finding's data says when SGLang
itself would fail: parse (argparse exits 2 at once), resolve (ServerArgs resolution, seconds after start),
load (after or during the model load: minutes), request (when a request arrives), advice (SGLang runs).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpudoctor.findings import Finding, Status
from gpudoctor.sglang.argparser import FlagTable, ParsedArgs
from gpudoctor.sglang.modelcfg import ModelFacts

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
        out += _dspark(a, table, opt, res)
    elif algo == "UNO":
        out += _uno(a, table, res)
    elif algo == "FROZEN_KV_MTP":
        _max_running_48(a, res, out, "_handle_frozen_kv_mtp")
    return out


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


def attention_backends(a: ParsedArgs) -> tuple[str | None, str | None]:
    """(prefill, decode) backends as given; None where SGLang auto-selects (overrides.py::attention_backends_of)."""
    base = a.get("attention_backend")
    return a.get("prefill_attention_backend") or base, a.get("decode_attention_backend") or base


def effective_page_size(a: ParsedArgs) -> tuple[int, str]:
    """page_size after overrides.py::_page_size_default and the backend page constraints (CUDA, non-Blackwell)."""
    page = a.get("page_size")
    src = "--page-size" if page is not None else "default 1 (overrides.py::_page_size_default)"
    page = page if page is not None else 1
    backends = {a.get("attention_backend"), a.get("decode_attention_backend"), a.get("prefill_attention_backend")}
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
    _max_running_48(a, res, out, "_handle_eagle_family")
    arch = model.architecture if model else None
    # Draft model path
    draft_path = a.get("speculative_draft_model_path")
    if draft_path is None:
        if arch in SELF_DRAFT_ARCHS:
            out.append(F("sglang.spec.draft_path_default", "info",
                         f"{arch} carries its own MTP layer: the draft path defaults to --model-path",
                         source=fn, stage="resolve"))
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
    if steps is not None and topk is None:
        out.append(F("sglang.spec.steps_without_topk", "fail",
                     f"{steps_f} set but {topk_f} unset: SGLang compares None > 1 and crashes",
                     source=fn, stage="resolve",
                     error="TypeError: '>' not supported between instances of 'NoneType' and 'int'",
                     evidence=[f"speculative_num_steps={steps}, speculative_eagle_topk=None (auto-selection is skipped once steps is set)"],
                     fix=f"add {topk_f} 1"))
        res.values.update(speculative_num_steps=steps, speculative_eagle_topk=None, speculative_num_draft_tokens=ndraft)
        return out
    pre, dec = attention_backends(a)
    if "trtllm_mha" in (pre, dec) and topk is not None and topk > 1:
        out.append(F("sglang.spec.trtllm_topk", "fail", f"trtllm_mha supports only {topk_f} 1 (got {topk})",
                     source=fn, stage="resolve",
                     error="ValueError: trtllm_mha backend only supports topk = 1 for speculative decoding.",
                     fix=f"set {topk_f} 1, or choose another --attention-backend (fa3, flashinfer, triton)"))
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
    page, page_src = effective_page_size(a)
    allowed = PAGE_TREE_BACKENDS.get(opt.version, PAGE_TREE_BACKENDS["0.5.23"])
    if topk is not None and topk > 1 and page > 1:
        backend = a.get("attention_backend")
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
    page, page_src = effective_page_size(a)
    backend = a.get("attention_backend")
    if topk > 1 and page > 1 and backend != "flashinfer":
        out.append(F("sglang.spec.ngram_page_backend", "fail",
                     f"NGRAM (bfs breadth {topk}) with page_size {page} > 1 needs --attention-backend flashinfer (got {backend or 'auto'})",
                     source=fn, stage="resolve", evidence=[f"page_size {page} ({page_src})"],
                     error="ValueError: speculative_eagle_topk > 1 with page_size > 1 is unstable ... only supported for the 'flashinfer' backend.",
                     fix="use --page-size 1 or --attention-backend flashinfer"))
    res.values.update(speculative_num_steps=steps, speculative_eagle_topk=topk, speculative_num_draft_tokens=ndraft)
    return out


def _dspark(a, table, opt, res) -> list[Finding]:
    out: list[Finding] = []
    fn = f"{SPEC_HOOK}::_handle_dspark"
    if a.get("speculative_draft_model_path") is None:
        out.append(F("sglang.spec.draft_path_missing", "warn",
                     "DSPARK without --speculative-draft-model-path: works only if the target checkpoint bundles the draft (or has a dspark/ subfolder)",
                     source=fn, stage="resolve", fix="add --speculative-draft-model-path DRAFT_DIR"))
    gamma = a.get("speculative_dspark_block_size")
    ndraft = a.get("speculative_num_draft_tokens")
    if gamma is not None and ndraft is not None and ndraft != gamma + 1:
        out.append(F("sglang.spec.dspark_window", "fail", f"DSPARK needs num_draft_tokens = gamma + 1 = {gamma + 1} (got {ndraft})",
                     source=fn, stage="resolve", error="ValueError: DSpark speculative_num_draft_tokens must equal gamma + 1",
                     fix="drop --speculative-num-draft-tokens"))
    _max_running_48(a, res, out, "_handle_dspark")
    res.values.update(speculative_num_steps=1, speculative_eagle_topk=1,
                      speculative_num_draft_tokens=(gamma + 1) if gamma is not None else ndraft)
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
