"""Diagnose: run every check over Facts, mark symptoms "blocked by" their cause, rank the root cause, explain the chain."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field

from gpudoctor.checkreg import CHECKS, all_checks, findings_of
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
    only_layers: list[str] | None = None  # a filtered view (check --only): findings of these layers only

    @property
    def judged(self) -> bool:
        """Whether any check could decide anything (ok, warn or fail). A diagnosis of nothing is never healthy."""
        return any(f.status in (Status.OK, Status.WARN, Status.FAIL) for f in self.findings)

    @property
    def verdict(self) -> Status:
        return worst(f.status for f in self.findings) if self.judged else Status.UNKNOWN

    @property
    def exit_code(self) -> int:
        return exit_code(self.verdict)

    @property
    def root_cause(self) -> Finding | None:
        return self.root_causes[0] if self.root_causes else None

    @property
    def outside(self) -> list[Finding]:
        """Root causes that lie outside a filtered view (--only): kept because findings in the view are their symptoms."""
        if not self.only_layers:
            return []
        return [f for f in self.root_causes if f.layer not in self.only_layers]

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
            **({"deep_timeline": deep_tl} if (deep_tl := (self.facts.get("deep") or {}).get("timeline")) else {}),
            **({"only_layers": self.only_layers, "causes_outside_filter": [f.key for f in self.outside]}
               if self.only_layers else {}),
        }


def run_checks(facts: dict) -> list[Finding]:
    """Every applicable check's findings, in layer order. A crashing check is an unknown finding, not a crash."""
    out: list[Finding] = []
    for spec in all_checks():
        out += findings_of(spec, facts)
    return out


def _compatible(symptom: Finding, cause: Finding) -> bool:
    """A cause about one node only explains symptoms about that node, or symptoms about no node in particular."""
    return cause.subject is None or symptom.subject is None or cause.subject == symptom.subject


def _pattern_matches(pattern: str, cause: Finding) -> tuple[bool, bool]:
    """(matches, names a subject) for one explained_by/depends_on pattern "ID" or "ID@SUBJECT" (fnmatch both)."""
    idp, sep, subjp = pattern.partition("@")
    if not fnmatch.fnmatchcase(cause.id, idp):
        return False, bool(sep)
    if sep:
        return cause.subject is not None and fnmatch.fnmatchcase(cause.subject, subjp), True
    return True, False


def explains(cause: Finding, symptom: Finding) -> bool:
    """Whether `symptom`'s evidence can follow from `cause`: the symptom (or its check's depends_on) names the cause,
    the subjects agree (the pattern names the cause's subject, or they are equal, or one has none), and the cause is
    a failure — a warning or unknown explains only a finding about its own subject (uvm-tools' EPERM ← its own
    allow-list warning)."""
    if cause is symptom or cause.id == symptom.id or not cause.bad:
        return False
    patterns = symptom.explained_by
    if patterns is None:
        spec = CHECKS.get(symptom.id)
        patterns = spec.depends_on if spec else ()
    hits = [named for ok, named in (_pattern_matches(p, cause) for p in patterns) if ok]
    if not hits:
        return False
    by_subject = any(hits)  # the pattern itself names which subjects of the cause explain this finding
    if not by_subject and not _compatible(symptom, cause):
        return False
    if cause.status == Status.FAIL:
        return True
    return by_subject or (cause.subject is not None and cause.subject == symptom.subject)


# Which root cause comes first: severity, then the layer order of cause and effect. The boundary (what a container
# may open) sits under the device nodes it explains, so it outranks them; otherwise bottom-up as LAYERS.
CAUSAL_ORDER = ("host", "boundary", "driver", "devices", "cuda", "fabric", "workload")


def _rank(f: Finding) -> tuple:
    return (_SEVERITY.get(f.status, 9), CAUSAL_ORDER.index(f.layer) if f.layer in CAUSAL_ORDER else 99, f.key)


def mark_blocked(findings: list[Finding]) -> None:
    """Point each bad finding at the failure it is a symptom of, then resolve each pointer to its root."""
    bad = [f for f in findings if f.bad]
    for f in bad:
        causes = [c for c in bad if explains(c, f)]
        if causes:
            f.blocked_by = min(causes, key=_rank).key
    first = {f.key: f.blocked_by for f in findings}
    for f in findings:
        path, cur = [f.key], first.get(f.key)
        while cur is not None:
            if cur in path:  # a cycle: neither explains the other
                cur = None
                break
            if first.get(cur) is None:
                break
            path.append(cur)
            cur = first[cur]
        f.blocked_by = cur


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
    """Facts → Diagnosis. Pure: the same facts always give the same verdict.

    `only_layers` is a view, not a different diagnosis: every check runs and blame is assigned over all of them, then
    only the findings of those layers are kept. A kept finding stays the symptom of a cause outside the view, and that
    cause stays the root cause (`outside` names it), so `check --only devices` ranks as the full check does."""
    findings = run_checks(facts)
    mark_blocked(findings)
    roots = sorted((f for f in findings if f.bad and not f.blocked_by), key=_rank)
    host = (facts.get("meta") or {}).get("host", "?")
    chain = explain_chain(roots[0], findings) if roots else []
    if not only_layers:
        return Diagnosis(host=host, findings=findings, root_causes=roots, chain=chain, facts=facts)
    kept = [f for f in findings if f.layer in only_layers]
    blamed = {f.blocked_by for f in kept if f.blocked_by}
    view_roots = [r for r in roots if r.layer in only_layers or r.key in blamed]
    d = Diagnosis(host=host, findings=kept, root_causes=view_roots, facts=facts, only_layers=sorted(only_layers))
    if view_roots:
        d.chain = chain if view_roots[0] is roots[0] else explain_chain(view_roots[0], findings)
    return d
