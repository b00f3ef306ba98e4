"""A fake of pynvml for a host without a GPU, built from a real H200's `nvidia-smi -q -x` (tests/fixtures/nvml/).

It answers the pynvml calls gpudoctor.bench.cell.health makes with what NVML returned on that card (nvidia-smi -q -x is
NVML's own view: clocks in MHz, power in W where NVML says mW, memory in MiB where NVML says bytes, the clock event
reasons as NVML's bit mask, N/A as NVMLError_NotSupported), and lets a test change the host mid-level: clocks, reasons,
a process on the GPU, ECC errors, an Xid event. The errors are pynvml's own classes (pynvml is installed; only the
driver library is missing here).
"""

from __future__ import annotations

import re
import threading
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace

import pynvml

from gpudoctor.bench.cell.health import REASONS

CAPTURE = Path(__file__).resolve().parents[1] / "fixtures" / "nvml" / "h200-nvidia-smi-qx.xml"
_BIT = {name: bit for bit, name in REASONS.items()}
_XML_REASON = {"clocks_event_reason_gpu_idle": "gpu_idle",
               "clocks_event_reason_applications_clocks_setting": "applications_clocks_setting",
               "clocks_event_reason_sw_power_cap": "sw_power_cap", "clocks_event_reason_hw_slowdown": "hw_slowdown",
               "clocks_event_reason_hw_thermal_slowdown": "hw_thermal_slowdown",
               "clocks_event_reason_hw_power_brake_slowdown": "hw_power_brake_slowdown",
               "clocks_event_reason_sync_boost": "sync_boost",
               "clocks_event_reason_sw_thermal_slowdown": "sw_thermal_slowdown",
               "clocks_event_reason_display_clocks_setting": "display_clock_setting"}


def _num(text: str | None):
    m = re.match(r"\s*(-?[0-9.]+)", text or "")
    if not m:
        return None
    return float(m.group(1)) if "." in m.group(1) else int(m.group(1))


class _GPU:
    def __init__(self, el: ET.Element, index: int):
        g = lambda path: el.findtext(path)  # noqa: E731
        self.index = index
        self.bus_id = g("pci/pci_bus_id")
        self.sm = _num(g("clocks/sm_clock"))
        self.mem = _num(g("clocks/mem_clock"))
        self.reasons = 0
        for child in el.find("clocks_event_reasons"):
            if child.text == "Active":
                self.reasons |= _BIT[_XML_REASON[child.tag]]
        self.power_mw = int(_num(g("gpu_power_readings/instant_power_draw")) * 1000)
        self.limit_mw = int(_num(g("gpu_power_readings/current_power_limit")) * 1000)
        self.temp = _num(g("temperature/gpu_temp"))
        self.used = _num(g("fb_memory_usage/used")) << 20
        self.total = _num(g("fb_memory_usage/total")) << 20
        self.util = _num(g("utilization/gpu_util"))
        vol = el.find("ecc_errors/volatile")
        self.ecc_corr = sum(_num(vol.findtext(k)) for k in ("sram_correctable", "dram_correctable"))
        self.ecc_unc = sum(_num(vol.findtext(k)) for k in ("sram_uncorrectable_parity", "sram_uncorrectable_secded",
                                                          "dram_uncorrectable"))
        self.rows = (_num(g("remapped_rows/remapped_row_corr")), _num(g("remapped_rows/remapped_row_unc")),
                     g("remapped_rows/remapped_row_pending") == "Yes", g("remapped_rows/remapped_row_failure") == "Yes")
        self.replay = _num(g("pci/replay_counter"))
        self.name = g("product_name")
        self.pcie = (_num(g("pci/pci_gpu_link_info/pcie_gen/current_link_gen")),
                     _num(g("pci/pci_gpu_link_info/link_widths/current_link_width")),
                     _num(g("pci/pci_gpu_link_info/pcie_gen/max_link_gen")),
                     _num(g("pci/pci_gpu_link_info/link_widths/max_link_width")))
        self.procs = [SimpleNamespace(pid=int(p.findtext("pid")), usedGpuMemory=_num(p.findtext("used_memory")) << 20)
                      for p in el.findall("processes/process_info")]


class FakeNVML:
    """pynvml's functions over the capture's GPUs (one per <gpu> element, or `copies` of the first)."""

    NVMLError = pynvml.NVMLError
    NVML_CLOCK_SM, NVML_CLOCK_MEM = pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_MEM
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
    NVML_MEMORY_ERROR_TYPE_CORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    NVML_VOLATILE_ECC = pynvml.NVML_VOLATILE_ECC
    nvmlEventTypeXidCriticalError = pynvml.nvmlEventTypeXidCriticalError

    def __init__(self, capture: Path = CAPTURE, copies: int = 1):
        root = ET.parse(capture).getroot()
        els = root.findall("gpu")
        self.gpus = [_GPU(els[i % len(els)], i) for i in range(max(copies, len(els)))]
        self.driver = root.findtext("driver_version")
        cuda = (root.findtext("cuda_version") or "0.0").split(".")
        self.cuda = int(cuda[0]) * 1000 + int(cuda[1]) * 10  # NVML's integer form: 13.0 -> 13000
        self.lock = threading.Lock()
        self.xids: list[tuple[int, int]] = []
        self.calls = 0
        self.inited = 0

    # ---- what a test injects ------------------------------------------------------------------------------------
    def busy(self, util: int = 97, power_w: float = 620.0) -> None:
        """The GPUs under load: not idle (the capture is an idle card), drawing power."""
        with self.lock:
            for g in self.gpus:
                g.reasons &= ~_BIT["gpu_idle"]
                g.util, g.power_mw = util, int(power_w * 1000)

    def set(self, gpu: int = 0, **kw) -> None:
        with self.lock:
            for k, v in kw.items():
                setattr(self.gpus[gpu], k, v)

    def add_reason(self, name: str, gpu: int = 0) -> None:
        with self.lock:
            self.gpus[gpu].reasons |= _BIT[name]

    def add_process(self, pid: int, mib: int, gpu: int = 0) -> None:
        with self.lock:
            self.gpus[gpu].procs.append(SimpleNamespace(pid=pid, usedGpuMemory=mib << 20))

    def xid(self, code: int, gpu: int = 0) -> None:
        with self.lock:
            self.xids.append((gpu, code))

    # ---- pynvml --------------------------------------------------------------------------------------------------
    def _h(self, h) -> _GPU:
        self.calls += 1
        return h

    def nvmlInit(self):
        self.inited += 1

    def nvmlShutdown(self):
        self.inited -= 1

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        return self.gpus[i]

    def nvmlDeviceGetIndex(self, h):
        return h.index

    def nvmlDeviceGetName(self, h):
        return self._h(h).name

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h):
        return self._h(h).pcie[0]

    def nvmlDeviceGetCurrPcieLinkWidth(self, h):
        return self._h(h).pcie[1]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h):
        return self._h(h).pcie[2]

    def nvmlDeviceGetMaxPcieLinkWidth(self, h):
        return self._h(h).pcie[3]

    def nvmlSystemGetDriverVersion(self):
        return self.driver

    def nvmlSystemGetCudaDriverVersion(self):
        return self.cuda

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(busId=self._h(h).bus_id)

    def nvmlDeviceGetClockInfo(self, h, kind):
        return self._h(h).sm if kind == self.NVML_CLOCK_SM else h.mem

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        with self.lock:
            return self._h(h).reasons

    def nvmlDeviceGetPowerUsage(self, h):
        return self._h(h).power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return self._h(h).limit_mw

    def nvmlDeviceGetTemperature(self, h, sensor):
        return self._h(h).temp

    def nvmlDeviceGetMemoryInfo(self, h):
        h = self._h(h)
        return SimpleNamespace(total=h.total, used=h.used, free=h.total - h.used)

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=self._h(h).util, memory=0)

    def nvmlDeviceGetTotalEccErrors(self, h, kind, counter):
        h = self._h(h)
        return h.ecc_corr if kind == self.NVML_MEMORY_ERROR_TYPE_CORRECTED else h.ecc_unc

    def nvmlDeviceGetRemappedRows(self, h):
        return self._h(h).rows

    def nvmlDeviceGetPcieReplayCounter(self, h):
        return self._h(h).replay

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        with self.lock:
            return list(self._h(h).procs)

    def nvmlEventSetCreate(self):
        return object()

    def nvmlDeviceRegisterEvents(self, h, types, evset):
        return None

    def nvmlEventSetWait(self, evset, timeout_ms):
        with self.lock:
            if not self.xids:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
            gpu, code = self.xids.pop(0)
        return SimpleNamespace(device=self.gpus[gpu], eventData=code, eventType=self.nvmlEventTypeXidCriticalError)

    def nvmlEventSetFree(self, evset):
        return None


def nvml_here() -> bool:
    """Whether this machine has a working NVML (a GPU host): then the "no NVML" expectations become "sampled"."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


def assert_real_health(h: dict) -> None:
    """A record's host_health as this machine must give it: sampled with a driver, else unavailable saying why."""
    if nvml_here():
        assert h["status"] == "sampled" and h["samples"] >= 1, h
    else:
        assert h["status"] == "unavailable" and h["reason"].startswith("NVML unavailable: NVMLError_"), h
