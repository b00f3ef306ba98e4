"""CUDA layer: raw cuInit through libcuda.so.1 in a fresh process, its code named."""

from gpudoctor.checkreg import check
from gpudoctor.findings import Finding, Status

CUINIT = {
    0: ("CUDA_SUCCESS", "CUDA initialised"),
    3: ("CUDA_ERROR_NOT_INITIALIZED", "no device is visible to CUDA (CUDA_VISIBLE_DEVICES may be empty)"),
    34: ("CUDA_ERROR_STUB_LIBRARY", "the loaded libcuda is the toolkit's stub, not the driver's library"),
    100: ("CUDA_ERROR_NO_DEVICE", "no CUDA-capable device: the control or GPU nodes cannot be used"),
    304: ("CUDA_ERROR_OPERATING_SYSTEM", "the operating system refused a CUDA call"),
    802: ("CUDA_ERROR_SYSTEM_NOT_READY", "the system is not ready (fabric manager not running on NVSwitch systems?)"),
    803: ("CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", "libcuda and the kernel driver differ (a cuda-compat libcuda?)"),
    804: ("CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE", "forward-compatibility libcuda is not supported on this GPU"),
    999: ("CUDA_ERROR_UNKNOWN", "unknown error — typically /dev/nvidia-uvm missing, stale or denied by the device cgroup"),
}


# cuInit's code → the findings that can produce it. 999 and 100 come from nodes CUDA opens (uvm for 999, the control
# and GPU nodes for 100); a mismatch from the driver versions; codes about the environment are their own cause.
_NODES_999 = ("devices.node.*@/dev/nvidia-uvm", "boundary.*@/dev/nvidia-uvm", "devices.node.*@/dev/nvidiactl",
              "boundary.*@/dev/nvidiactl", "devices.node.*@/dev/nvidia[0-9]*", "boundary.*@/dev/nvidia[0-9]*")
_CUINIT_CAUSES = {
    999: ("host.*", "driver.version.match") + _NODES_999,
    100: ("host.driver.loaded", "driver.nvml.init", "devices.node.*@/dev/nvidiactl", "devices.node.*@/dev/nvidia[0-9]*",
          "boundary.*@/dev/nvidiactl", "boundary.*@/dev/nvidia[0-9]*"),
    304: ("host.*",) + _NODES_999,
    803: ("driver.version.match",), 804: (), 34: (), 3: (), 802: (),
}


@check("cuda.init", summary="cuInit(0) returns 0 in a fresh process, within its deadline.",
       depends_on=("host.*", "devices.node.*", "boundary.*", "driver.nvml.init", "driver.version.match"))
def cuinit(facts):
    """The probe DCGM skips: NVML can be healthy while CUDA cannot run (cuInit 999 with a blocked uvm node)."""
    c = facts.get("cuda")
    if not c:
        return None
    if c.get("timed_out"):
        return Finding("cuda.init", Status.UNKNOWN, f"cuInit did not answer in {c.get('timeout_s'):g} s",
                       evidence=[f"{c['command']} → killed after {c.get('timeout_s'):g} s"],
                       explained_by=("driver.nvml.init",))  # a wedged driver hangs both
    if c.get("dlopen_error"):
        return Finding("cuda.init", Status.FAIL, "libcuda.so.1 cannot be loaded", evidence=[c["dlopen_error"]],
                       hint="Install the driver's user-space libraries (libcuda.so.1) or fix the container's library mounts.",
                       explained_by=())  # a missing library is its own cause
    if "cuinit" not in c:
        return Finding("cuda.init", Status.UNKNOWN, "The cuInit probe failed to run", evidence=[c.get("probe_error", "")],
                       explained_by=())
    code = c["cuinit"]
    name, meaning = CUINIT.get(code, (c.get("cuinit_name") or f"code {code}", "cuInit failed"))
    lib = c.get("library")
    ev = [f"cuInit(0) → {code} {name}" + (f" via {lib}" if lib else ""),
          f"cuDeviceGetCount → {c.get('device_count')}, cuDriverGetVersion → {c.get('driver_api_version')}"]
    if c.get("cuda_visible_devices") is not None:
        ev.append(f"CUDA_VISIBLE_DEVICES={c['cuda_visible_devices']!r}")
    if code == 0:
        return Finding("cuda.init", Status.OK, f"cuInit ok: {c.get('device_count')} device(s), "
                       f"driver API {c.get('driver_api_version')}", evidence=ev, data={"code": 0})
    return Finding("cuda.init", Status.FAIL, f"cuInit → {code} {name}: {meaning}", evidence=ev,
                   data={"code": code, "name": name}, explained_by=_CUINIT_CAUSES.get(code))


@check("cuda.device_count", summary="CUDA sees as many devices as NVML.", depends_on=("cuda.init", "driver.*"))
def device_count(facts):
    """Fewer CUDA devices than NVML GPUs means CUDA_VISIBLE_DEVICES or a per-device node problem."""
    c, d = facts.get("cuda") or {}, facts.get("driver") or {}
    if c.get("cuinit") != 0 or d.get("rc") != 0:
        return None
    n_cuda, n_nvml = c.get("device_count"), len(d.get("gpus", []))
    ev = [f"cuDeviceGetCount → {n_cuda}", f"nvidia-smi → {n_nvml} GPU(s)"]
    if c.get("cuda_visible_devices") is not None:
        ev.append(f"CUDA_VISIBLE_DEVICES={c['cuda_visible_devices']!r}")
    if n_cuda != n_nvml:
        return Finding("cuda.device_count", Status.WARN, f"CUDA sees {n_cuda} device(s), NVML {n_nvml}", evidence=ev)
    return Finding("cuda.device_count", Status.OK, f"CUDA and NVML both see {n_nvml}", evidence=ev)
