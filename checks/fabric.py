"""Fabric layer: PCIe MaxPayload/MaxReadReq against policy, NUMA placement, numa_balancing, topology, NCCL env."""

import re

from gpudoctor.checkreg import check
from gpudoctor.findings import Finding, Status
from gpudoctor.gather.fabric import tp_groups


def _fab(facts):
    f = facts.get("fabric")
    return f if f and "gpus" in f else None


def _policy(facts):
    return ((facts.get("meta") or {}).get("context") or {}).get("policy") or {}


@check("fabric.pcie.mrrs", summary="PCIe MaxReadReq/MaxPayload decoded from config space, audited against policy.",
       remedy="fabric.pcie.mrrs")
def mrrs(facts):
    """No NVIDIA document recommends a value, so by default this only reports; set policy pcie.mrrs to audit."""
    fab = _fab(facts)
    if fab is None:
        return None
    want = (_policy(facts).get("pcie") or {}).get("mrrs")
    out = []
    for g in fab["gpus"]:
        p, subj = g.get("pcie") or {}, g["bdf"]
        if not p.get("readable"):
            st = Status.UNKNOWN if want else Status.INFO
            out.append(Finding("fabric.pcie.mrrs", st, f"{subj}: config space not readable here "
                               f"({p.get('bytes')} bytes; needs CAP_SYS_ADMIN in the initial namespace)", subject=subj,
                               evidence=[f"/sys/bus/pci/devices/{subj}/config → {p.get('bytes')} bytes (< 256)"],
                               hint="Run the check on the host (a short read is not a value)."))
            continue
        if not p.get("found"):
            out.append(Finding("fabric.pcie.mrrs", Status.INFO, f"{subj}: no PCI Express capability", subject=subj))
            continue
        ev = [f"config space CAP_EXP@{p['cap_offset']:#x}: DevCtl {p['devctl']:#06x} → MaxPayload {p['mps']} "
              f"(supports {p['mps_supported']}), MaxReadReq {p['mrrs']}"]
        if want and p["mrrs"] != want:
            out.append(Finding("fabric.pcie.mrrs", Status.WARN, f"{subj}: MaxReadReq {p['mrrs']} ≠ policy {want}",
                               subject=subj, evidence=ev + [f"policy pcie.mrrs = {want}"],
                               data={"mrrs": p["mrrs"], "want": want}))
        else:
            st = Status.OK if want else Status.INFO
            out.append(Finding("fabric.pcie.mrrs", st, f"{subj}: MaxReadReq {p['mrrs']}, MaxPayload {p['mps']}",
                               subject=subj, evidence=ev, data={"mrrs": p["mrrs"], "mps": p["mps"]}))
    return out


@check("fabric.numa.gpu_node", summary="NUMA node and local CPUs of each GPU (for pinning servers and TP groups).")
def numa_node(facts):
    """numa_node -1 means the platform does not say (VMs): information, not a failure."""
    fab = _fab(facts)
    if fab is None:
        return None
    out = []
    for g in fab["gpus"]:
        node = g.get("numa_node")
        ev = [f"/sys/bus/pci/devices/{g['bdf']}/numa_node = {node}", f"local_cpulist = {g.get('local_cpulist')}"]
        if node in (None, "-1"):
            out.append(Finding("fabric.numa.gpu_node", Status.INFO, f"{g['bdf']}: platform reports no NUMA node",
                               subject=g["bdf"], evidence=ev))
        else:
            out.append(Finding("fabric.numa.gpu_node", Status.INFO, f"{g['bdf']}: NUMA node {node}, CPUs "
                               f"{g.get('local_cpulist')}", subject=g["bdf"], evidence=ev, data={"node": int(node)}))
    return out


@check("fabric.numa.balancing", summary="Automatic NUMA balancing is off (recommended for GPU serving).",
       remedy="fabric.numa.balancing")
def balancing(facts):
    """Page migration by numa_balancing adds latency spikes to pinned GPU servers."""
    fab = _fab(facts)
    if fab is None:
        return None
    v = fab.get("numa_balancing")
    ev = [f"/proc/sys/kernel/numa_balancing = {v}"]
    if v is None:
        return Finding("fabric.numa.balancing", Status.INFO, "numa_balancing not present on this kernel", evidence=ev)
    if v == "0":
        return Finding("fabric.numa.balancing", Status.OK, "numa_balancing is off", evidence=ev)
    nodes = len(fab.get("numa_nodes") or {})
    st = Status.WARN if nodes > 1 else Status.INFO
    return Finding("fabric.numa.balancing", st, f"numa_balancing is {'on' if v == '1' else 'tiering (2)'} "
                   f"on a {nodes}-node machine", evidence=ev, hint="sysctl kernel.numa_balancing=0 "
                   "(and a file in /etc/sysctl.d to keep it)")


@check("fabric.topo.cross_numa", summary="GPU pairs whose path crosses the NUMA interconnect (SYS), for TP placement.")
def cross_numa(facts):
    """A TP group spanning SYS pairs pays cross-socket latency; prefer groups inside one NUMA node."""
    fab = _fab(facts)
    if fab is None:
        return None
    topo = fab.get("topo") or {}
    if topo.get("error") or not topo.get("gpus"):
        return None
    gpus = topo["gpus"]
    sys_pairs = sorted({tuple(sorted(k.split("-"))) for k, v in topo["pairs"].items() if v == "SYS"})
    if len(gpus) < 2:
        return Finding("fabric.topo.cross_numa", Status.INFO, "Single GPU: no GPU pairs",
                       evidence=[topo.get("skipped") or "nvidia-smi topo -m"])
    groups: dict = {}
    for g, a in (topo.get("affinity") or {}).items():
        groups.setdefault(a.get("numa"), []).append(g)
    ev = [f"nvidia-smi topo -m: {len(sys_pairs)} of {len(gpus) * (len(gpus) - 1) // 2} pairs are SYS"]
    ev += [f"NUMA {n}: {', '.join(gs)}" for n, gs in sorted(groups.items(), key=lambda x: str(x[0]))]
    if sys_pairs:
        return Finding("fabric.topo.cross_numa", Status.INFO, f"{len(sys_pairs)} GPU pair(s) cross NUMA nodes: "
                       "keep TP groups inside one node where they fit", evidence=ev,
                       data={"sys_pairs": [list(p) for p in sys_pairs], "numa_groups": groups})
    return Finding("fabric.topo.cross_numa", Status.OK, "No GPU pair crosses NUMA nodes", evidence=ev)


_P2P_LEVELS = {"LOC", "NVL", "PIX", "PXB", "PHB", "SYS", "0", "1", "2", "3", "4", "5"}
_BOOL = {"0", "1"}


@check("fabric.nccl.env", summary="NCCL_* environment values are valid (a wrong P2P level can deadlock).")
def nccl_env(facts):
    """Typos in NCCL variables are silently ignored by NCCL; invalid P2P levels change paths unexpectedly."""
    fab = _fab(facts)
    if fab is None:
        return None
    env = fab.get("env") or {}
    nccl = {k: v for k, v in env.items() if k.startswith("NCCL_")}
    bad = []
    if (v := nccl.get("NCCL_P2P_LEVEL")) is not None and v.upper() not in _P2P_LEVELS:
        bad.append(f"NCCL_P2P_LEVEL={v} (valid: LOC, NVL, PIX, PXB, PHB, SYS)")
    for k in ("NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_IB_DISABLE", "NCCL_NVLS_ENABLE"):
        if (v := nccl.get(k)) is not None and v not in _BOOL:
            bad.append(f"{k}={v} (valid: 0 or 1)")
    known = re.compile(r"^NCCL_(P2P_|SHM_|IB_|NVLS_|SOCKET_|DEBUG|ALGO|PROTO|NET|BUFFSIZE|NTHREADS|MIN_|MAX_|CUMEM|"
                       r"TOPO|GRAPH|COLLNET|LAUNCH|CHECK|ASYNC|VERSION|HOME|RAS|CROSS_NIC|TUNER|PXN|RUNTIME|"
                       r"WORK_FIFO|NCHANNELS|LL|COMM|IGNORE|NVB|SET_|DMABUF|MNNVL|BLOCKING|GDR|CONF|TIMEOUT)")
    unknown = sorted(k for k in nccl if not known.match(k))
    ev = [f"{k}={v}" for k, v in sorted(nccl.items())] or ["no NCCL_* variables set"]
    if bad:
        return Finding("fabric.nccl.env", Status.WARN, "Invalid NCCL settings: " + "; ".join(bad), evidence=ev)
    if unknown:
        return Finding("fabric.nccl.env", Status.INFO, f"Unrecognised NCCL variables (typo?): {', '.join(unknown)}",
                       evidence=ev)
    return Finding("fabric.nccl.env", Status.OK, "NCCL environment is valid" if nccl else "No NCCL overrides",
                   evidence=ev)


@check("fabric.topo.tp_groups", summary="Which GPU sets to use for each tensor-parallel size (inside one NUMA node / "
       "NVLink domain when they fit).")
def tp_advice(facts):
    """TP all-reduce pays the worst link in the group: a TP4 group inside one socket beats one spanning two."""
    fab = _fab(facts)
    topo = (fab or {}).get("topo") or {}
    gpus = topo.get("gpus") or []
    if len(gpus) < 2:
        return None
    sizes = (_policy(facts).get("tp_sizes")) or [s for s in (2, 4, 8) if s <= len(gpus)]
    ev, data = [], {}
    crosses = []
    for s in sizes:
        gs = tp_groups(topo, s)
        data[str(s)] = gs
        for g in gs:
            ev.append(f"TP{s}: {','.join(x[3:] for x in g['gpus'])} — worst link {g['worst_link']}, "
                      f"NUMA {'+'.join(g['numa_nodes'])}")
            if len(g["numa_nodes"]) > 1:
                crosses.append(s)
    st = Status.INFO
    summary = ("TP groups fit inside one NUMA node" if not crosses else
               f"TP{min(crosses)}+ groups must span NUMA nodes (expect cross-socket all-reduce latency)")
    return Finding("fabric.topo.tp_groups", st, summary, evidence=ev,
                   hint="Pin each server to one group with CUDA_VISIBLE_DEVICES and numactl --cpunodebind.",
                   data={"groups": data})


@check("fabric.nccl.allreduce", summary="Deep tier (--deep): NCCL all-reduce bus bandwidth of each candidate TP group.",
       depends_on=("host.driver.loaded", "host.uvm.loaded", "driver.nvml.init", "cuda.init", "cuda.device_count"))
def allreduce(facts):
    """Measured with torch.distributed (NVLS off); a group far below its peers has a bad link or placement."""
    deep = facts.get("deep") or {}
    groups = deep.get("groups")
    if groups is None:
        return None  # the deep tier was not asked for
    if not groups:
        return Finding("fabric.nccl.allreduce", Status.UNKNOWN, "Deep tier asked for, but no GPU group to measure",
                       evidence=[deep.get("note") or "nvidia-smi topo -m listed no GPUs"])
    out, floor = [], (_policy(facts).get("min_busbw_gbs"))
    py = (deep.get("python") or {}).get("evidence")
    for g in groups:
        subj = f"TP{g['tp']}:{','.join(x[3:] for x in g['gpus'])}"
        if g.get("not_measured"):  # no python with torch: said, never a failure of the GPU (#33)
            out.append(Finding("fabric.nccl.allreduce", Status.INFO, f"{subj}: not measured: {g['not_measured']}"[:300],
                               subject=subj, evidence=[g["not_measured"]] + ([py] if py else []),
                               data={"not_measured": g["not_measured"]}))
            continue
        if g.get("error"):
            out.append(Finding("fabric.nccl.allreduce", Status.UNKNOWN, f"{subj}: all-reduce probe failed", subject=subj,
                               evidence=[g["error"][:300]]))
            continue
        ev = [f"all_reduce {g['bytes'] >> 20} MiB x{g['iters']}: {g['seconds_per_op'] * 1e3:.2f} ms/op, "
              f"algbw {g['algbw_gbs']:.1f} GB/s, busbw {g['busbw_gbs']:.1f} GB/s (NCCL {g.get('nccl')}, NVLS off)"]
        if len(g.get("gpus") or []) < 2:
            out.append(Finding("fabric.nccl.allreduce", Status.INFO, f"{subj}: NCCL initialises and all-reduces "
                               "(one GPU: no bus traffic to measure)", subject=subj, evidence=ev))
            continue
        st = Status.WARN if floor and g["busbw_gbs"] < floor else Status.INFO
        out.append(Finding("fabric.nccl.allreduce", st, f"{subj}: bus bandwidth {g['busbw_gbs']:.1f} GB/s "
                           f"(worst link {g.get('worst_link')})", subject=subj, evidence=ev,
                           data={"busbw_gbs": g["busbw_gbs"], "algbw_gbs": g["algbw_gbs"]}))
    return out


_P2P_LEGEND = {"CNS": "chipset not supported", "GNS": "GPU not supported", "TNS": "topology not supported",
               "NS": "not supported", "U": "unknown"}


@check("fabric.topo.p2p", summary="Every GPU pair can read peer-to-peer (nvidia-smi topo -p2p r), as TP all-reduce expects.")
def p2p(facts):
    """Pairs without P2P fall back to staging through host memory: slower all-reduce, and NCCL_P2P_LEVEL matters."""
    fab = _fab(facts)
    m = (fab or {}).get("p2p_read")
    if m is None:
        return None
    if "error" in m:
        return Finding("fabric.topo.p2p", Status.UNKNOWN, "nvidia-smi topo -p2p r failed", evidence=[m["error"]])
    pairs = sorted({tuple(sorted(k.split("-"))): v for k, v in m.items()}.items())
    bad = [(a, b, v) for (a, b), v in pairs if v != "OK"]
    ev = [f"{a}-{b}: {v}" for (a, b), v in pairs]
    if bad:
        what = "; ".join(f"{a}-{b} {v} ({_P2P_LEGEND.get(v, v)})" for a, b, v in bad)
        return Finding("fabric.topo.p2p", Status.WARN, f"{len(bad)} GPU pair(s) without P2P read: {what}", evidence=ev,
                       hint="Check ACS/IOMMU settings on the host; keep TP groups on pairs with P2P.")
    return Finding("fabric.topo.p2p", Status.OK, f"P2P read OK on all {len(pairs)} GPU pair(s)", evidence=ev)
