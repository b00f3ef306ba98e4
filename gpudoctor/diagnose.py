"""Diagnose: run every check over Facts, mark symptoms "blocked by" their cause, rank the root cause, explain the chain."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpudoctor.checkreg import CHECKS, all_checks, depends, findings_of
from gpudoctor.findings import LAYERS, Finding, Status, exit_code, worst

CHECK_SCHEMA = "gpudoctor.check/1"
_SEVERITY = {Status.FAIL: 0, Status.UNKNOWN: 1, Status.WARN: 2}


@dataclass
class Diagnosis:
    host: str
    findings: list[Finding]
    root_causes: list[Finding] = field(default_factory=list)
    chain: list[str] = field(default_factory=list)
    facts: dict = field(default_factory=dict)

    @property
    def verdict(self) -> Status:
        return worst(f.status for f in self.findings)

    @property
    def exit_code(self) -> int:
        return exit_code(self.verdict)

    @property
    def root_cause(self) -> Finding | None:
        return self.root_causes[0] if self.root_causes else None

    def by_key(self) -> dict[str, Finding]:
        return {f.key: f for f in self.findings}

    def to_json(self) -> dict:
        from gpudoctor import __version__

        meta = self.facts.get("meta", {})
        return {
            "schema": CHECK_SCHEMA,
            "gpudoctor_version": __version__,
            "host": self.host,
            "verdict": self.verdict.value,
            "exit_code": self.exit_code,
            "root_cause": self.root_cause.to_json() if self.root_cause else None,
            "other_causes": [f.key for f in self.root_causes[1:]],
            "chain": self.chain,
            "findings": [f.to_json() for f in self.findings],
            "timings": meta.get("timings", {}),
        }


def run_checks(facts: dict, only_layers: set[str] | None = None) -> list[Finding]:
    """Every applicable check's findings, in layer order. A crashing check is an unknown finding, not a crash."""
    out: list[Finding] = []
    for spec in all_checks():
        if only_layers and spec.layer not in only_layers:
            continue
        out += findings_of(spec, facts)
    return out


def _compatible(symptom: Finding, cause: Finding) -> bool:
    """A cause about one node only explains symptoms about that node, or symptoms about no node in particular."""
    return cause.subject is None or symptom.subject is None or cause.subject == symptom.subject


def _rank(f: Finding) -> tuple:
    return (_SEVERITY.get(f.status, 9), LAYERS.index(f.layer) if f.layer in LAYERS else 99, f.key)


def mark_blocked(findings: list[Finding]) -> None:
    """Point each bad finding at the failure it is a symptom of, then resolve each pointer to its root."""
    failing = [f for f in findings if f.status == Status.FAIL]
    for f in findings:
        if not f.bad or f.id not in CHECKS:
            continue
        spec = CHECKS[f.id]
        causes = [c for c in failing if c is not f and c.id != f.id and depends(spec, c.id) and _compatible(f, c)]
        if causes:
            f.blocked_by = min(causes, key=_rank).key
    index = {f.key: f for f in findings}
    for f in findings:
        seen = {f.key}
        while f.blocked_by and (up := index.get(f.blocked_by)) and up.blocked_by and up.blocked_by not in seen:
            seen.add(up.key)
            f.blocked_by = up.blocked_by
        if f.blocked_by in seen:  # a cycle: neither explains the other
            f.blocked_by = None


def chain_step(summary: str) -> str:
    """A summary as one step of the chain: its first clause, without inner arrows (the chain has its own).

    "cuInit → 999 CUDA_ERROR_UNKNOWN: unknown error — …" → "cuInit 999 CUDA_ERROR_UNKNOWN";
    "/dev/nvidia-uvm: major 511 (nvidia-uvm) is not allowed by ct200's config; opening it …" keeps its subject."""
    head = summary.split("; ", 1)[0]
    first, sep, _rest = head.partition(": ")
    if sep and " → " in first:  # an outcome ("open(X) → EPERM") before the colon; what follows explains it
        head = first
    return head.replace(" → ", " ")


def explain_chain(root: Finding, findings: list[Finding]) -> list[str]:
    """From what works down to the root cause: "NVML ok → cuInit 999 → open(/dev/nvidia-uvm) EPERM → root cause: …"."""
    chain: list[str] = []
    nvml = next((f for f in findings if f.id == "driver.nvml.init"), None)
    symptoms = [f for f in findings if f.blocked_by == root.key]
    if nvml and nvml.status == Status.OK and root.layer != "driver":
        chain.append(nvml.summary.split(":")[0])  # "NVML ok"
    for f in sorted(symptoms, key=lambda f: -LAYERS.index(f.layer) if f.layer in LAYERS else 0):
        chain.append(chain_step(f.summary))
    chain.append(f"root cause: {chain_step(root.summary)}")
    return chain


def diagnose(facts: dict, only_layers: set[str] | None = None) -> Diagnosis:
    """Facts → Diagnosis. Pure: the same facts always give the same verdict."""
    findings = run_checks(facts, only_layers)
    mark_blocked(findings)
    roots = sorted((f for f in findings if f.bad and not f.blocked_by), key=_rank)
    d = Diagnosis(host=(facts.get("meta") or {}).get("host", "?"), findings=findings, root_causes=roots, facts=facts)
    if roots:
        d.chain = explain_chain(roots[0], findings)
    return d
