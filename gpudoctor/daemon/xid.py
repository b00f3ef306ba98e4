"""Watch NVML for XID errors in a thread and turn the critical ones into "driver.xid" findings (the catalog and the
findings are gpudoctor/catalog/xid.py's, shared with `check`'s kernel-log reader).

pynvml is imported lazily inside the thread; no driver, no library or no event support ends the watcher with a
reason (the check pipeline already reports a missing driver), never an exception in the daemon.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from gpudoctor.findings import Finding
from gpudoctor.catalog.xid import critical, findings_from_events
from gpudoctor.log import get_logger

@dataclass
class XidEvent:
    gpu: int | None
    bus_id: str | None
    xid: int
    at: float

    @property
    def critical(self) -> bool:
        return critical(self.xid)

    def to_json(self) -> dict:
        return {"gpu": self.gpu, "bus_id": self.bus_id, "xid": self.xid, "at": self.at}


def xid_findings(events: list[dict]) -> list[Finding]:
    """One fail finding per GPU and critical Xid (the shipped catalog decides), newest event as evidence."""
    return findings_from_events(events)


class XidWatcher:
    """A thread that waits on an NVML event set for XID events and hands each one to `on_event`."""

    def __init__(self, on_event, nvml=None, wait_ms: int = 1000):
        self.on_event = on_event
        self._nvml = nvml
        self.wait_ms = wait_ms
        self.running = False
        self.reason: str | None = None  # why the watcher is not running
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.log = get_logger("gpudoctor.daemon.xid")

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="gpudoctor-xid", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 3.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _setup(self):
        nv = self._nvml
        if nv is None:
            import pynvml as nv  # lazy: heavy, and absent drivers must not break the daemon
        nv.nvmlInit()
        evset = nv.nvmlEventSetCreate()
        watched = {}
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            try:
                nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, evset)
            except nv.NVMLError as exc:
                self.log.warning("xid.gpu_not_watched", gpu=i, error=str(exc))
                continue
            try:
                bus = nv.nvmlDeviceGetPciInfo(h).busId
                bus = bus.decode() if isinstance(bus, bytes) else str(bus)
            except nv.NVMLError:
                bus = None
            watched[i] = bus
        return nv, evset, watched

    def _run(self) -> None:
        try:
            nv, evset, watched = self._setup()
        except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, DriverNotLoaded, ...
            self.reason = f"NVML unavailable: {type(exc).__name__}: {exc}"
            self.log.info("xid.unavailable", reason=self.reason)
            return
        if not watched:
            self.reason = "no GPU supports XID events"
            self.log.info("xid.unavailable", reason=self.reason)
            self._shutdown(nv, evset)
            return
        self.running = True
        self.log.info("xid.watching", gpus=sorted(watched))
        try:
            while not self._stop.is_set():
                try:
                    data = nv.nvmlEventSetWait(evset, self.wait_ms)
                except nv.NVMLError as exc:
                    if isinstance(exc, getattr(nv, "NVMLError_Timeout", ())):
                        continue
                    self.reason = f"NVML event wait failed: {exc}"
                    self.log.warning("xid.stopped", reason=self.reason)
                    return
                gpu = None
                try:
                    gpu = nv.nvmlDeviceGetIndex(data.device)
                except Exception:
                    pass
                ev = XidEvent(gpu=gpu, bus_id=watched.get(gpu), xid=int(data.eventData), at=time.time())
                self.log.warning("xid.event", **ev.to_json(), critical=ev.critical)
                try:
                    self.on_event(ev)
                except Exception as exc:  # a bug in the handler must not kill the watcher
                    self.log.error("xid.handler_failed", error=repr(exc))
        finally:
            self.running = False
            self._shutdown(nv, evset)

    @staticmethod
    def _shutdown(nv, evset) -> None:
        for fn, args in ((getattr(nv, "nvmlEventSetFree", None), (evset,)), (getattr(nv, "nvmlShutdown", None), ())):
            try:
                if fn:
                    fn(*args)
            except Exception:
                pass
