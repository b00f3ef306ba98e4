"""Boundary layer, Kubernetes node: the NVIDIA device plugin's registration with the kubelet, gpu-operator's
validations (/run/nvidia/validations/*-ready), and the CDI specs the plugin hands out — set against what gpudoctor
itself saw. The validator can say ready while nvidia-uvm is missing (NVIDIA/gpu-operator#2685). No cluster API is used.
"""

from gpudoctor.checkreg import check
from gpudoctor.checks.cdi import parsed
from gpudoctor.findings import Finding, Status
from gpudoctor.gather.platform import DEVICE_PLUGIN_DIR, VALIDATIONS_DIR


@check("boundary.k8s.device_plugin",
       depends_on=("host.*", "driver.*", "devices.*", "cuda.init", "boundary.cdi.*", "boundary.container.*"),
       summary="On a Kubernetes node: the NVIDIA device plugin and gpu-operator's validations agree with what works.")
def device_plugin(facts):
    """'Ready' from the operator's validator is its own view; a failing cuInit or a missing uvm node here says otherwise."""
    dp = (facts.get("platform") or {}).get("device_plugin") or {}
    socks = [n for n in dp.get("dir") or [] if isinstance(dp.get("dir"), list) and n.startswith("nvidia")]
    vals = dp.get("validations") if isinstance(dp.get("validations"), dict) else {}
    if not socks and not vals:
        return None
    ev = [f"{DEVICE_PLUGIN_DIR}: {', '.join(socks) or 'no NVIDIA plugin socket'}"]
    ready = sorted(n for n in vals if n.endswith("-ready"))
    if vals:
        ev.append(f"{VALIDATIONS_DIR}: {', '.join(sorted(vals))}")
    specs, _ = parsed(facts)
    used = [s for s in specs if s.kind and s.kind.startswith(("nvidia.com/", "k8s.device-plugin.nvidia.com/"))]
    ev += [f"CDI spec {s.path}: {s.kind}, devices {', '.join(s.devices) or 'none'}" for s in used]
    cuda = facts.get("cuda") or {}
    nodes = (facts.get("devices") or {}).get("nodes") or {}
    uvm = nodes.get("/dev/nvidia-uvm") or {}
    wrong = []
    if cuda.get("cuinit") not in (None, 0):
        wrong.append(f"cuInit(0) → {cuda['cuinit']}")
    if "devices" in facts and not uvm.get("exists"):
        wrong.append("/dev/nvidia-uvm is missing")
    cp = dp.get("checkpoint") or {}
    gpu_res = {k: v for k, v in (cp.get("registered") or {}).items() if k.startswith("nvidia.com/")}
    if gpu_res:
        ev.append("kubelet checkpoint: " + "; ".join(f"{k} registered {len(v)}" for k, v in gpu_res.items()))
        uuids = [g.get("uuid") for g in (facts.get("driver") or {}).get("gpus") or [] if g.get("uuid")]
        offered = {i for v in gpu_res.values() for i in v}
        absent = [u for u in uuids if u not in offered and not any(i.startswith(u) for i in offered)]
        if absent and "nvidia.com/gpu" in gpu_res:
            wrong.append(f"the device plugin does not offer {', '.join(absent)} (unhealthy or not registered), "
                         f"though NVML sees {len(uuids)} GPU(s)")
    elif cp.get("error"):
        ev.append(f"kubelet checkpoint: {cp['error']}")
    if wrong and (ready or gpu_res):
        return Finding("boundary.k8s.device_plugin", Status.WARN,
                       (f"gpu-operator's validations say ready ({', '.join(ready)}) but " if ready else
                        "the NVIDIA device plugin's view disagrees: ") + "; ".join(wrong),
                       evidence=ev + wrong,
                       hint="Do not trust the validator's Ready alone (gpu-operator#2685): fix the cause gpudoctor names, "
                            "then restart the validator and device-plugin pods on this node so they re-check.",
                       data={"sockets": socks, "ready": ready})
    return Finding("boundary.k8s.device_plugin", Status.INFO,
                   f"NVIDIA device plugin on this node: {', '.join(socks) or 'not registered'}"
                   + (f"; validations: {', '.join(ready)}" if ready else ""), evidence=ev,
                   data={"sockets": socks, "ready": ready, "cdi_specs": [s.path for s in used]})
