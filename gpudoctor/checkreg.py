"""The check registry: pure functions over Facts, each with a stable dotted id, a layer and a purpose."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Callable

from gpudoctor.findings import LAYERS, Finding


@dataclass(frozen=True)
class CheckSpec:
    id: str
    layer: str
    summary: str
    fn: Callable[[dict], "Finding | list[Finding] | None"]
    # Finding ids (fnmatch) whose failure can explain this check's findings; a finding narrows it by its evidence
    # (Finding.explained_by), e.g. "nvidia-smi is not installed" names nothing: a missing tool is its own cause.
    depends_on: tuple[str, ...] = ()
    remedy: str | None = None

    @property
    def doc(self) -> str:
        return (self.fn.__doc__ or self.summary).strip()


CHECKS: dict[str, CheckSpec] = {}


def check(id: str, *, summary: str, depends_on: tuple[str, ...] = (), layer: str | None = None,
          remedy: str | None = None):
    """Register a pure check `fn(facts) -> Finding | list[Finding] | None` (None: not applicable)."""
    layer = layer or id.split(".", 1)[0]
    if layer not in LAYERS:
        raise ValueError(f"check {id}: unknown layer {layer}")

    def deco(fn):
        if id in CHECKS and CHECKS[id].fn is not fn:
            raise ValueError(f"duplicate check id {id}")
        CHECKS[id] = CheckSpec(id, layer, summary, fn, tuple(depends_on), remedy)
        return fn

    return deco


def all_checks() -> list[CheckSpec]:
    """Every registered check, in layer order then id."""
    import gpudoctor.checks  # noqa: F401 - registers the checks

    return sorted(CHECKS.values(), key=lambda c: (LAYERS.index(c.layer), c.id))


def depends(spec: CheckSpec, finding_id: str) -> bool:
    """Whether a finding with id `finding_id` is upstream of this check (a pattern's "@SUBJECT" part ignored)."""
    return any(fnmatch.fnmatchcase(finding_id, pat.partition("@")[0]) for pat in spec.depends_on)
