"""The pre-flight gate: does a Diagnosis let a campaign (or a server) start? Profiles say what is required.

A profile names check-id patterns (fnmatch) that must have run and passed (ok, info, or warn: a warning is an
explained non-blocker); "!pattern" in a list profile means failures there never block. By default any failure
anywhere also blocks ("fail-free"). A profile may also bound the GPU memory other processes hold
(`max_foreign_mib`, judged on workload.gpu.foreign_memory) and require the serving port free (`free_port`, judged on
workload.port.serving): the built-in `benchmark` profile allows 1024 MiB and wants the port free. Pure: Diagnosis + profile in, GateResult out. The `gate` command renders it; slurm.py and
npd.py adapt it to their conventions.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field

from gpudoctor.errors import EXIT_FAIL, EXIT_OK, EXIT_UNKNOWN, ConfigError
from gpudoctor.findings import Finding, Status

GATE_SCHEMA = "gpudoctor.gate/1"

_CORE = ("host.driver.loaded", "driver.nvml.init", "devices.node.present", "devices.node.major", "devices.node.open",
         "cuda.init", "cuda.device_count")

# Built-in profiles; an inventory's `profiles:` may override or add to them.
BUILTIN_PROFILES = {
    "default": {"require": [], "fail_free": True},
    "serve": {"require": list(_CORE), "fail_free": True},
    "benchmark": {"require": [*_CORE, "workload.model.*", "workload.gpu.foreign_memory"], "fail_free": True,
                  "max_foreign_mib": 1024, "free_port": True},
}


@dataclass(frozen=True)
class Profile:
    name: str
    require: tuple[str, ...] = ()  # check-id patterns that must run and pass (ok, info or warn)
    ignore: tuple[str, ...] = ()  # check-id patterns whose failures never block
    fail_free: bool = True  # any failure outside `ignore` blocks
    max_foreign_mib: int | None = None  # GPU memory other processes may hold (workload.gpu.foreign_memory); None: any
    free_port: bool = False  # the serving port must not be taken by another process (workload.port.serving)
    deep_floors: bool = False  # every deep-tier figure (fabric.deep.figure, check --deep) at or above its floor


PROFILE_KEYS = ("require", "ignore", "fail_free", "max_foreign_mib", "free_port", "deep_floors")


def profile_from(name: str, spec, path: str | None) -> Profile:
    """A Profile from a list of check-id patterns ("!" ignores), a mapping of PROFILE_KEYS, or an inventory's
    profile; a bad value is bad input (the inventory loader reports it at its line)."""
    if hasattr(spec, "patterns"):  # gpudoctor.inventory.Profile
        spec = dict(getattr(spec, "spec", ())) or list(spec.patterns)
    if isinstance(spec, (list, tuple)):
        if not all(isinstance(v, str) and v for v in spec):
            raise ConfigError(f"profile {name!r} must list check-id patterns (strings)", path=path)
        spec = {"require": [p for p in spec if not p.startswith("!")],
                "ignore": [p[1:] for p in spec if p.startswith("!")]}
    if not isinstance(spec, dict):
        raise ConfigError(f"profile {name!r} must be a list of check-id patterns or a mapping", path=path)
    unknown = set(spec) - set(PROFILE_KEYS)
    if unknown:
        raise ConfigError(f"profile {name!r}: unknown key(s) {', '.join(sorted(unknown))} (known: "
                          f"{', '.join(PROFILE_KEYS)})", path=path)
    for key in ("require", "ignore"):
        vals = spec.get(key, [])
        if not isinstance(vals, list) or not all(isinstance(v, str) and v for v in vals):
            raise ConfigError(f"profile {name!r}: {key} must be a list of check-id patterns", path=path)
    ff, port, deep = spec.get("fail_free", True), spec.get("free_port", False), spec.get("deep_floors", False)
    for key, val in (("fail_free", ff), ("free_port", port), ("deep_floors", deep)):
        if not isinstance(val, bool):
            raise ConfigError(f"profile {name!r}: {key} must be true or false", path=path)
    mx = spec.get("max_foreign_mib")
    if mx is not None and (isinstance(mx, bool) or not isinstance(mx, int) or mx < 0):
        raise ConfigError(f"profile {name!r}: max_foreign_mib must be a number of MiB (0 or more)", path=path)
    return Profile(name, tuple(spec.get("require", [])), tuple(spec.get("ignore", [])), ff, mx, port, deep)


def resolve_profile(name: str | None, inventory_profiles: dict | None = None, *, path: str | None = None) -> Profile:
    """The named profile: the inventory's definition wins over the built-in one; unknown names are bad input."""
    name = name or "default"
    inv = inventory_profiles or {}
    if name in inv:
        return profile_from(name, inv[name], path)
    if name in BUILTIN_PROFILES:
        return profile_from(name, BUILTIN_PROFILES[name], None)
    known = ", ".join(n for n, _ in known_profiles(inv))
    raise ConfigError(f"unknown gate profile {name!r} (known: {known})", path=path)


def known_profiles(inventory_profiles: dict | None = None) -> list[tuple[str, str]]:
    """Every profile `gate --profile` accepts, with where it comes from (built-in, inventory, or the inventory
    overriding a built-in): the one list the gate's errors and `inventory show` print."""
    inv = inventory_profiles or {}
    where = {n: "built-in" for n in BUILTIN_PROFILES}
    for n in inv:
        where[n] = "inventory (overrides the built-in)" if n in BUILTIN_PROFILES else "inventory"
    return sorted(where.items())


@dataclass
class Blocker:
    """One reason the gate is closed."""

    key: str
    status: str  # fail | unknown | missing
    summary: str
    hint: str | None = None
    symptom_of: str | None = None
    required: bool = False

    def line(self) -> str:
        """One line for humans (and Slurm/NPD): what blocks, and the fix."""
        text = f"{self.key}: {self.summary}"
        if self.symptom_of:
            text += f" (symptom of {self.symptom_of})"
        elif self.hint:
            text += f" — fix: {self.hint}"
        return " ".join(text.split())

    def to_json(self) -> dict:
        return {"key": self.key, "status": self.status, "summary": self.summary, "hint": self.hint,
                "symptom_of": self.symptom_of, "required": self.required}


@dataclass
class GateResult:
    host: str
    profile: str
    blockers: list[Blocker] = field(default_factory=list)
    error: str | None = None  # the host could not be checked at all
    facts: dict | None = field(default=None, repr=False, compare=False)  # the diagnosis' (boot id, driver: the ladder)
    replayed: str | None = None  # the snapshot judged (Target.replayed, gpudoctor/target.py): no action may follow this verdict

    @property
    def passed(self) -> bool:
        return not self.blockers and self.error is None

    @property
    def exit_code(self) -> int:
        """0 open; 2 blocked by a failure (or a required check that did not pass); 3 only unknowns or no check."""
        if self.error is not None:
            return EXIT_UNKNOWN
        if not self.blockers:
            return EXIT_OK
        if any(b.status in ("fail", "missing") for b in self.blockers):
            return EXIT_FAIL
        return EXIT_UNKNOWN

    @property
    def headline(self) -> str:
        """The one-line reason: the first root-cause blocker, or the error."""
        if self.error:
            return self.error
        if not self.blockers:
            return "ok"
        roots = [b for b in self.blockers if not b.symptom_of]
        return (roots or self.blockers)[0].summary

    def to_json(self) -> dict:
        return {"schema": GATE_SCHEMA, "host": self.host, "profile": self.profile, "pass": self.passed,
                "exit_code": self.exit_code, "error": self.error, "headline": self.headline,
                "blockers": [b.to_json() for b in self.blockers]}


def _match(fid: str, patterns) -> bool:
    return any(fnmatch.fnmatchcase(fid, p) for p in patterns)


def _upstream_failure(pattern: str, findings: list[Finding]) -> str | None:
    """The key of a failure that explains why a required check did not run (its dependency failed)."""
    from gpudoctor.checkreg import CHECKS, all_checks, depends

    all_checks()
    specs = [s for s in CHECKS.values() if fnmatch.fnmatchcase(s.id, pattern)]
    for f in findings:
        if f.status == Status.FAIL and any(depends(s, f.id) for s in specs):
            return f.blocked_by or f.key
    return None


def _missing_hint(pattern: str, findings: list[Finding], upstream: str | None) -> str:
    """What a required check that did not run needs, from what it depends on: a model only for the model checks."""
    from gpudoctor.checkreg import CHECKS, all_checks, depends

    if fnmatch.fnmatchcase("workload.model.x", pattern):
        return "give the model checks a model: --model PATH, or model_paths in the inventory"
    if upstream:
        return f"it runs once {upstream} passes: fix that first"
    all_checks()
    specs = [s for s in CHECKS.values() if fnmatch.fnmatchcase(s.id, pattern)]
    for f in findings:  # a dependency that answered nothing usable (nvidia-smi absent: NVML never probed)
        if f.status in (Status.UNKNOWN, Status.WARN) and any(depends(s, f.id) for s in specs):
            return f"it needs {f.key}, which could not tell: {f.summary}"
    return "it found nothing to judge here: `gpudoctor checks` says what it reads"


def evaluate(diagnosis, profile: Profile) -> GateResult:
    """Which findings block under this profile: root causes first, then their symptoms."""
    findings: list[Finding] = list(diagnosis.findings)
    blockers: dict[str, Blocker] = {}

    def add(f: Finding, status: str, required: bool):
        b = blockers.get(f.key)
        if b is None:
            blockers[f.key] = Blocker(f.key, status, f.summary, f.hint, f.blocked_by, required)
        else:
            b.required = b.required or required

    if profile.fail_free:
        for f in findings:
            if f.status == Status.FAIL and not _match(f.id, profile.ignore):
                add(f, "fail", _match(f.id, profile.require))
    for pat in profile.require:
        matched = [f for f in findings if fnmatch.fnmatchcase(f.id, pat)]
        if not matched:
            upstream = _upstream_failure(pat, findings)
            blockers[pat] = Blocker(pat, "missing", f"required check {pat} did not run on this host",
                                    _missing_hint(pat, findings, upstream), symptom_of=upstream, required=True)
        for f in matched:
            if f.status in (Status.FAIL, Status.UNKNOWN) and not _match(f.id, profile.ignore):
                add(f, f.status.value, True)
    for f in findings:
        if _match(f.id, profile.ignore):
            continue
        if (profile.max_foreign_mib is not None and f.id == "workload.gpu.foreign_memory"
                and (f.data.get("foreign_mib") or 0) > profile.max_foreign_mib):
            blockers[f.key] = Blocker(f.key, "fail", f"{f.summary} (the {profile.name} profile allows "
                                      f"{profile.max_foreign_mib} MiB)", f.hint, f.blocked_by, True)
        elif profile.free_port and f.id == "workload.port.serving" and f.data.get("in_use_by_other"):
            blockers[f.key] = Blocker(f.key, "fail", f.summary, f.hint, f.blocked_by, True)
    if profile.deep_floors:
        _deep_floor_blockers(findings, profile, blockers)
    order = {"fail": 0, "missing": 1, "unknown": 2}
    ranked = sorted(blockers.values(), key=lambda b: (b.symptom_of is not None, order.get(b.status, 9)))
    host = getattr(diagnosis, "host", None) or "?"
    if not getattr(diagnosis, "judged", True):  # a diagnosis of nothing: no check could decide anything
        return GateResult(host=host, profile=profile.name, blockers=ranked,
                          error="no check could judge this host (every finding is unknown or there are none)")
    return GateResult(host=host, profile=profile.name, blockers=ranked, facts=getattr(diagnosis, "facts", None))


def _deep_floor_blockers(findings: list[Finding], profile: Profile, blockers: dict) -> None:
    """deep_floors: a figure below its floor blocks, with the cause the diagnosis named for it; a figure not judged
    (no measurement, a SKU without limits) blocks as unknown; no deep figures at all is a missing requirement."""
    deep = [f for f in findings if f.id == "fabric.deep.figure"]
    by_key = {f.key: f for f in findings}
    if not deep:
        blockers["fabric.deep.figure"] = Blocker("fabric.deep.figure", "missing", f"the {profile.name} profile requires "
                                                 "deep-tier figures above their floors; none were measured",
                                                 "run with --deep (gpudoctor gate --deep, or gate a snapshot taken "
                                                 "with `gpudoctor snapshot --deep`)", required=True)
        return
    for f in deep:
        if f.status == Status.WARN:
            cause = by_key.get(f.blocked_by or "")
            if cause is not None and cause.key not in blockers:
                blockers[cause.key] = Blocker(cause.key, "fail", cause.summary, cause.hint, None, True)
            blockers[f.key] = Blocker(f.key, "fail", f.summary, f.hint, f.blocked_by, True)
        elif f.status == Status.UNKNOWN or (f.status == Status.INFO and f.data.get("floor") is None
                                             and f.data.get("kind") in ("h2d", "d2h", "d2d", "gemm", "p2p")):
            blockers[f.key] = Blocker(f.key, "unknown", f"{f.summary} (not judged against a floor)", f.hint,
                                      f.blocked_by, True)


def judge(diagnose_fn, profile: Profile, host: str) -> GateResult:
    """The gate's fail-closed rule, in the one place it lives: whatever could not be judged closes the gate with
    exit 3. Bad input (InputError) is raised for the CLI's one line; every other failure — the host unreachable, a
    snapshot that replays to nothing, a bug — becomes a closed GateResult with the reason, never an open gate."""
    from gpudoctor.errors import GpudoctorError, InputError

    try:
        diagnosis = diagnose_fn()
    except InputError:
        raise
    except GpudoctorError as exc:
        return unreachable(host, profile.name, exc.one_line())
    except Exception as exc:  # noqa: BLE001 - a gate that crashed has not judged: closed, exit 3
        from gpudoctor.errors import _short

        return unreachable(host, profile.name, _short(f"internal error: {type(exc).__name__}: {exc}"))
    return evaluate(diagnosis, profile)


def gate_target(target, profile: str | None) -> GateResult:
    """The gate's verdict on an opened Target (gpudoctor.target): the profile from the same inventory as the
    target's policy, the diagnosis through pipeline.check_host, judged fail-closed (judge). `gpudoctor gate` and a
    campaign's gate both come here."""
    from gpudoctor.pipeline import check_host

    inv = target.inventory
    prof = resolve_profile(profile, dict(inv.profiles) if inv is not None else {},
                           path=str(inv.path) if inv is not None else None)
    result = judge(lambda: check_host(target), prof, target.name)
    result.replayed = target.replayed()  # a replay's verdict carries it: Slurm and the ladder refuse to act on it
    return result


def unreachable(host: str, profile: str, error: str) -> GateResult:
    """The gate result when the host could not be checked: closed, status unknown."""
    return GateResult(host=host, profile=profile, error=error)
