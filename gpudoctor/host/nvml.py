"""NVML read in this process (nvidia-ml-py's `pynvml`), under a deadline: what `nvidia-smi -q -x` told the driver
checks, without a subprocess on a check's critical path (#33: nvidia-smi alone was 0.11 s on the H200, 0.30 s beside
cuInit, and made `check` 1.2-1.4x a bare cuInit).

The answer is raw: every NVML call made, by name (and arguments), with its value or its error, in the format of
`nvml-dump.json` (the H200 capture, tests/fixtures/captures/h200-2026-12-03/): {"init_ms", "ms", "system":
{call: {"value"|"error"}}, "devices": [{call: {"value"|"error"}}], "error"?: why NVML gave nothing}. A snapshot keeps
it as is and gather/nvml.py turns it into the driver facts, so a replay re-runs today's parser over it.

A wedged driver can hang an NVML call: the reads run in a daemon thread and the caller waits at most its deadline
(the thread is then abandoned; a live check leaves with os._exit). Stdlib and pynvml only, imported lazily: the
console script starts this before click (host/early.py), beside the cuInit probe.
"""

from __future__ import annotations

import threading
import time

# The field id of the GPU's pending recovery action (its values: gather/nvml.py RECOVERY).
FI_RECOVERY_ACTION = 230  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION


def _plain(v):
    """A pynvml answer as JSON: ctypes structures as dicts of their fields, bytes as text."""
    import ctypes

    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, ctypes.Structure):
        return {name: _plain(getattr(v, name)) for name, *_ in v._fields_}
    if isinstance(v, ctypes.Array):
        return [_plain(x) for x in v]
    if type(v).__name__ == "nvmlFriendlyObject":  # pynvml's process records
        return {k: _plain(x) for k, x in vars(v).items()}
    return v


def _err(e) -> dict:
    return {"error": type(e).__name__, "message": str(e)[:200], **({"code": e.value} if hasattr(e, "value") else {})}


def read() -> dict:
    """Every NVML answer the driver checks use (blocking: call it through `start`/`wait`)."""
    t0 = time.perf_counter()
    out: dict = {"schema": "gpudoctor.nvml/1", "system": {}, "devices": []}
    try:
        import pynvml
    except ImportError as e:  # an install without nvidia-ml-py: nvidia-smi answers instead
        out.update(error=f"pynvml does not import: {e}", ms=round((time.perf_counter() - t0) * 1e3, 3))
        return out
    try:
        pynvml.nvmlInit()
    except Exception as e:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded, ...: nvidia-smi says it
        out.update(error=type(e).__name__, code=getattr(e, "value", None), message=str(e)[:200],
                   ms=round((time.perf_counter() - t0) * 1e3, 3))
        return out
    out["init_ms"] = round((time.perf_counter() - t0) * 1e3, 3)

    def call(into: dict, name: str, *args, key: str | None = None, fn=None):
        t = time.perf_counter()
        try:
            val = (fn or getattr(pynvml, name))(*args)
            rec = {"value": _plain(val)}
        except Exception as e:  # noqa: BLE001 - NotSupported, NoPermission: an answer too
            rec = _err(e)
        rec["ms"] = round((time.perf_counter() - t) * 1e3, 3)
        into[key or name] = rec
        return rec.get("value")

    try:
        sysd = out["system"]
        call(sysd, "nvmlSystemGetDriverVersion")
        call(sysd, "nvmlSystemGetNVMLVersion")
        call(sysd, "nvmlSystemGetCudaDriverVersion")
        n = call(sysd, "nvmlDeviceGetCount")
        for i in range(n or 0):
            dev: dict = {}
            out["devices"].append(dev)
            h = call(dev, "nvmlDeviceGetHandleByIndex", i, fn=lambda i: pynvml.nvmlDeviceGetHandleByIndex(i))
            if "error" in dev["nvmlDeviceGetHandleByIndex"]:
                continue
            dev["nvmlDeviceGetHandleByIndex"] = {"value": i, "ms": dev["nvmlDeviceGetHandleByIndex"]["ms"]}
            for name in ("nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetName", "nvmlDeviceGetUUID",
                         "nvmlDeviceGetMinorNumber", "nvmlDeviceGetPersistenceMode",
                         "nvmlDeviceGetMaxPcieLinkGeneration", "nvmlDeviceGetCurrPcieLinkGeneration",
                         "nvmlDeviceGetMaxPcieLinkWidth", "nvmlDeviceGetCurrPcieLinkWidth", "nvmlDeviceGetEccMode",
                         "nvmlDeviceGetRemappedRows", "nvmlDeviceGetCurrentClocksEventReasons",
                         "nvmlDeviceGetNumaNodeId"):
                call(dev, name, h)
            if "error" in dev["nvmlDeviceGetCurrentClocksEventReasons"]:  # an nvidia-ml-py before the rename
                call(dev, "nvmlDeviceGetCurrentClocksThrottleReasons", h)
            call(dev, "nvmlDeviceGetTotalEccErrors", h, 1, 0, key="nvmlDeviceGetTotalEccErrors(1, 0)")
            call(dev, "nvmlDeviceGetMemoryInfo", h, key="nvmlDeviceGetMemoryInfo_v2",
                 fn=lambda h: pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2))
            call(dev, "nvmlDeviceGetFieldValues", h, key=f"nvmlDeviceGetFieldValues({FI_RECOVERY_ACTION},)",
                 fn=lambda h: [{"nvmlReturn": int(v.nvmlReturn), "value": int(v.value.uiVal)}
                               for v in pynvml.nvmlDeviceGetFieldValues(h, [FI_RECOVERY_ACTION])])
            pids = set()
            for name in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
                pids.update(p["pid"] for p in call(dev, name, h) or [])
            names: dict = {}
            for pid in sorted(pids):
                call(names, "nvmlSystemGetProcessName", pid, key=str(pid))
            dev["nvmlSystemGetProcessName"] = {"value": names}
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass
    out["ms"] = round((time.perf_counter() - t0) * 1e3, 3)
    return out


class Pending:
    """An NVML read running in a daemon thread since `started` (perf_counter)."""

    def __init__(self):
        self.box: list = []
        self.started = time.perf_counter()
        self.thread = threading.Thread(target=self._run, name="gpudoctor-nvml", daemon=True)
        self.thread.start()

    def _run(self):
        try:
            self.box.append(read())
        except Exception as e:  # noqa: BLE001 - never a traceback: the caller falls back to nvidia-smi
            self.box.append({"schema": "gpudoctor.nvml/1", "system": {}, "devices": [],
                             "error": f"{type(e).__name__}: {e}"[:300]})

    def wait(self, timeout: float) -> dict:
        """The answer, or {"timed_out": True} when NVML has not answered `timeout` s after the read started."""
        self.thread.join(max(0.0, timeout - (time.perf_counter() - self.started)))
        if not self.box:
            return {"schema": "gpudoctor.nvml/1", "timed_out": True, "timeout_s": timeout,
                    "ms": round((time.perf_counter() - self.started) * 1e3, 3)}
        return self.box[0]


EARLY: list = []  # the read started at CLI entry (host/early.py); LocalHost.nvml adopts it once


def start_early() -> None:
    if not EARLY:
        EARLY.append(Pending())


STUCK: list = []  # reads that passed their deadline: a thread inside NVML cannot be killed


def read_within(timeout: float) -> dict:
    """The early read when there is one (its deadline counts from its start), else a new one. While an earlier read
    is still stuck in NVML (a wedged driver) no other is started: a daemon would pile up a thread per cycle."""
    STUCK[:] = [p for p in STUCK if p.thread.is_alive()]
    if STUCK:
        return {"schema": "gpudoctor.nvml/1", "timed_out": True, "timeout_s": timeout, "ms": 0.0,
                "stuck_s": round(time.perf_counter() - STUCK[0].started, 3)}
    pending = EARLY.pop() if EARLY else Pending()
    ans = pending.wait(timeout)
    if ans.get("timed_out"):
        STUCK.append(pending)
    return ans
