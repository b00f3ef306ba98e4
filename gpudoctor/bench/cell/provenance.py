"""What produced a record (its `provenance` section): the server (engine, version, model, launch flags), the GPUs
(name, driver, CUDA, PCIe link, clocks, enforced power limit and clock-event reasons at the level's start and end —
from the level's own host-health sampling, gpudoctor.bench.cell.health, not a second NVML reader), the server's NUMA
placement, gpudoctor's own check verdict before the level, the campaign file's hash, and gpudoctor's version.

Server: SGLang's /server_info (version, model_path, tp_size and its other arguments), vLLM's /version and
/v1/models (model, max_model_len), any OpenAI server's /v1/models (owned_by names transformers serve); the launch
command where gpudoctor started the server (a campaign). What cannot be read says so ("unknown" with why).
"""

from __future__ import annotations

import asyncio
import hashlib
import os

_SGLANG_FLAGS = ("model_path", "tp_size", "dp_size", "speculative_algorithm", "speculative_num_draft_tokens",
                 "max_running_requests", "context_length", "enable_metrics", "mem_fraction_static",
                 "chunked_prefill_size",
                 "attention_backend", "kv_cache_dtype", "dtype", "quantization")


async def _get(base_url: str, path: str, timeout: float):
    import aiohttp

    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as s:
            async with s.get(base_url + path) as resp:
                if resp.status != 200:
                    return None
                return await resp.json(content_type=None)
    except (asyncio.TimeoutError, aiohttp.ClientError, ValueError):
        return None


async def server(base_url: str, timeout: float = 5.0) -> dict:
    """The engine, its version, model and the flags it reports, from its own endpoints."""
    out: dict = {"url": base_url}
    info = await _get(base_url, "/server_info", timeout) or await _get(base_url, "/get_server_info", timeout)
    if isinstance(info, dict) and info:
        out["engine"] = "sglang"
        out["version"] = info.get("version")
        out["model"] = info.get("served_model_name") or info.get("model_path")
        out["flags"] = {k: info[k] for k in _SGLANG_FLAGS if info.get(k) is not None}
        extra = (info.get("standin") or {}).get("extra_args") if isinstance(info.get("standin"), dict) else None
        if extra:
            out["flags"]["extra_args"] = extra
        out["source"] = "/server_info"
    ver = await _get(base_url, "/version", timeout)
    if isinstance(ver, dict) and ver.get("version") and "engine" not in out:
        out["engine"], out["version"], out["source"] = "vllm", ver["version"], "/version"
    models = await _get(base_url, "/v1/models", timeout)
    cards = models.get("data") if isinstance(models, dict) and isinstance(models.get("data"), list) else []
    if cards and isinstance(cards[0], dict):
        c = cards[0]
        out.setdefault("model", c.get("id"))
        out["owned_by"] = c.get("owned_by")
        if c.get("max_model_len"):
            out.setdefault("flags", {})["max_model_len"] = c["max_model_len"]
        if "engine" not in out and c.get("owned_by") == "vllm":
            out["engine"] = "vllm"
        out.setdefault("source", "/v1/models")
    if "engine" not in out:
        out["engine"] = "unknown"
        out["why"] = ("the server answers none of /server_info, /version; its /v1/models "
                      + ("lists no model" if not cards else f"says owned_by {cards[0].get('owned_by')!r}"))
    return out


def command_of(pid: int) -> list[str] | None:
    """A local process's command line (/proc/PID/cmdline): the server's launch flags for `bench load --server-pid`."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = [a.decode(errors="replace") for a in fh.read().split(b"\0") if a]
    except OSError:
        return None
    return argv[:200] or None


def engine_from_command(argv) -> str | None:
    """The engine a launch command names: sglang, vllm or transformers (serve)."""
    text = " ".join(str(a) for a in argv or [])
    for name, marks in (("sglang", ("sglang",)), ("vllm", ("vllm",)), ("transformers", ("transformers", " serve"))):
        if all(m in text for m in marks):
            return name
    return None


def numa(pids) -> dict:
    """The NUMA node(s) the server's processes may run on (their CPU affinity, against
    /sys/devices/system/node/node*/cpulist); "unknown" where it cannot be read from here."""
    if not pids:
        return {"status": "unknown",
                "why": "the server's processes are not known here (bench load without --server-pid, or a remote target)"}
    nodes = _node_cpus()
    if not nodes:
        return {"status": "unknown", "why": "no /sys/devices/system/node here"}
    seen, read = set(), []
    for pid in sorted(pids)[:64]:
        try:
            cpus = os.sched_getaffinity(pid)
        except OSError:
            continue
        read.append(pid)
        seen.update(n for n, cs in nodes.items() if cpus & cs)
    if not read:
        return {"status": "unknown", "why": "the server's processes could not be read"}
    return {"status": "read", "nodes": sorted(seen), "of": len(nodes), "pids": len(read)}


def _node_cpus() -> dict[int, set[int]]:
    base = "/sys/devices/system/node"
    out = {}
    try:
        names = os.listdir(base)
    except OSError:
        return {}
    for n in names:
        if not (n.startswith("node") and n[4:].isdigit()):
            continue
        try:
            with open(f"{base}/{n}/cpulist", encoding="ascii") as fh:
                out[int(n[4:])] = _cpulist(fh.read())
        except (OSError, ValueError):
            continue
    return out


def _cpulist(text: str) -> set[int]:
    out = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def gpu(host_health: dict | None) -> dict:
    """The GPU part, from the level's host_health section: what NVML said at the level's start and end."""
    h = host_health or {}
    if h.get("status") != "sampled":
        return {"status": "unknown", "why": h.get("reason") or "the GPUs were not sampled"}
    gpus = h.get("gpus") or {}
    per = {}
    for i, g in gpus.items():
        per[i] = {"name": g.get("name"), "bus_id": g.get("bus_id"),
                  "pcie": (None if g.get("pcie_gen") is None else
                           f"gen{g.get('pcie_gen')} x{g.get('pcie_width')} (max gen{g.get('pcie_gen_max')} "
                           f"x{g.get('pcie_width_max')})"),
                  "start": g.get("start"), "end": g.get("end")}
    first = next(iter(per.values()), {})
    limits = sorted({(g.get("start") or {}).get("power_limit_w") for g in per.values()} - {None})
    return {"status": "read", "count": len(per), "name": first.get("name"), "driver": h.get("driver"),
            "cuda": h.get("cuda"), "pcie": first.get("pcie"),
            "power_limit_w": limits[0] if len(limits) == 1 else limits or None, "gpus": per}


def file_sha256(path: str | None) -> str | None:
    if not path:
        return None
    try:
        with open(path, "rb") as fh:
            return hashlib.sha256(fh.read()).hexdigest()
    except OSError:
        return None


def gpudoctor_version() -> str:
    try:
        from importlib.metadata import version

        return version("gpudoctor")
    except Exception:  # not installed as a distribution (a source checkout on sys.path)
        return "unknown"
