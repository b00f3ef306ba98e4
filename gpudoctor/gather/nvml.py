"""NVML's raw answers (host/nvml.py; the H200's nvml-dump.json has the same format) → the driver facts, in the shape
`parse_nvidia_smi_xml` gives (gather/driver.py): the same fields, the same values, in nvidia-smi's words ("Enabled",
"No", "None"). tests/core/test_nvml_facts.py holds every field the H200 capture has equal to nvidia-smi's.
"""

from __future__ import annotations

from gpudoctor.host.nvml import FI_RECOVERY_ACTION

# NVML clock-event bits (nvml.h nvmlClocksEventReason*) under the names nvidia-smi -q -x gives them.
REASONS = (("gpu_idle", 0x1), ("applications_clocks_setting", 0x2), ("sw_power_cap", 0x4), ("hw_slowdown", 0x8),
           ("sync_boost", 0x10), ("sw_thermal_slowdown", 0x20), ("hw_thermal_slowdown", 0x40),
           ("hw_power_brake_slowdown", 0x80), ("display_clocks_setting", 0x100))
# NVML_GPU_RECOVERY_ACTION_* → the text nvidia-smi prints (catalog/xid.py nvml_action reads either)
RECOVERY = {0: "None", 1: "GPU Reset", 2: "Node Reboot", 3: "Drain P2P", 4: "Drain and Reset",
            5: "Recover IMEX Domain", 6: "Bus Reset", 7: "System Reboot"}


# Each driver fact (a path in parse_nvidia_smi_xml's answer, GPU fields under gpus[]) and the NVML calls it comes from:
# what a comparison with nvidia-smi can hold (tests/core/test_nvml_facts.py, tools/h200_check_latency.sh).
FIELDS = {
    "driver_version": ("nvmlSystemGetDriverVersion",),
    "cuda_version": ("nvmlSystemGetCudaDriverVersion",),
    "attached_gpus": ("nvmlDeviceGetCount",),
    "gpus[].bus_id": ("nvmlDeviceGetPciInfo_v3",),
    "gpus[].name": ("nvmlDeviceGetName",),
    "gpus[].uuid": ("nvmlDeviceGetUUID",),
    "gpus[].minor": ("nvmlDeviceGetMinorNumber",),
    "gpus[].persistence_mode": ("nvmlDeviceGetPersistenceMode",),
    "gpus[].pcie.gen_max": ("nvmlDeviceGetMaxPcieLinkGeneration",),
    "gpus[].pcie.gen_current": ("nvmlDeviceGetCurrPcieLinkGeneration",),
    "gpus[].pcie.width_max": ("nvmlDeviceGetMaxPcieLinkWidth",),
    "gpus[].pcie.width_current": ("nvmlDeviceGetCurrPcieLinkWidth",),
    "gpus[].ecc_mode": ("nvmlDeviceGetEccMode",),
    "gpus[].ecc_volatile_uncorrectable": ("nvmlDeviceGetTotalEccErrors(1, 0)",),
    "gpus[].remapped_rows.pending": ("nvmlDeviceGetRemappedRows",),
    "gpus[].remapped_rows.failure": ("nvmlDeviceGetRemappedRows",),
    "gpus[].remapped_rows.uncorrectable": ("nvmlDeviceGetRemappedRows",),
    "gpus[].clock_event_reasons": ("nvmlDeviceGetCurrentClocksEventReasons",),
    "gpus[].memory_total_mib": ("nvmlDeviceGetMemoryInfo_v2",),
    "gpus[].memory_used_mib": ("nvmlDeviceGetMemoryInfo_v2",),
    "gpus[].numa_node": ("nvmlDeviceGetNumaNodeId",),
    "gpus[].recovery_action": (f"nvmlDeviceGetFieldValues({FI_RECOVERY_ACTION},)",),
    "gpus[].processes": ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"),
}


def fact(facts: dict, path: str, gpu: int = 0):
    """The value at FIELDS path `path` (GPU `gpu` for gpus[] paths)."""
    cur = facts
    for part in path.split("."):
        if part == "gpus[]":
            cur = (cur.get("gpus") or [None] * (gpu + 1))[gpu]
        else:
            cur = cur.get(part) if isinstance(cur, dict) else None
    return cur



def _v(d: dict, *keys, kind=None):
    """The value of the first call among `keys` that answered (the dump names some calls without their _vN); None
    when it is not of `kind` (a snapshot is input: a wrong type is no answer, never a traceback)."""
    if not isinstance(d, dict):
        return None
    for k in keys:
        rec = d.get(k)
        if isinstance(rec, dict) and "value" in rec:
            v = rec["value"]
            return v if kind is None or (isinstance(v, kind) and not isinstance(v, bool)) else None
    return None


def usable(raw) -> str | None:
    """None when the answer can stand for nvidia-smi's; else why not (then nvidia-smi answers)."""
    if not isinstance(raw, dict):
        return "no NVML answer"
    if raw.get("timed_out"):
        return f"NVML did not answer in {raw.get('timeout_s')} s"
    if raw.get("error"):
        return f"NVML: {raw['error']}" + (f" ({raw['message']})" if raw.get("message") else "")
    if _v(raw.get("system"), "nvmlSystemGetDriverVersion", kind=str) is None:
        return "NVML gave no driver version"
    for i, dev in enumerate(raw.get("devices") or []):
        if _v(dev, "nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetPciInfo", kind=dict) is None:
            err = (dev.get("nvmlDeviceGetHandleByIndex") or {}).get("error") or "no PCI info"
            return f"NVML GPU {i}: {err}"
    return None


def _cuda(v) -> str | None:
    return None if not isinstance(v, int) else f"{v // 1000}.{v % 1000 // 10}"


def _yes(v) -> str | None:
    return None if v is None else ("Yes" if v else "No")


def _enabled(v) -> str | None:
    return None if v is None else ("Enabled" if v else "Disabled")


def parse_gpu(dev: dict) -> dict:
    pci = _v(dev, "nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetPciInfo", kind=dict) or {}
    bus = pci.get("busId") if isinstance(pci.get("busId"), str) else None
    ecc = _v(dev, "nvmlDeviceGetEccMode", kind=list)
    rows = _v(dev, "nvmlDeviceGetRemappedRows", kind=list)
    mask = _v(dev, "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons", kind=int)
    mem = _v(dev, "nvmlDeviceGetMemoryInfo_v2", kind=dict) or {}
    fv = _v(dev, f"nvmlDeviceGetFieldValues({FI_RECOVERY_ACTION},)", kind=list)
    action = None
    if fv and isinstance(fv[0], dict) and fv[0].get("nvmlReturn") == 0 and isinstance(fv[0].get("value"), int):
        action = RECOVERY.get(fv[0]["value"], str(fv[0]["value"]))
    procs: dict = {}  # nvidia-smi lists a process once: type C, G or C+G
    names = _v(dev, "nvmlSystemGetProcessName", kind=dict) or {}
    for kind, call in (("C", "nvmlDeviceGetComputeRunningProcesses"), ("G", "nvmlDeviceGetGraphicsRunningProcesses")):
        for p in _v(dev, call, call + "_v3", kind=list) or []:
            if not isinstance(p, dict) or not isinstance(p.get("pid"), int):
                continue
            used = p.get("usedGpuMemory")
            used = used if isinstance(used, int) else None
            rec = procs.setdefault(p.get("pid"), {"pid": p.get("pid"), "type": None,
                                                  "name": _v(names, str(p.get("pid")), kind=str),
                                                  "used_mib": None if used is None else used >> 20})
            rec["type"] = kind if rec["type"] is None else rec["type"] + "+" + kind
    return {
        "bus_id": bus,
        "name": _v(dev, "nvmlDeviceGetName", kind=str),
        "uuid": _v(dev, "nvmlDeviceGetUUID", kind=str),
        "minor": _v(dev, "nvmlDeviceGetMinorNumber", kind=int),
        "persistence_mode": _enabled(_v(dev, "nvmlDeviceGetPersistenceMode", kind=int)),
        "pcie": {
            "gen_max": _v(dev, "nvmlDeviceGetMaxPcieLinkGeneration", kind=int),
            "gen_current": _v(dev, "nvmlDeviceGetCurrPcieLinkGeneration", kind=int),
            "width_max": _v(dev, "nvmlDeviceGetMaxPcieLinkWidth", kind=int),
            "width_current": _v(dev, "nvmlDeviceGetCurrPcieLinkWidth", kind=int),
        },
        "ecc_mode": _enabled(ecc[0]) if ecc else None,
        "ecc_volatile_uncorrectable": _v(dev, "nvmlDeviceGetTotalEccErrors(1, 0)", kind=int),
        "remapped_rows": {
            "pending": _yes(rows[2]) if rows and len(rows) == 4 else None,
            "failure": _yes(rows[3]) if rows and len(rows) == 4 else None,
            "uncorrectable": rows[1] if rows and len(rows) == 4 else None,
        },
        "clock_event_reasons": {} if mask is None else {name: bool(mask & bit) for name, bit in REASONS},
        "memory_total_mib": mem["total"] >> 20 if isinstance(mem.get("total"), int) else None,
        "memory_used_mib": mem["used"] >> 20 if isinstance(mem.get("used"), int) else None,
        "numa_node": _v(dev, "nvmlDeviceGetNumaNodeId", kind=int),
        "recovery_action": action,
        "processes": list(procs.values()),
    }


def facts_from_nvml(raw: dict) -> dict:
    """The driver facts from NVML's answers (call `usable` first)."""
    sysd = raw.get("system") or {}
    gpus = [parse_gpu(d) for d in raw.get("devices") or []]
    count = _v(sysd, "nvmlDeviceGetCount", kind=int)
    return {"driver_version": _v(sysd, "nvmlSystemGetDriverVersion", kind=str),
            "cuda_version": _cuda(_v(sysd, "nvmlSystemGetCudaDriverVersion", "nvmlSystemGetCudaDriverVersion_v2",
                                     kind=int)),
            "attached_gpus": count if count is not None else len(gpus), "gpus": gpus}
