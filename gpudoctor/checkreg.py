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


def findings_of(spec: CheckSpec, facts: dict) -> list[Finding]:
    """One check's findings over facts, each with its layer and the remedy its registration declares — the one
    place a finding gets its remedy (a finding with remediable=False declines it). A crash is an unknown finding."""
    from gpudoctor.findings import Status

    from gpudoctor.errors import ConfigError

    try:
        res = spec.fn(facts)
    except ConfigError:
        raise  # a bad configuration a check reads (the SKU table): one line and exit 3, not an unknown finding
    except Exception as exc:  # noqa: BLE001 - a check bug must not hide the other findings
        res = Finding(spec.id, Status.UNKNOWN, f"check crashed: {type(exc).__name__}: {exc}")
    out = [res] if isinstance(res, Finding) else list(res or [])
    for f in out:
        f.layer = f.layer or spec.layer
        f.remedy = spec.remedy if spec.remedy and f.bad and f.remediable else None
    return out


def spec_of(fn) -> CheckSpec:
    """The registration of a check function."""
    return next(s for s in all_checks() if s.fn is fn)


def all_checks() -> list[CheckSpec]:
    """Every registered check, in layer order then id."""
    import gpudoctor.checks  # noqa: F401 - registers the checks

    return sorted(CHECKS.values(), key=lambda c: (LAYERS.index(c.layer), c.id))


def depends(spec: CheckSpec, finding_id: str) -> bool:
    """Whether a finding with id `finding_id` is upstream of this check (a pattern's "@SUBJECT" part ignored)."""
    return any(fnmatch.fnmatchcase(finding_id, pat.partition("@")[0]) for pat in spec.depends_on)
