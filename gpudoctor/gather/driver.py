"""Driver layer facts: NVML read in process under a deadline where the host can (a live local check: host/nvml.py,
parsed by gather/nvml.py), else — and whenever NVML did not answer fully — `nvidia-smi -q -x` (a subprocess with a
deadline: a hung NVML never hangs us). Both give the same facts; `source` says which answered."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from gpudoctor.gather.context import GatherContext
from gpudoctor.host import Host

NVIDIA_SMI = ["nvidia-smi", "-q", "-x"]


def _t(el, path, default=None):
    x = el.find(path)
    return x.text.strip() if x is not None and x.text is not None else default


def _int(s):
    if s is None:
        return None
    m = re.match(r"^\s*(-?\d+)", s)
    return int(m.group(1)) if m else None


def parse_gpu(g) -> dict:
    """One <gpu> element → the fields the driver checks need."""
    reasons = {}
    for tag in ("clocks_event_reasons", "clocks_throttle_reasons"):
        node = g.find(tag)
        if node is not None:
            for child in node:
                name = re.sub(r"^clocks_(event|throttle)_reasons?_", "", child.tag)
                reasons[name] = (child.text or "").strip() == "Active"
    vol = g.find("ecc_errors/volatile")
    unc = 0
    if vol is not None:
        for child in vol:
            if "uncorrectable" in child.tag and (v := _int(child.text)) is not None:
                unc += v
    return {
        "bus_id": g.get("id"),
        "name": _t(g, "product_name"),
        "uuid": _t(g, "uuid"),
        "minor": _int(_t(g, "minor_number")),
        "persistence_mode": _t(g, "persistence_mode"),
        "pcie": {
            "gen_max": _int(_t(g, "pci/pci_gpu_link_info/pcie_gen/max_link_gen")),
            "gen_current": _int(_t(g, "pci/pci_gpu_link_info/pcie_gen/current_link_gen")),
            "width_max": _int(_t(g, "pci/pci_gpu_link_info/link_widths/max_link_width")),
            "width_current": _int(_t(g, "pci/pci_gpu_link_info/link_widths/current_link_width")),
        },
        "ecc_mode": _t(g, "ecc_mode/current_ecc"),
        "ecc_volatile_uncorrectable": unc if vol is not None else None,
        "remapped_rows": {
            "pending": _t(g, "remapped_rows/remapped_row_pending"),
            "failure": _t(g, "remapped_rows/remapped_row_failure"),
            "uncorrectable": _int(_t(g, "remapped_rows/remapped_row_unc")),
        },
        "clock_event_reasons": reasons,
        "memory_total_mib": _int(_t(g, "fb_memory_usage/total")),
        "memory_used_mib": _int(_t(g, "fb_memory_usage/used")),
        "numa_node": _int(_t(g, "numa_node")),
        "recovery_action": _t(g, "gpu_recovery_action"),
        "processes": [{"pid": _int(_t(p, "pid")), "type": _t(p, "type"), "name": _t(p, "process_name"),
                       "used_mib": _int(_t(p, "used_memory"))} for p in g.findall("processes/process_info")],
    }


def parse_nvidia_smi_xml(text: str) -> dict:
    """The whole `nvidia-smi -q -x` document → driver/cuda versions and one dict per GPU."""
    root = ET.fromstring(text)
    return {
        "driver_version": _t(root, "driver_version"),
        "cuda_version": _t(root, "cuda_version"),
        "attached_gpus": _int(_t(root, "attached_gpus")),
        "gpus": [parse_gpu(g) for g in root.findall("gpu")],
    }


def gather(host: Host, ctx: GatherContext) -> dict:
    raw = host.nvml(ctx.timeout)
    fallback = None
    if raw is not None:
        from gpudoctor.gather.nvml import facts_from_nvml, usable

        if raw.get("timed_out"):  # a wedged driver: nvidia-smi would hang as long again
            return {"source": "nvml", "command": "NVML in process", "rc": None, "timed_out": True,
                    "timeout_s": raw.get("timeout_s"), "duration_s": round((raw.get("ms") or 0) / 1e3, 4), "stderr": ""}
        fallback = usable(raw)
        if fallback is None:
            ver = ((raw.get("system") or {}).get("nvmlSystemGetNVMLVersion") or {}).get("value")
            return {"source": "nvml", "command": "NVML in process" + (f" (NVML {ver})" if ver else ""), "rc": 0,
                    "timed_out": False, "timeout_s": ctx.timeout, "duration_s": round((raw.get("ms") or 0) / 1e3, 4),
                    "stderr": "", **facts_from_nvml(raw)}
    res = host.run(NVIDIA_SMI, timeout=ctx.timeout)
    out = {"source": "nvidia-smi", "command": res.cmdline, "rc": res.rc, "timed_out": res.timed_out,
           "timeout_s": res.timeout_s, "duration_s": round(res.duration_s, 4),
           "stderr": (res.stderr.strip() or res.stdout.strip())[:500] if not res.ok else ""}
    if fallback:
        out["nvml_fallback"] = fallback  # why NVML in process did not answer (nvidia-smi's exit code names it)
    if res.ok:
        # nvidia-smi may print a DOCTYPE line; ElementTree ignores it. Bad XML is its own finding.
        try:
            out.update(parse_nvidia_smi_xml(res.stdout))
        except ET.ParseError as exc:
            out["parse_error"] = str(exc)
    return out


def compare(raw: dict, xml: str) -> list[dict]:
    """Every FIELDS path of every GPU: NVML's value, nvidia-smi's, equal or not, and whether NVML's answer holds the
    calls it needs (`captured`: False where a dump never asked them)."""
    from gpudoctor.gather.nvml import FIELDS, fact, facts_from_nvml

    a, b = facts_from_nvml(raw), parse_nvidia_smi_xml(xml)
    out = []
    for gi in range(max(len(a["gpus"]), len(b["gpus"]), 1)):
        dev = (raw.get("devices") or [{}] * (gi + 1))[gi] if gi < len(raw.get("devices") or []) else {}
        for path, calls in FIELDS.items():
            if not path.startswith("gpus[]") and gi:
                continue
            where = raw.get("system") or {} if not path.startswith("gpus[]") else dev
            captured = all(c in where for c in calls) or (path == "attached_gpus" and bool(raw.get("devices")))
            va, vb = fact(a, path, gi), fact(b, path, gi)
            out.append({"field": path.replace("[]", f"[{gi}]"), "nvml": va, "nvidia_smi": vb, "equal": va == vb,
                        "captured": captured})
    return out
