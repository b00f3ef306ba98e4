"""Host layer: is the NVIDIA driver loaded (nvidia, nvidia_uvm), and what kind of machine is this."""

from gpudoctor.checkreg import check
from gpudoctor.findings import Finding, Status
from gpudoctor.platform import LABELS, detect, fix_text


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
                       hint=fix_text(facts, "no_driver"))
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
