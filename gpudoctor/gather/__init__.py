"""Gather raw Facts once per host: one module per subsystem, run concurrently, every op under a deadline."""

from __future__ import annotations

import importlib
import time
from concurrent.futures import ThreadPoolExecutor

from gpudoctor.gather.context import GatherContext
from gpudoctor.host import Host

FACTS_SCHEMA = "gpudoctor.facts/1"

# facts key -> "module:function". Slow probes first so they start first.
SUBSYSTEMS = {
    "cuda": "gpudoctor.gather.cuda:gather",
    "driver": "gpudoctor.gather.driver:gather",
    "devices": "gpudoctor.gather.devices:gather",
    "host": "gpudoctor.gather.hostinfo:gather",
    "fabric": "gpudoctor.gather.fabric:gather",
    "workload": "gpudoctor.gather.workload:gather",
    "boundary": "gpudoctor.gather.boundary:gather",
    "platform": "gpudoctor.gather.platform:gather",
    "cdi": "gpudoctor.gather.cdi:gather",
    "oci": "gpudoctor.gather.oci:gather",
    "model": "gpudoctor.gather.model:gather",
    "deep": "gpudoctor.gather.deep:gather",
    "tools": "gpudoctor.gather.tools:gather",
    "kernel_log": "gpudoctor.gather.kernel_log:gather",
    "procs": "gpudoctor.gather.procs:gather",
}


def _load(target: str):
    mod, attr = target.split(":")
    try:
        return getattr(importlib.import_module(mod), attr)
    except ModuleNotFoundError as exc:
        if exc.name == mod:
            return None  # subsystem not installed in this build
        raise


def gather(host: Host, ctx: GatherContext | None = None, only: set[str] | None = None) -> dict:
    """Gather every subsystem's facts from `host` concurrently. A subsystem that crashes is recorded, not raised."""
    ctx = ctx or GatherContext(name=host.name)
    facts: dict = {"schema": FACTS_SCHEMA, "meta": {"host": ctx.name, "context": ctx.to_json(), "timings": {}}}
    todo = [k for k in SUBSYSTEMS if only is None or k in only]

    def one(key):
        # Each thread imports its own subsystem, so the slow probes (cuInit) start before the rest is even loaded.
        t0 = time.perf_counter()
        fn = _load(SUBSYSTEMS[key])
        if fn is None:
            return key, None, 0.0
        try:
            out = fn(host, ctx)
        except Exception as exc:  # noqa: BLE001 - a broken probe becomes "could not probe"
            if type(exc).__name__ in ("HostUnreachable", "HostKeyError"):
                raise
            out = {"error": f"{type(exc).__name__}: {exc}"}
        return key, out, time.perf_counter() - t0

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=len(todo) or 1) as pool:
        for key, out, dt in pool.map(one, todo):
            if out is None:
                continue
            facts[key] = out
            facts["meta"]["timings"][key] = round(dt, 4)
    facts["meta"]["timings"]["total"] = round(time.perf_counter() - t0, 4)
    from gpudoctor import log

    if log.enabled(1):
        lg = log.get_logger("gpudoctor.gather", host=ctx.name)
        for key, secs in facts["meta"]["timings"].items():
            lg.info("probe.finished", subsystem=key, seconds=secs, error=(facts.get(key) or {}).get("error"))
    facts["meta"]["gathered_at"] = time.time()
    return facts
