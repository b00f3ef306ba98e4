"""Driver layer: NVML (in process, else through nvidia-smi), versions, GPU count, persistence, ECC, remapped rows,
throttling, PCIe width."""

from gpudoctor.checkreg import check
from gpudoctor.findings import Finding, Status

# NVML return codes as nvidia-smi's exit status (FIELD_NOTES; nvml.h).
NVML_CODES = {
    2: ("INVALID_ARGUMENT", "nvidia-smi was called with a bad argument"),
    3: ("NOT_SUPPORTED", "the operation is not supported"),
    4: ("NO_PERMISSION", "no permission to talk to the driver"),
    6: ("NOT_FOUND", "no GPU found"),
    9: ("DRIVER_NOT_LOADED", "the NVIDIA driver is not loaded"),
    12: ("LIBRARY_NOT_FOUND", "libnvidia-ml.so.1 was not found"),
    13: ("FUNCTION_NOT_FOUND", "the NVML library is older than nvidia-smi"),
    14: ("CORRUPTED_INFOROM", "the GPU's infoROM is corrupted"),
    15: ("GPU_IS_LOST", "a GPU has fallen off the bus"),
    17: ("OPERATING_SYSTEM", "GPU access blocked by the operating system: /dev/nvidiactl or /dev/nvidiaN cannot be used"),
    18: ("LIB_RM_VERSION_MISMATCH", "driver/library version mismatch: the loaded kernel module and the user-space "
                                   "libraries differ (a driver update without reboot or module reload)"),
    999: ("UNKNOWN", "unknown NVML error"),
}

_BLOCKERS = ("host.driver.loaded", "devices.node.*", "boundary.*")
# NVML opens /dev/nvidiactl and /dev/nvidiaN, never the uvm nodes: only those nodes' problems explain its failure.
_NVML_NODES = ("devices.node.*@/dev/nvidiactl", "devices.node.*@/dev/nvidia[0-9]*",
               "boundary.*@/dev/nvidiactl", "boundary.*@/dev/nvidia[0-9]*")
# nvidia-smi's exit code → what can explain it: () is its own cause (nothing gpudoctor checks makes it happen).
_NVML_CAUSES = {9: ("host.driver.loaded",), 12: (), 13: (), 14: (), 15: (), 18: (), 2: (), 3: (),
                17: ("host.driver.loaded",) + _NVML_NODES, 4: _NVML_NODES}


def _smi(facts):
    return facts.get("driver")


def _tool(facts, xml=False) -> str:
    """Who answered the driver facts: NVML in process, or nvidia-smi (remote hosts, snapshots taken before NVML was
    read in process)."""
    if (_smi(facts) or {}).get("source") == "nvml":
        return "NVML"
    return "nvidia-smi -q -x" if xml else "nvidia-smi"


@check("driver.nvml.init", summary="NVML (in process, else nvidia-smi) initialises and answers within its deadline.",
       depends_on=_BLOCKERS)
def nvml_init(facts):
    """NVML error codes are named (9, 12, 17, 18, 999); a hang is its own finding, never a hung checker."""
    d = _smi(facts)
    if not d:
        return None
    if d.get("timed_out"):
        tool = "NVML" if d.get("source") == "nvml" else "nvidia-smi"
        return Finding("driver.nvml.init", Status.UNKNOWN, f"{tool} did not answer in {d.get('timeout_s'):g} s",
                       evidence=[f"$ {d['command']} → no answer in {d.get('timeout_s'):g} s"],
                       hint="A hung NVML usually means a wedged GPU or driver: look at `dmesg` for Xid errors.",
                       explained_by=())
    if d.get("rc") == 127:  # a missing tool is its own cause, whatever else is wrong
        why = d.get("nvml_fallback")  # NVML in process answered first, with nothing usable (#33)
        return Finding("driver.nvml.init", Status.UNKNOWN,
                       f"NVML did not answer in process and nvidia-smi is not installed ({why})" if why else
                       "nvidia-smi is not installed, so NVML was not probed",
                       evidence=[f"$ {d['command']} → command not found"] + ([f"NVML in process: {why}"] if why else []),
                       explained_by=())
    if d.get("rc") != 0:
        if d["rc"] in NVML_CODES:
            name, meaning = NVML_CODES[d["rc"]]
            summary = f"NVML failed: {meaning} (NVML_ERROR_{name}, code {d['rc']})"
        else:  # not an NVML return code: say what nvidia-smi printed
            name, said = None, (d.get("stderr") or d.get("stdout") or "").strip().splitlines()
            summary = f"NVML failed: nvidia-smi exited {d['rc']}" + (f" ({said[0][:120]})" if said else "")
        return Finding("driver.nvml.init", Status.FAIL, summary,
                       evidence=[f"$ {d['command']} → rc {d['rc']}: {d.get('stderr', '')[:200]}"],
                       data={"nvml_code": d["rc"], "nvml_name": name},
                       explained_by=_NVML_CAUSES.get(d["rc"], ("host.driver.loaded",) + _NVML_NODES))
    if d.get("parse_error"):
        return Finding("driver.nvml.init", Status.UNKNOWN, "nvidia-smi answered with XML we could not parse",
                       evidence=[d["parse_error"]], explained_by=())
    n = len(d.get("gpus", []))
    return Finding("driver.nvml.init", Status.OK, f"NVML ok: driver {d.get('driver_version')}, CUDA {d.get('cuda_version')}, "
                   f"{n} GPU{'s' if n != 1 else ''}", evidence=[f"$ {d['command']} → rc 0 in {d.get('duration_s')} s"],
                   data={"gpus": n, "driver_version": d.get("driver_version")})


def _gpus(facts):
    d = _smi(facts)
    return d.get("gpus", []) if d and d.get("rc") == 0 else None


@check("driver.version.match", summary="The loaded kernel module's version equals the user-space library's.",
       depends_on=("driver.nvml.init", "host.driver.loaded"))
def version_match(facts):
    """A driver update without a reboot leaves the old module loaded under new libraries."""
    d, h = _smi(facts), facts.get("host")
    if not d or not h or d.get("rc") != 0:
        return None
    kmod, lib = h["driver_version_file"].get("version"), d.get("driver_version")
    if not kmod or not lib:
        return None
    if kmod != lib:
        return Finding("driver.version.match", Status.FAIL, f"Kernel module {kmod} ≠ user-space driver {lib}",
                       evidence=[f"/proc/driver/nvidia/version: {kmod}", f"{_tool(facts)} driver_version: {lib}"],
                       hint="Reboot, or unload and reload the nvidia modules, so both are the same release.")
    return Finding("driver.version.match", Status.OK, f"Kernel module and libraries are both {lib}",
                   evidence=[f"/proc/driver/nvidia/version: {kmod}", f"{_tool(facts)} driver_version: {lib}"])


@check("driver.gpu.count", summary="The number of GPUs NVML sees matches the expectation (inventory or --expect-gpus).",
       depends_on=("driver.nvml.init",))
def gpu_count(facts):
    """A GPU that fell off the bus or is hidden by passthrough shows up as a lower count."""
    gpus = _gpus(facts)
    if gpus is None:
        return None
    want = (facts.get("meta", {}).get("context") or {}).get("expect_gpus")
    names = sorted({g.get("name") or "?" for g in gpus})
    ev = [f"{_tool(facts)} sees {len(gpus)}: {', '.join(names)}"]
    if want is None:
        st = Status.INFO if gpus else Status.WARN
        return Finding("driver.gpu.count", st, f"{len(gpus)} GPU(s) visible (no expected count given)", evidence=ev)
    if len(gpus) != want:
        return Finding("driver.gpu.count", Status.FAIL, f"{len(gpus)} GPU(s) visible, {want} expected",
                       evidence=ev + [f"expected {want}"])
    return Finding("driver.gpu.count", Status.OK, f"{len(gpus)} GPU(s) visible, as expected", evidence=ev)


def _per_gpu(facts, fid, judge):
    gpus = _gpus(facts)
    if gpus is None:
        return None
    out = []
    for g in gpus:
        subject = f"GPU {g.get('minor')} ({g.get('bus_id')})"
        status, summary, ev, *rest = judge(g)
        f = Finding(fid, status, summary, subject=subject, evidence=ev)
        if rest:
            f.hint = rest[0]
        out.append(f)
    return out


@check("driver.persistence", summary="Persistence mode is on, so the driver stays initialised between jobs.",
       depends_on=("driver.nvml.init",), remedy="driver.persistence")
def persistence(facts):
    """Without persistence the first CUDA call after idle pays GPU initialisation; it also resets on reboot."""
    def judge(g):
        pm = g.get("persistence_mode")
        if pm == "Enabled":
            return Status.OK, "Persistence mode enabled", [f"persistence_mode = {pm}"]
        return (Status.WARN, "Persistence mode is off", [f"persistence_mode = {pm}, expected Enabled"],
                "Enable nvidia-persistenced on the host (durable across reboots).", "driver.persistence")
    return _per_gpu(facts, "driver.persistence", judge)


@check("driver.ecc.uncorrected", summary="No volatile uncorrectable ECC errors.", depends_on=("driver.nvml.init",))
def ecc(facts):
    """Uncorrectable ECC errors since the last driver load mean corrupted results are possible."""
    def judge(g):
        n = g.get("ecc_volatile_uncorrectable")
        if g.get("ecc_mode") != "Enabled":
            return Status.INFO, f"ECC is {g.get('ecc_mode')}", [f"ecc_mode = {g.get('ecc_mode')}"]
        if n:
            return (Status.FAIL, f"{n} volatile uncorrectable ECC error(s)", [f"ecc_errors/volatile uncorrectable = {n}"],
                    "Drain the GPU and reset it; if errors recur, RMA.")
        return Status.OK, "No uncorrectable ECC errors", ["ecc_errors/volatile uncorrectable = 0"]
    return _per_gpu(facts, "driver.ecc.uncorrected", judge)


@check("driver.remapped_rows", summary="No pending or failed HBM row remapping.", depends_on=("driver.nvml.init",))
def remapped(facts):
    """A pending remap needs a GPU reset to take effect; a failed one means the memory is out of spare rows."""
    def judge(g):
        r = g.get("remapped_rows") or {}
        ev = [f"remapped_row_pending = {r.get('pending')}", f"remapped_row_failure = {r.get('failure')}"]
        if r.get("failure") == "Yes":
            return Status.FAIL, "Row remapping failed (no spare rows left)", ev, "RMA the GPU."
        if r.get("pending") == "Yes":
            return Status.WARN, "Row remapping pending: reset the GPU", ev, "Reset the GPU when it is idle (nvidia-smi -r)."
        if r.get("pending") is None:
            return Status.INFO, "Row remapping not reported", ev
        return Status.OK, "No pending or failed row remaps", ev
    return _per_gpu(facts, "driver.remapped_rows", judge)


_BAD_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown")


@check("driver.throttle", summary="No hardware or thermal clock slowdown is active.", depends_on=("driver.nvml.init",))
def throttle(facts):
    """Idle and power-cap reasons are normal; hardware, thermal and power-brake slowdowns are not."""
    def judge(g):
        active = [k for k, v in (g.get("clock_event_reasons") or {}).items() if v]
        bad = [k for k in active if k in _BAD_REASONS]
        ev = [f"active clock event reasons: {', '.join(active) or 'none'}"]
        if bad:
            return Status.WARN, f"Clocks slowed by {', '.join(bad)}", ev, "Check cooling and power delivery."
        return Status.OK, "No hardware or thermal slowdown", ev
    return _per_gpu(facts, "driver.throttle", judge)


@check("driver.pcie.width", summary="Each GPU's PCIe link runs at its full width (speed below max at idle is normal).",
       depends_on=("driver.nvml.init",))
def pcie_width(facts):
    """Idle GPUs drop link speed by design; only a width below the maximum is a fault (a bad riser or slot)."""
    def judge(g):
        p = g.get("pcie") or {}
        ev = [f"link width x{p.get('width_current')} of x{p.get('width_max')}, "
              f"gen {p.get('gen_current')} of {p.get('gen_max')}"]
        if p.get("width_current") is None or p.get("width_max") is None:
            return Status.INFO, "PCIe link width not reported", ev
        if p["width_current"] < p["width_max"]:
            return (Status.WARN, f"PCIe link x{p['width_current']} below its maximum x{p['width_max']}", ev,
                    "Reseat the GPU or riser; check the slot's lane wiring.")
        return Status.OK, f"PCIe link x{p['width_current']} (full width)", ev
    return _per_gpu(facts, "driver.pcie.width", judge)


def _gpus_by_pci(facts) -> dict:
    from gpudoctor.catalog.xid import norm_pci

    return {norm_pci(g.get("bus_id")): {"index": i, "recovery_action": g.get("recovery_action")}
            for i, g in enumerate(_gpus(facts) or []) if g.get("bus_id")}


@check("driver.xid", summary="No NVRM Xid in the kernel log of this boot (or the policy's window) that needs action; "
       "each one graded by NVIDIA's Xid catalog.", depends_on=("host.driver.loaded",))
def xid(facts):
    """Reads /dev/kmsg (else `dmesg`); each Xid code is looked up in the shipped catalog (gpudoctor/data/
    xid_catalog.json): RESET_GPU / RESTART_BM / CONTACT_SUPPORT / … fail, RESTART_APP warns, IGNORE is information;
    Xid 154 is graded by the recovery action it names, or the one NVML reports now. A kernel log that cannot be read
    is said so, never ok: denied (EPERM, dmesg_restrict), a /dev/kmsg that is not the kernel's device (an empty file
    from a sandbox) or 0 records read where the boot must have logged.
    Policy: `checks: driver.xid: {window: SECONDS}` looks at the last SECONDS only."""
    from gpudoctor.catalog.xid import findings_from_lines, XidLine

    k = facts.get("kernel_log")
    if not k:
        return None
    window = f"last {k['window_s']:g} s" if k.get("window_s") else "since boot"
    if not k.get("source"):
        errs = k.get("errors") or ["no source"]
        denied = any(e.split(" → ", 1)[-1].startswith(("EACCES", "EPERM", "ENOENT")) or "not permitted" in e
                     for e in errs)
        sandbox = any("not the kernel's log device" in e or "0 records read" in e for e in errs)
        restrict = (facts.get("host") or {}).get("dmesg_restrict")
        why = (" (/dev/kmsg here is not the kernel's log: a sandbox such as systemd's ProtectKernelLogs=yes)"
               if sandbox else " (kernel.dmesg_restrict = 1: reading it needs CAP_SYSLOG)" if restrict == 1 else
               " (a container without /dev/kmsg or CAP_SYSLOG)" if denied else "")
        return Finding("driver.xid", Status.INFO if denied or sandbox else Status.UNKNOWN,
                       f"Could not read the kernel log{why}: Xids were not checked", evidence=errs,
                       hint="Run the check as root on the host (the shipped gpudoctor.service has CAP_SYSLOG and "
                            "ProtectKernelLogs=no for this, docs/daemon.md); the daemon also watches NVML's Xid "
                            "events.", data={"read": False})
    lines = [XidLine(**x) for x in k.get("xids") or []]
    ev = [f"{k['source']}: {k.get('scanned', 0)} records read ({window})" if k["source"] == "/dev/kmsg"
          else f"{k['source']}: read ({window})"]
    if k.get("truncated"):
        ev.append("stopped before the end of the log (record or time bound): older lines were not all seen")
    if not lines:
        return Finding("driver.xid", Status.OK, f"No Xid in the kernel log ({window})", evidence=ev,
                       data={"read": True, "count": 0})
    out = findings_from_lines(lines, _gpus_by_pci(facts), window=window, uptime=k.get("uptime"))
    for f in out:
        f.evidence.append(ev[0])
    return out


@check("driver.recovery_action", summary="NVML reports no pending GPU recovery action (reset, reboot, drain).",
       depends_on=("driver.nvml.init",))
def recovery_action(facts):
    """The driver's own verdict after an uncorrectable error (what Xid 154 announces): None, or GPU Reset Required,
    Node Reboot Required, Drain P2P, Drain and Reset. Drivers that do not report it say nothing here."""
    from gpudoctor.catalog.xid import nvml_action

    out = []
    for i, g in enumerate(_gpus(facts) or []):
        act = nvml_action(g.get("recovery_action"))
        if act is None:
            continue
        sub = f"GPU {i} ({g.get('bus_id')})"
        ev = [f"{_tool(facts, xml=True)}: gpu_recovery_action = {g.get('recovery_action')}"]
        if act == "None":
            out.append(Finding("driver.recovery_action", Status.OK, "No recovery action pending", subject=sub,
                               evidence=ev))
        else:
            out.append(Finding("driver.recovery_action", Status.FAIL, f"The driver asks for a recovery action: {act}",
                               subject=sub, evidence=ev, data={"action": act},
                               hint="Drain the GPU, then " + ("reboot the node" if "Reboot" in act else
                                                              "reset it (nvidia-smi -r -i N) once no process uses it")))
    return out or None
