"""Host layer: is the NVIDIA driver loaded (nvidia, nvidia_uvm), and what kind of machine is this."""

from gpudoctor.checkreg import check
from gpudoctor.findings import Finding, Status
from gpudoctor.boundary.platform import LABELS, detect, fix_text


@check("host.driver.loaded", summary="The nvidia kernel module is loaded and /proc/driver/nvidia/version exists.")
def driver_loaded(facts):
    """Without the nvidia module nothing above can work; this is the first root cause to rule out."""
    h = facts.get("host")
    if not h:
        return None
    mods = h["modules"]
    ver = h["driver_version_file"]
    loaded = "nvidia" in mods.get("nvidia", [])
    if ver.get("error") == "ENOENT" and not loaded:
        # /proc/driver/nvidia exists whenever the module is loaded (also inside containers): its absence is conclusive.
        return Finding("host.driver.loaded", Status.FAIL, "No NVIDIA driver is loaded",
                       evidence=["/proc/driver/nvidia/version → ENOENT",
                                 "/proc/modules → " + (mods["error"] if mods.get("error") else "no 'nvidia' module")],
                       hint=fix_text(facts, "no_driver"),
                       explained_by=("boundary.lxc.node_driver",))  # an LXC guest shares its node's kernel
    if ver.get("error") and not loaded:
        return Finding("host.driver.loaded", Status.UNKNOWN, "Could not read the driver version or /proc/modules",
                       evidence=[f"/proc/modules → {mods.get('error') or 'no nvidia'}",
                                 f"/proc/driver/nvidia/version → {ver['error']}"])
    return Finding("host.driver.loaded", Status.OK, f"NVIDIA driver {ver.get('version') or '?'} is loaded"
                   + (" (open kernel module)" if ver.get("open") else ""),
                   evidence=[ver.get("line") or "/proc/modules lists nvidia"], data={"version": ver.get("version")})


@check("host.uvm.loaded", summary="The nvidia_uvm module is loaded (CUDA needs it; nvidia-smi does not).",
       depends_on=("host.driver.loaded",), remedy="devices.node.create")
def uvm_loaded(facts):
    """nvidia-smi works without nvidia_uvm, CUDA does not: cuInit then fails with 999."""
    h = facts.get("host")
    if not h:
        return None
    if "nvidia_uvm" in h["modules"].get("nvidia", []):
        return Finding("host.uvm.loaded", Status.OK, "nvidia_uvm is loaded",
                       evidence=[f"/proc/modules: {', '.join(h['modules']['nvidia'])}"])
    if "nvidia-uvm" in h["proc_devices"].get("char", {}):
        return Finding("host.uvm.loaded", Status.OK, "nvidia-uvm is registered (built in or loaded)",
                       evidence=[f"/proc/devices: {h['proc_devices']['char']['nvidia-uvm']} nvidia-uvm"])
    if h["modules"].get("error"):
        return None  # neither /proc/modules (a kernel without module support has none) nor /proc/devices tells
    return Finding("host.uvm.loaded", Status.FAIL, "nvidia_uvm is not loaded: CUDA cannot initialise",
                   evidence=["/proc/modules has no nvidia_uvm", "/proc/devices has no nvidia-uvm"],
                   hint="Run `nvidia-modprobe -u -c 0` (loads nvidia_uvm and creates /dev/nvidia-uvm*) on the host.")


@check("host.platform", summary="What the checker runs in: bare metal, VM, LXC or Docker container.")
def platform(facts):
    """Information only; it decides which boundary checks apply and which fix text every finding gives."""
    h = facts.get("host")
    if not h:
        return None
    p = detect(facts)
    extra = ([f"in systemd unit {p.unit}"] if p.unit else []) + (
        [f"cgroup driver {p.cgroup_driver} (from {p.cgroup})"] if p.cgroup_driver else [])
    return Finding("host.platform", Status.INFO, f"Running in {LABELS.get(p.kind, p.kind)}"
                   + (f", unit {p.unit}" if p.unit else ""),
                   evidence=p.evidence + extra + ([f"kernel {h['kernel']}"] if h.get("kernel") else []),
                   data={"kind": p.kind, "unit": p.unit, "cgroup": p.cgroup, "cgroup_driver": p.cgroup_driver})

@check("host.privileges", summary="Who the probes run as, and what that user cannot see on this host.")
def privileges(facts):
    """An ordinary user can use a GPU (where a driver is loaded) as root can, but some facts are root-only: the PCIe config space past its first
    64 bytes (MaxReadReq/MaxPayload), the MIG config capability (nvidia-cap1 is 0400 root by design), other users'
    open device nodes and environments (/proc/PID/fd, /proc/PID/environ: GPU memory holders are then known from NVML
    only) and, with kernel.dmesg_restrict=1, the kernel log (XIDs). Information, never a fault."""
    ident = (facts.get("devices") or {}).get("identity")
    if not ident:
        return None
    h = facts.get("host") or {}
    caps = (facts.get("tools") or {}).get("caps") or {}
    restrict = h.get("dmesg_restrict")
    data = {"uid": ident["uid"], "root": ident["uid"] == 0}
    if ident["uid"] == 0:
        ev = ["/proc/self/status: Uid 0"]
        if caps.get("sys_admin") is False or caps.get("userns"):
            ev.append("root without CAP_SYS_ADMIN in the initial user namespace (a container): PCIe config space "
                      "past 64 bytes is not readable here")
        return Finding("host.privileges", Status.OK if len(ev) == 1 else Status.INFO,
                       "Probes run as root" + ("" if len(ev) == 1 else " in a restricted container"), evidence=ev,
                       data=data)
    # (what the summary names, what the evidence says): every one is named in the summary, not only in evidence
    blind = [("PCIe config space past 64 bytes",
              "PCIe config space past its first 64 bytes (MaxReadReq, MaxPayload): needs CAP_SYS_ADMIN"),
             ("the MIG config capability",
              "the MIG config capability (nvidia-cap1 is 0400 root by design; only MIG reconfiguration needs it)"),
             ("other users' GPU processes",
              "other users' open GPU device nodes and environments (/proc/PID/fd, /proc/PID/environ): their GPU "
              "memory is seen through NVML only")]
    if restrict == 1:
        blind.append(("the kernel log (XIDs)",
                      "the kernel log (kernel.dmesg_restrict = 1 needs CAP_SYSLOG): XIDs are not read"))
    # "usable without root" only where a driver is loaded: on a host without one there is no GPU to use
    drv = driver_loaded(facts)
    gpu = "using the GPU needs no root; " if drv is not None and drv.status == Status.OK else ""
    return Finding("host.privileges", Status.INFO,
                   f"Probes run as uid {ident['uid']} (not root): {gpu}{len(blind)} kinds of facts are root-only: "
                   + ", ".join(short for short, _ in blind),
                   evidence=[f"/proc/self/status: Uid {ident['uid']}, Gid {ident['gid']}"]
                   + [f"cannot see: {b}" for _, b in blind],
                   hint="Run `sudo gpudoctor check` (or the daemon as root) to see everything.", data=data)
