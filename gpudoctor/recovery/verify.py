"""The active verification: a host proves itself under load before it goes back to work (issue #31).

    parse_verify_policy(spec, path=, lines=) -> VerifyPolicy     the inventory's policy `verify:` section
    run_verification(target, policy, progress=) -> Verification  the steps, in order, bounded by policy.timeout_s

Steps (docs/verify.md), each "pass", "fail" or "not-run":
  deep      the deep tier on every GPU through the one pipeline (pipeline.check_host with policy deep) judged by the
            gate's deep_floors rule: a figure below its floor, a figure not measured (a foreign process holding the
            GPU: its PID), a cause found during it (contention, clocks, errors) fails it;
  serving   a short load through the bench client (K requests, max_tokens each, TTFT max under a ceiling) against the
            inventory entry's `serving: {url, model, api}`; the server's own words when it is down or errs;
  commands  site commands (argv), each must exit 0 in the time left.
Fail closed: a step that could not judge fails; no applicable step at all is not a pass (the reason says what to
configure). The ladder (gpudoctor/recovery/, the daemon, the gates) decides what a verification means for the host.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace
from typing import Callable

from gpudoctor.errors import ConfigError
from gpudoctor.recovery.listener import trusted_listeners

MODES = ("auto", "on", "off")
VERIFY_KEYS = ("deep", "serving", "commands", "timeout_s", "smoke_requests", "smoke_max_tokens", "smoke_ttft_ms_max",
               "deep_python")
PASS, FAIL, NOT_RUN = "pass", "fail", "not-run"
TAIL_CHARS = 400  # a command's output tail kept in a step's detail


@dataclass(frozen=True)
class VerifyPolicy:
    """The inventory's policy `verify:` section; the defaults verify whatever the host has."""

    deep: str = "auto"  # "auto": when the host has NVIDIA GPUs; "on"; "off"
    serving: str = "auto"  # "auto": when the inventory entry names the serving endpoint and model; "on"; "off"
    commands: tuple = ()  # site commands (argv tuples, e.g. ("dcgmi", "diag", "-r", "2")); each must exit 0 in time
    timeout_s: float = 600.0  # the whole verification's bound
    smoke_requests: int = 8
    smoke_max_tokens: int = 16
    smoke_ttft_ms_max: float = 5000.0
    deep_python: str | None = None  # a python with torch for the deep tier (GEMM needs it); None: the host's

    def to_json(self) -> dict:
        return {"deep": self.deep, "serving": self.serving, "commands": [list(c) for c in self.commands],
                "timeout_s": self.timeout_s, "smoke_requests": self.smoke_requests,
                "smoke_max_tokens": self.smoke_max_tokens, "smoke_ttft_ms_max": self.smoke_ttft_ms_max,
                "deep_python": self.deep_python}


def parse_verify_policy(spec, *, path: str | None = None, lines: dict | None = None) -> VerifyPolicy:
    """A VerifyPolicy from the `verify:` mapping (None: the defaults). Bad input raises ConfigError naming the key,
    at its line when `lines` ({key: line}, the inventory loader's) knows it."""
    if spec is None:
        return VerifyPolicy()
    lines = lines or {}

    def err(key: str | None, message: str) -> ConfigError:
        return ConfigError(message, path=path, line=lines.get(key) if key else lines.get(""))

    if not isinstance(spec, dict):
        raise err(None, f"policy.verify must be a mapping of {', '.join(VERIFY_KEYS)}, got {type(spec).__name__}")
    unknown = sorted(str(k) for k in spec if k not in VERIFY_KEYS)
    if unknown:
        raise err(unknown[0], f"policy.verify: unknown key {unknown[0]!r} (known: {', '.join(VERIFY_KEYS)})")
    kw: dict = {}
    for key in ("deep", "serving"):
        if key in spec:
            v = spec[key]
            if v is True or v is False:  # YAML's on/off read as booleans
                v = "on" if v else "off"
            if v not in MODES:
                raise err(key, f"policy.verify.{key} must be one of {', '.join(MODES)}, got {v!r}")
            kw[key] = v
    if "commands" in spec:
        kw["commands"] = _commands(spec["commands"], err)
    if spec.get("deep_python") is not None:
        v = spec["deep_python"]
        if not isinstance(v, str) or not v.startswith("/") or any(c.isspace() for c in v):
            raise err("deep_python", f"policy.verify.deep_python must be an absolute path to a python with torch, "
                                     f"got {v!r}")
        kw["deep_python"] = v
    for key, kind, lo, hi in (("timeout_s", float, 1.0, 86400.0), ("smoke_requests", int, 1, 1000),
                              ("smoke_max_tokens", int, 1, 65536), ("smoke_ttft_ms_max", float, 1.0, 3.6e6)):
        if key not in spec:
            continue
        v = spec[key]
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and lo <= v <= hi
        if ok and kind is int:
            ok = float(v).is_integer()
        if not ok:
            what = "an integer" if kind is int else "a number"
            raise err(key, f"policy.verify.{key} must be {what} from {lo:g} to {hi:g}, got {v!r}")
        kw[key] = kind(v)
    return VerifyPolicy(**kw)


def verify_policy_of(policy, *, path=None):
    """The VerifyPolicy of an inventory's policy (gpudoctor.inventory.Policy or a plain mapping; None: defaults)."""
    if policy is None:
        return parse_verify_policy(None, path=path)
    if isinstance(policy, dict):
        return parse_verify_policy(policy.get("verify"), path=path)
    return parse_verify_policy(getattr(policy, "verify", None), path=path, lines=getattr(policy, "verify_lines", None))


def _commands(value, err) -> tuple:
    """Site commands: a list of argv lists (["dcgmi", "diag", "-r", "2"]); a string is refused (no shell)."""
    if not isinstance(value, (list, tuple)):
        raise err("commands", "policy.verify.commands must be a list of commands, each a list of arguments "
                              "(e.g. [[dcgmi, diag, -r, \"2\"]])")
    out = []
    for i, cmd in enumerate(value):
        if isinstance(cmd, str):
            raise err("commands", f"policy.verify.commands item {i + 1} is a string: give the argv as a list "
                                  f"(e.g. [{', '.join(cmd.split()[:3]) or 'cmd'}]); no shell runs it")
        if not isinstance(cmd, (list, tuple)) or not cmd or not all(
                isinstance(a, (str, int, float)) and not isinstance(a, bool) for a in cmd):
            raise err("commands", f"policy.verify.commands item {i + 1} must be a non-empty list of arguments")
        argv = tuple(str(a) for a in cmd)
        if not argv[0]:
            raise err("commands", f"policy.verify.commands item {i + 1}: the program name is empty")
        out.append(argv)
    return tuple(out)


@dataclass
class StepResult:
    name: str
    status: str  # "pass" | "fail" | "not-run"
    detail: str
    seconds: float = 0.0

    def to_json(self) -> dict:
        return {"name": self.name, "status": self.status, "detail": self.detail, "seconds": round(self.seconds, 3)}

    @classmethod
    def from_json(cls, d: dict) -> "StepResult":
        return cls(str(d.get("name", "?")), str(d.get("status", FAIL)), str(d.get("detail", "")),
                   float(d.get("seconds") or 0.0))


@dataclass
class Verification:
    passed: bool
    reason: str  # one line, "" when passed; names the failing step and its cause (e.g. a PID)
    steps: list = field(default_factory=list)
    started_at: float = 0.0  # wall clock (time.time()) when it started
    seconds: float = 0.0

    def to_json(self) -> dict:
        return {"passed": self.passed, "reason": self.reason, "steps": [s.to_json() for s in self.steps],
                "started_at": self.started_at, "seconds": round(self.seconds, 3)}

    @classmethod
    def from_json(cls, d: dict) -> "Verification":
        return cls(passed=bool(d.get("passed")), reason=str(d.get("reason") or ""),
                   steps=[StepResult.from_json(s) for s in d.get("steps") or [] if isinstance(s, dict)],
                   started_at=float(d.get("started_at") or 0.0), seconds=float(d.get("seconds") or 0.0))


# --- the run ----------------------------------------------------------------------------------------------------

Progress = Callable[[str, str], None]  # (step name, what happens now)


class _Clock:
    """The whole verification's deadline: each step gets what is left."""

    def __init__(self, total_s: float):
        self.total, self.t0 = total_s, time.monotonic()

    def left(self) -> float:
        return self.total - (time.monotonic() - self.t0)


def run_verification(target, policy: VerifyPolicy, *, progress: Progress | None = None) -> Verification:
    """Run the applicable steps in order (deep, serving, commands), each bounded by what is left of
    policy.timeout_s; passed only when at least one step ran and every step that ran passed."""
    from gpudoctor.log import get_logger

    log = get_logger("gpudoctor.recovery", host=target.name)
    say = progress or (lambda step, what: None)
    started, clock = time.time(), _Clock(policy.timeout_s)
    steps: list[StepResult] = []
    unconfigured: list[str] = []
    for name, applies, run in _STEPS:
        try:
            why_not = applies(target, policy)
        except Exception as exc:  # noqa: BLE001 - e.g. the host unreachable while looking for GPUs: fail closed
            steps.append(StepResult(name, FAIL, _could_not_judge(exc)))
            continue
        if why_not:
            steps.append(StepResult(name, NOT_RUN, why_not))
            unconfigured.append(why_not)
            continue
        left = clock.left()
        if left <= 0:
            steps.append(StepResult(name, FAIL, f"not started: the verification's {policy.timeout_s:g} s "
                                                "(policy.verify.timeout_s) were spent"))
            continue
        say(name, "start")
        t0 = time.monotonic()
        try:
            status, detail = run(target, policy, left, lambda what, _n=name: say(_n, what))
        except Exception as exc:  # noqa: BLE001 - a step that crashed has not judged: fail closed
            status, detail = FAIL, _could_not_judge(exc)
        steps.append(StepResult(name, status, detail, time.monotonic() - t0))
        log.info("verify.step", step=name, status=status, seconds=round(steps[-1].seconds, 3), detail=detail)
        say(name, status)
    ran = [s for s in steps if s.status != NOT_RUN]
    failed = [s for s in ran if s.status != PASS]
    if failed:
        reason = "; ".join(f"{s.name}: {s.detail}" for s in failed)
    elif not ran:
        reason = "nothing to verify: " + "; ".join(unconfigured)
    else:
        reason = ""
    from gpudoctor.errors import _short

    v = Verification(passed=not reason, reason=_short(" ".join(reason.split())), steps=steps, started_at=started,
                     seconds=time.time() - started)
    log.info("verify.finished", passed=v.passed, reason=v.reason, seconds=round(v.seconds, 3))
    return v


def _could_not_judge(exc: Exception) -> str:
    from gpudoctor.errors import GpudoctorError, _short

    if isinstance(exc, GpudoctorError):
        return exc.one_line()
    return _short(f"could not judge: {type(exc).__name__}: {exc}")


# --- the commands step --------------------------------------------------------------------------------------------

def _commands_apply(target, policy: VerifyPolicy) -> str | None:
    if not policy.commands:
        return "no site commands (policy.verify.commands)"
    if target.host is None:
        return "no host to run the site commands on (a snapshot)"
    return None


def _tail(res) -> str:
    text = " ".join(((res.stdout or "") + " " + (res.stderr or "")).split())
    return text[-TAIL_CHARS:]


def run_commands(target, policy: VerifyPolicy, budget_s: float, say: Callable[[str], None]) -> tuple[str, str]:
    """Each site command on the target's host, in order, in the time left; the first that fails fails the step."""
    from gpudoctor.host.base import quote_argv

    t0, done = time.monotonic(), []
    for argv in policy.commands:
        left = budget_s - (time.monotonic() - t0)
        line = quote_argv(list(argv))
        if left <= 0:
            return FAIL, f"{line}: not started, the verification's time was spent"
        say(f"$ {line}")
        res = target.host.run(list(argv), timeout=left)
        if res.timed_out:
            return FAIL, f"{line}: did not exit in {left:.0f} s (policy.verify.timeout_s)"
        if res.rc != 0:
            tail = _tail(res)
            return FAIL, f"{line}: exit {res.rc}" + (f": {tail}" if tail else "")
        done.append(f"{line}: exit 0 in {res.duration_s:.1f} s" + (f" ({_tail(res)[-120:]})" if _tail(res) else ""))
    return PASS, "; ".join(done)


# --- the deep step --------------------------------------------------------------------------------------------------

REQUIRED_KINDS = ("h2d", "d2h", "d2d", "gemm")  # what every GPU must measure at or above its floor
KIND_WORDS = {"h2d": "H2D", "d2h": "D2H", "d2d": "device copy", "gemm": "bf16 GEMM"}
# Causes named first in the reason: who else was there (the PID) before what it did to the clocks.
CAUSE_ORDER = ("fabric.deep.contention", "fabric.deep.errors", "fabric.deep.clocks")


def _deep_apply(target, policy: VerifyPolicy) -> str | None:
    if policy.deep == "off":
        return "deep tier off (policy.verify.deep)"
    if policy.deep == "on" or _has_nvidia_gpu(target):
        return None
    return "no NVIDIA GPU here for the deep tier (policy.verify.deep: auto)"


def _has_nvidia_gpu(target) -> bool:
    """policy.verify.deep: auto — the inventory expects GPUs, the snapshot measured some, or the host shows
    /dev/nvidiaN."""
    import re

    if target.context.expect_gpus:
        return True
    if target.snapshot is not None:
        return bool(((target.snapshot.get("facts") or {}).get("deep") or {}).get("gpus"))
    if target.host is None:
        return False
    names = target.host.listdir("/dev")
    return isinstance(names, list) and any(re.fullmatch(r"nvidia\d+", n) for n in names)


_DEEP_RUNS: dict = {}  # target name -> (thread, started): a deep run that outlived its deadline still holds the GPUs
_DEEP_LOCK = threading.Lock()


def run_deep(target, policy: VerifyPolicy, budget_s: float, say: Callable[[str], None]) -> tuple[str, str]:
    """The deep tier on every GPU through the one pipeline (check --deep's: pipeline.check_host with policy deep,
    never --force: a GPU another process holds is refused and named), judged by judge_deep. Bounded: each GPU's
    child gets its share of the time left; a tier still running at the deadline is a fail."""
    from gpudoctor.pipeline import check_host

    ctx = target.context
    pol = {k: v for k, v in ctx.policy.items() if k != "deep_force"}
    pol["deep"] = True
    if policy.deep_python:
        pol["torch_python"] = policy.deep_python
    n = max(1, ctx.expect_gpus or _count_gpus(target))
    # each child is killed 10 s after its budget; what is left after the children is for the passive gather
    per_gpu = min(float(pol.get("deep_gpu_budget_s") or 30.0), max(5.0, (budget_s * 0.8) / n - 10.0))
    pol["deep_gpu_budget_s"] = per_gpu
    # the caller's target is not changed: the deep run gets its own context (the same host, the deep policy)
    deep_target = replace(target, context=replace(ctx, policy=pol))
    box: dict = {}

    def work():
        try:
            box["diagnosis"] = check_host(deep_target)
        except BaseException as exc:  # noqa: BLE001 - carried to the caller's thread
            box["error"] = exc

    with _DEEP_LOCK:
        old = _DEEP_RUNS.get(target.name)
        if old is not None and old[0].is_alive():  # never two deep runs on one host: each would see the other
            return FAIL, (f"a deep run started {time.monotonic() - old[1]:.0f} s ago (past its verification's "
                          "deadline) is still measuring: not started again")
        th = threading.Thread(target=work, name="gpudoctor-verify-deep", daemon=True)
        _DEEP_RUNS[target.name] = (th, time.monotonic())
        th.start()
    say(f"deep tier on {n} GPU(s), {per_gpu:.0f} s budget each")
    th.join(budget_s)
    if th.is_alive():
        return FAIL, f"the deep tier did not finish in {budget_s:.3g} s (policy.verify.timeout_s)"
    if "error" in box:
        raise box["error"]
    return judge_deep(box["diagnosis"])


def _count_gpus(target) -> int:
    if target.host is None:
        return 1
    import re

    names = target.host.listdir("/dev")
    return sum(1 for n in names if re.fullmatch(r"nvidia\d+", n)) if isinstance(names, list) else 1


def judge_deep(diagnosis) -> tuple[str, str]:
    """pass, or fail with every problem in one line, causes first: a cause the deep tier found during its own
    measurement (another process: its PID; a clock event; errors), a figure below its floor or not judged (a GPU
    another process holds: its PID), a GPU without one of REQUIRED_KINDS, any other failure the gate's deep_floors
    profile blocks on (gpudoctor.gate: one rule for what blocks)."""
    from gpudoctor.findings import Status
    from gpudoctor.gate import Profile, evaluate

    findings = list(diagnosis.findings)
    problems: dict[str, str] = {}  # finding key -> words, in order
    causes = [f for f in findings if f.id.startswith("fabric.deep.") and f.id != "fabric.deep.figure"
              and f.status in (Status.WARN, Status.FAIL)]
    rank = {cid: i for i, cid in enumerate(CAUSE_ORDER)}
    for f in sorted(causes, key=lambda f: rank.get(f.id, len(rank))):
        problems[f.key] = f.summary
    problems.update(_during(diagnosis, causes))
    gate = evaluate(diagnosis, Profile("verify", deep_floors=True))
    if gate.error:
        problems["(gate)"] = gate.error
    for b in gate.blockers:
        problems.setdefault(b.key, b.summary)
    figures = [f for f in findings if f.id == "fabric.deep.figure"]
    gpus: dict = {}
    for f in figures:
        gpu, kind = f.data.get("gpu"), f.data.get("kind")
        if gpu is None:
            continue
        g = gpus.setdefault(gpu, {"measured": set(), "said": set(), "backend": None})
        g["backend"] = g["backend"] or f.data.get("backend")
        if f.status in (Status.OK, Status.WARN):
            g["measured"].add(kind)
        elif f.key in problems:  # a figure the gate already blocks on (not measured, not judged): said once
            g["said"].add(kind)
    for gpu, g in sorted(gpus.items(), key=lambda kv: str(kv[0])):
        missing = [k for k in REQUIRED_KINDS if k not in g["measured"] | g["said"]]
        if missing:
            problems[f"missing[{gpu}]"] = (f"GPU {gpu}: {', '.join(KIND_WORDS[k] for k in missing)} not measured"
                                           f" (backend {g['backend'] or '?'})")
    if any(g["backend"] == "ctypes" and "gemm" not in g["measured"] for g in gpus.values()):
        problems["hint"] = ("the ctypes backend measures no GEMM: policy.verify.deep_python names a python with "
                            "torch")
    if not problems:
        judged = [f for f in figures if f.status == Status.OK]
        return PASS, f"{len(judged)} figures on {len(gpus)} GPU(s) at or above their floors"
    return FAIL, "; ".join(dict.fromkeys(problems.values()))


def _during(diagnosis, causes) -> dict:
    """Another process or a clock event during a measurement whose figure still met its floor: checks/bandwidth
    names a cause only for a figure below its floor; a verification wants the GPU alone and at full clocks all
    the same. Read from the deep tier's own samples (checks.bandwidth.analyse: what the cause findings read)."""
    from gpudoctor.catalog.deep_limits import SLOWING
    from gpudoctor.checks.bandwidth import analyse

    named = {(f.id, (f.subject or "").split(" (")[0]) for f in causes}
    out: dict = {}
    for g in analyse(diagnosis.facts or {}):
        idx = g["rec"].get("index")
        procs: dict = {}
        slowing: list = []
        for fig in g["figs"]:
            smp = (fig.get("test") or {}).get("samples") or {}
            for p in smp.get("procs") or []:
                procs.setdefault(p.get("pid"), p)
            slowing += [r for r in smp.get("reasons") or [] if r in SLOWING and r not in slowing]
        if procs and ("fabric.deep.contention", f"GPU {idx}") not in named:
            out[f"during-procs[{idx}]"] = (f"GPU {idx}: another process used the GPU during the measurement: "
                                           + ", ".join(f"pid {p.get('pid')} ({p.get('name') or '?'}, "
                                                       f"{p.get('used_mib')} MiB)" for p in procs.values()))
        if slowing and ("fabric.deep.clocks", f"GPU {idx}") not in named:
            out[f"during-clocks[{idx}]"] = (f"GPU {idx}: clocks held down by {', '.join(slowing)} during the "
                                            "measurement")
    return out


# --- the serving step -----------------------------------------------------------------------------------------------

def _serving_apply(target, policy: VerifyPolicy) -> str | None:
    if policy.serving == "off":
        return "serving smoke off (policy.verify.serving)"
    if policy.serving == "on" or getattr(target.entry, "serving", None) is not None:
        return None
    return "no serving endpoint in the inventory entry (serving: {url, model})"


def run_serving(target, policy: VerifyPolicy, budget_s: float, say: Callable[[str], None]) -> tuple[str, str]:
    """A short `bench load` through the bench client (gpudoctor.bench.client: its readiness probe, dialect
    detection, request bodies, stream parser and level runner): smoke_requests requests at once, smoke_max_tokens
    each (exactly, where the server takes ignore_eos), every one ok, the largest TTFT under smoke_ttft_ms_max. Runs
    in its own thread and event loop (the caller may have one), bounded by the time left."""
    import asyncio

    serving = getattr(target.entry, "serving", None)
    if serving is None:
        return FAIL, ("policy.verify.serving is on, but the inventory entry names no serving endpoint "
                      "(hosts.NAME.serving: {url, model})")
    loop = _loopback_from_afar(target, serving.url)
    if loop:
        return FAIL, loop
    owner = getattr(serving, "user", None)  # whose server answers: root's, serving.user's or a system unit's only
    before, why = trusted_listeners(target, serving.url, owner=owner)
    if why:
        return FAIL, why
    box: dict = {}

    def work():
        try:
            box["result"] = asyncio.run(_smoke(serving, policy, budget_s, say))
        except BaseException as exc:  # noqa: BLE001 - carried to the caller's thread
            box["error"] = exc

    th = threading.Thread(target=work, name="gpudoctor-verify-serving", daemon=True)
    th.start()
    th.join(budget_s + 5.0)  # the level has its own timeout (budget_s): this is the backstop
    if th.is_alive():
        return FAIL, f"{serving.url}: the smoke did not finish in {budget_s:.0f} s (policy.verify.timeout_s)"
    if "error" in box:
        raise box["error"]
    after, why = trusted_listeners(target, serving.url, owner=owner)  # the same server still, not one swapped in
    if why or after != before:
        return FAIL, why or (f"the listener on {serving.url} changed during the smoke (pids {_pids(before)} → "
                             f"{_pids(after)}): release does not trust its answers")
    return box["result"]


def _pids(listeners) -> str:
    return ", ".join(str(pid) for pid, _ in listeners or ()) or "none"


def _loopback_from_afar(target, url: str) -> str | None:
    """The smoke's requests go from where gpudoctor runs: a loopback URL of a host reached over SSH would test this
    machine instead (a wrong pass or a wrong fail), so it is refused with what to write instead."""
    import ipaddress
    from urllib.parse import urlsplit

    if not target.remote:
        return None
    host = (urlsplit(url).hostname or "").lower()
    try:
        loop = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loop = host == "localhost" or host.endswith(".localhost")
    if not loop:
        return None
    return (f"serving.url {url} is this machine's loopback, but {target.name} is reached over SSH: the smoke would "
            f"test this machine; give {target.name}'s address (or run the daemon on {target.name})")


async def _smoke(serving, policy: VerifyPolicy, budget_s: float, say) -> tuple[str, str]:
    from gpudoctor.bench.client.levels import dialect, ready_probe
    from gpudoctor.bench.client.load import LevelSpec, new_session, run_level
    from gpudoctor.bench.client.openai import EXTENDED, NATIVE, SGLANG
    from gpudoctor.bench.client.prompts import build, load_source
    from gpudoctor.bench.client.tokens import Counter
    from gpudoctor.bench.records.results import OK

    t0 = time.monotonic()
    url, api, k = serving.url, serving.api, policy.smoke_requests
    say(f"readiness of {url}")
    why = await ready_probe(url, max(1.0, min(30.0, budget_s / 3)), api, serving.model)
    if why:
        return FAIL, f"{url} is not serving {serving.model}: {why}"
    spec = LevelSpec(label="verify", workload=f"verify-smoke:out{policy.smoke_max_tokens}", concurrency=k,
                     max_tokens=policy.smoke_max_tokens, num_prompts=k, api=api,
                     model=None if api == NATIVE else serving.model, server_kind=SGLANG if api == NATIVE else None)
    if api != NATIVE:
        await dialect(url, [spec], lambda *a, **kw: None)
    prompts = build(k, load_source("builtin"), Counter(), None, seed=31)
    left = max(1.0, budget_s - (time.monotonic() - t0))
    results: list = []
    say(f"{k} requests of {policy.smoke_max_tokens} tokens to {url}")
    async with new_session(k) as session:
        rec = await run_level(session, url, spec, prompts, stall_s=min(left, 120.0), level_timeout_s=left,
                              on_request=results.append)
    where = f"{url} ({serving.model}, {api})"
    if rec.get("status") != OK or rec.get("error"):
        return FAIL, f"{where}: {rec.get('error') or rec.get('status')}"
    good = [r for r in results if r.ok]
    if len(good) != k:
        return FAIL, f"{where}: {len(good)} of {k} requests completed"
    exact = api == NATIVE or spec.server_kind in EXTENDED
    short = [r.output_tokens for r in good if r.output_tokens != policy.smoke_max_tokens]
    if exact and short:
        return FAIL, (f"{where}: {len(short)} of {k} requests produced {sorted(set(short))} tokens, not the "
                      f"{policy.smoke_max_tokens} asked for (ignore_eos)")
    ttft = [r.ttft_s * 1000 for r in good if r.ttft_s is not None]
    if len(ttft) != k:
        return FAIL, f"{where}: {k - len(ttft)} of {k} requests have no first-token time"
    worst = max(ttft)
    if worst > policy.smoke_ttft_ms_max:
        return FAIL, (f"{where}: TTFT max {worst:.0f} ms above the ceiling {policy.smoke_ttft_ms_max:g} ms "
                      f"(policy.verify.smoke_ttft_ms_max; p50 {sorted(ttft)[len(ttft) // 2]:.0f} ms)")
    tokens = sum(r.output_tokens for r in good)
    note = "" if exact or not short else (f"; {len(short)} ended before max_tokens (the server does not take "
                                           "ignore_eos)")
    return PASS, (f"{where}: {k} requests ok, {tokens} tokens ({rec.get('output_tokens_source') or 'exact'}), "
                  f"TTFT max {worst:.0f} ms of {policy.smoke_ttft_ms_max:g}{note}")


_STEPS = (
    ("deep", _deep_apply, run_deep),
    ("serving", _serving_apply, run_serving),
    ("commands", _commands_apply, run_commands),
)
