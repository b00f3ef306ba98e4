"""validate(argv, model_config, ...) -> ValidationResult: SGLang launch arguments checked before a long model load."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from gpudoctor.errors import EXIT_FAIL, EXIT_OK, EXIT_WARN, InputError
from gpudoctor.findings import Finding, Status, worst
from gpudoctor.sglang import argparser, capacity, conflicts, launch, ranges, rules
from gpudoctor.sglang.modelcfg import ModelFacts, estimate_weights, facts_from_config, load_model


@dataclass
class ValidationResult:
    """Findings plus what we predict SGLang resolves; `exit_code` is 0 valid, 1 warnings, 2 invalid."""

    argv: list[str]
    findings: list[Finding]
    resolved: dict = field(default_factory=dict)
    memory: dict | None = None
    sglang_version: str = "0.5.23"

    @property
    def verdict(self) -> str:
        s = worst(f.status for f in self.findings if f.status != Status.UNKNOWN)
        return {Status.FAIL: "invalid", Status.WARN: "warnings"}.get(s, "valid")

    @property
    def exit_code(self) -> int:
        return {"invalid": EXIT_FAIL, "warnings": EXIT_WARN}.get(self.verdict, EXIT_OK)

    @property
    def problems(self) -> list[Finding]:
        return [f for f in self.findings if f.status in (Status.FAIL, Status.WARN)]

    def ids(self, *statuses: str) -> list[str]:
        want = {Status(s) for s in statuses} if statuses else None
        return [f.id for f in self.findings if want is None or f.status in want]

    def to_json(self) -> dict:
        return {"schema": "gpudoctor.sglang.validate/1", "verdict": self.verdict, "exit_code": self.exit_code,
                "sglang_version": self.sglang_version, "argv": self.argv, "resolved": self.resolved,
                "memory": self.memory, "findings": [f.to_json() for f in self.findings]}


_LAUNCHERS = ("sglang.launch_server", "sglang.launch_server.py")


def strip_launcher(argv: list[str]) -> list[str]:
    """Accept a whole command line: drop `python -m sglang.launch_server` or `sglang serve` in front."""
    argv = list(argv)
    for i, tok in enumerate(argv[:4]):
        if tok in _LAUNCHERS:
            return argv[i + 1:]
        if tok == "serve" and i > 0 and os.path.basename(argv[i - 1]) == "sglang":
            return argv[i + 1:]
    return argv


def _facts(cfg, path_hint: str | None) -> ModelFacts | None:
    if cfg is None:
        return None
    if isinstance(cfg, ModelFacts):
        return cfg
    if isinstance(cfg, dict):
        f = facts_from_config(cfg, path_hint)
        estimate_weights(f)
        return f
    return load_model(str(cfg))


ASSUMED_GIB = 141.0  # only for SGLang's own memory-dependent defaults when no GPU is known; never for the plan


def validate(argv: list[str], model_config: dict | str | ModelFacts | None = None, draft_config=None, *,
             gpu_mem_gib: float | None = 141.0, input_len: int | None = None, output_len: int | None = None,
             env: dict | None = None, fork_algorithms=(), extra_flags: list[dict] | None = None,
             gpus: int | None = None, sglang_version: str = "0.5.23", weights_bytes: int | None = None,
             auto_configs: bool = True, gpu: str | None = None, paths_here: bool = True) -> ValidationResult:
    """Check sglang.launch_server arguments the way SGLang would, plus what SGLang only finds after the load.

    model_config / draft_config: a parsed config.json dict, a path (file or model directory), or None. With
    auto_configs, a local --model-path / --speculative-draft-model-path directory is read when not given.
    gpu: a rules.GPUS key (h200, b200, rtx_pro_6000, ...): its nvidia-smi memory replaces gpu_mem_gib and its SM
    decides the KV cache dtypes and kernels SGLang allows.
    gpu_mem_gib None (and no gpu): no GPU is known — SGLang's memory-dependent defaults are resolved for an assumed
    ASSUMED_GIB card and say so, and the memory plan is not judged (a warning, sglang.memory.not_judged).
    paths_here: the paths in argv are this machine's (False: a remote server's, e.g. a campaign's target).
    Raises InputError for unreadable configs (CLI: one line, exit 3).
    """
    if gpu is not None:
        if gpu not in rules.GPUS:
            raise InputError(f"unknown --gpu {gpu!r} (known: {', '.join(sorted(rules.GPUS))})")
        gpu_mem_gib = rules.GPUS[gpu].memory_mib / 1024
    gpu_unknown = gpu_mem_gib is None
    if gpu_unknown:
        gpu_mem_gib = ASSUMED_GIB
    try:
        table = argparser.load_table(sglang_version)
    except KeyError as exc:
        raise InputError(f"no flag table for SGLang {sglang_version} (have {', '.join(argparser.available_versions())})") from exc
    forks = tuple(x.upper() for x in fork_algorithms)
    rows = [r for name in forks for r in rules.FORK_FLAGS.get(name, [])] + list(extra_flags or [])
    if rows:
        table = argparser.FlagTable(
            [dict(vars(f)) for f in table.flags] + rows, table.version)
    argv = strip_launcher(argv)
    parsed = table.parse(argv)
    opt = rules.Options(gpu_mem_gib=gpu_mem_gib, input_len=input_len, output_len=output_len,
                        env=dict(os.environ if env is None else env), fork_algorithms=forks, gpus=gpus,
                        version=sglang_version, gpu=gpu)
    findings = rules.parse_findings(parsed, table) + ranges.range_findings(parsed)
    # A config given for the model (--model-config, a campaign reading it on its target): the path is the server's,
    # not this machine's; only without one is an absent non-repo-id path SGLang's refusal (conflicts.py, #28).
    path_checked_here = model_config is None and paths_here
    if model_config is None and auto_configs:
        mp = parsed.get("model_path")
        if mp and os.path.isfile(os.path.join(mp, "config.json")):
            model_config = mp
    if draft_config is None and auto_configs:
        dp = parsed.get("speculative_draft_model_path")
        if dp and os.path.isfile(os.path.join(dp, "config.json")):
            draft_config = dp
    model = _facts(model_config, None)
    draft = _facts(draft_config, None)
    if model is not None and weights_bytes:
        model.weights_bytes, model.weights_source = weights_bytes, "given by the caller"
    res = rules.Resolved()
    if model is None:
        findings.append(rules.F("sglang.model.not_given", "info",
                                "no model config.json: head split, context length and memory are not checked",
                                source="gpudoctor", fix="pass --model-config MODEL_DIR (or a local --model-path)"))
    # Even when argparse would stop (exit 2), the rules below report what would fail next.
    findings += launch.tp_zero_findings(parsed)
    capacity.resolve_memory_defaults(parsed, model, opt, res)
    findings += launch.resolve_findings(parsed, model, opt, res, draft)
    findings += conflicts.exclusive_findings(parsed)
    gpu_sm = rules.GPUS[gpu].sm if gpu is not None else None
    findings += conflicts.capability_findings(parsed, gpu_sm) + conflicts.nvfp4_backend_findings(parsed, gpu_sm)
    if path_checked_here:
        findings += conflicts.model_path_findings(parsed)
    findings += rules.spec_findings(parsed, table, model, draft, opt, res)
    findings += capacity.parallel_findings(parsed, model, draft, opt)
    findings += capacity.context_findings(parsed, model, opt, res)
    findings += launch.launch_findings(parsed, model, opt, res)
    findings += launch.late_value_findings(parsed, res)
    findings += launch.draft_context_findings(parsed, model, draft, opt, res)
    if gpu_unknown:
        for key in ("mem_fraction_source", "chunked_prefill_source"):
            if key in res.values and not str(res.values[key]).startswith("--"):
                res.values[key] = f"{res.values[key]} (assumed: no GPU given or found)"
        plan = None
        if model is not None and model.weights_bytes is not None:
            findings.append(capacity.not_judged(parsed, model, draft))
    else:
        mem_findings, plan = capacity.memory_findings(parsed, model, draft, opt, res)
        findings += mem_findings
    res.values.setdefault("tp_size", parsed.get("tp_size"))
    if res.values.get("speculative_algorithm") is None:
        res.values.setdefault("max_running_requests", parsed.get("max_running_requests"))
    return ValidationResult(argv=argv, findings=findings, resolved=res.values, memory=plan, sglang_version=table.version)
