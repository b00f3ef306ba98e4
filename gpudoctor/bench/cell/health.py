"""The host's health during a level: the serving GPUs sampled through NVML in a thread (>= 2 Hz), Xid events from
NVML's event set and from the kernel log, joined to the level's record as its `host_health` section.

Per GPU and sample: SM and memory clocks, the clock-event (throttle) reason mask, power and its enforced limit,
temperature, memory used, GPU utilisation, volatile ECC totals, remapped rows, PCIe replays and the compute processes
on the GPU. The section keeps min/median/max of each gauge, the reasons seen, the deltas of the counters over the
level, and events with their times (seconds from the level's start): Xids, clock events, foreign processes.

The NVML source is injectable: `nvml` is any object with pynvml's functions (pynvml itself, imported lazily; a test's
fake built from an H200's `nvidia-smi -q -x`). A host without NVML (no driver, no library: pynvml raises
NVMLError_LibraryNotFound) gets `status: unavailable` with that reason — never no section. The kernel log is read
from where the level starts on (/dev/kmsg, or a file: `health.kernel_log`), so old Xids do not count again.

On a remote target the same sampler runs *there* (RemoteSampler): this module's own source is started detached through
Host.run (`python3 -c SOURCE ...`, stdlib only: nothing is installed on the target), samples until SIGTERM, and
leaves its `host_health` section as one JSON file, which is read back through Host.run (Xid lines parsed here).
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import sys
import threading
import time

# NVML's clocks event reasons (nvml.h nvmlClocksEventReason*; the same bits as the older ClocksThrottleReason*).
REASONS = {0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
           0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
           0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting"}
GAUGES = ("sm_mhz", "mem_mhz", "power_w", "power_limit_w", "temp_c", "mem_used_mib", "util_pct")
COUNTERS = ("ecc_corrected", "ecc_uncorrected", "remapped_corr", "remapped_unc", "pcie_replay")
DEFAULT_INTERVAL_S = 0.5  # 2 Hz
DEFAULT_KERNEL_LOG = "/dev/kmsg"
UNAVAILABLE, SAMPLED = "unavailable", "sampled"


def reason_names(mask: int | None) -> list[str]:
    if not mask:
        return []
    return [name for bit, name in REASONS.items() if mask & bit]


def _call(fn, *args):
    """One NVML query: its value, or None when this GPU or driver does not support it (any NVMLError)."""
    try:
        return fn(*args)
    except Exception:  # pynvml.NVMLError_NotSupported & co.; a broken query must not end the level's sampling
        return None


class KernelLog:
    """New lines of the kernel log since `open()`: /dev/kmsg (one record per read, non-blocking) or a plain file
    (read from its size at open). `reason` says why it cannot be read (then it yields nothing)."""

    def __init__(self, path: str | None):
        self.path = path
        self.fd: int | None = None
        self.kmsg = False
        self.reason: str | None = None
        self.buf = b""

    def open(self) -> None:
        if not self.path:
            self.reason = "no kernel log configured"
            return
        try:
            self.fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            self.kmsg = os.path.realpath(self.path) == "/dev/kmsg"
            os.lseek(self.fd, 0, os.SEEK_END)
        except OSError as exc:
            self.reason = f"{self.path}: {exc.strerror}"
            self.close()

    def lines(self) -> list[str]:
        if self.fd is None:
            return []
        out = []
        while True:
            try:
                data = os.read(self.fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:  # EPIPE: kmsg records were overwritten under us; go on from the next one
                if exc.errno == 32:
                    continue
                self.reason = f"{self.path}: {exc.strerror}"
                self.close()
                break
            if not data:
                break
            if self.kmsg:
                out.append(data.decode("utf-8", "replace").split(";", 1)[-1].rstrip("\n"))
                continue
            self.buf += data
            *whole, self.buf = self.buf.split(b"\n")
            out += [w.decode("utf-8", "replace") for w in whole]
        return out

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class Sampler:
    """Samples the GPUs `gpus` (NVML indices; None: every GPU) every `interval_s` in a daemon thread between start()
    and stop(); stop() returns the `host_health` section. `server_pids` are the server's processes (a callable, so a
    process tree can be re-read); without them, the processes on the GPUs when the level starts are taken as the
    server's and any other one that appears is foreign."""

    def __init__(self, nvml=None, *, gpus: list[int] | None = None, interval_s: float = DEFAULT_INTERVAL_S,
                 kernel_log: str | None = DEFAULT_KERNEL_LOG, server_pids=None, clock=time.time):
        self._nvml = nvml
        self.gpus = gpus
        self.interval_s = interval_s
        self.klog = KernelLog(kernel_log)
        self.server_pids = server_pids
        self.clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.reason: str | None = None
        self.samples: dict[int, list[dict]] = {}
        self.bus: dict[int, str | None] = {}
        self.static: dict[int, dict] = {}  # per GPU: name, PCIe link (provenance)
        self.versions: dict = {}  # driver and CUDA driver versions
        self.events: list[dict] = []
        self.klines: list[list] = []  # [t, at, kernel log line] of NVRM Xid lines
        self.t0 = 0.0
        self.cpu_s = 0.0
        self._handles: dict[int, object] = {}
        self._evset = None
        self._baseline: dict[int, set[int]] = {}
        self._seen_foreign: set[int] = set()
        self._last_reasons: dict[int, int] = {}

    # ---- setup ------------------------------------------------------------------------------------------------
    def _open(self) -> None:
        nv = self._nvml
        if nv is None:
            import pynvml as nv  # lazy: heavy, and a host without a driver must still run levels
        nv.nvmlInit()
        self._nvml = nv
        count = nv.nvmlDeviceGetCount()
        for i in (range(count) if self.gpus is None else self.gpus):
            if i >= count:
                raise ValueError(f"GPU {i} asked for, the host has {count}")
            h = nv.nvmlDeviceGetHandleByIndex(i)
            self._handles[i] = h
            pci = _call(nv.nvmlDeviceGetPciInfo, h)
            bus = getattr(pci, "busId", None)
            self.bus[i] = bus.decode() if isinstance(bus, bytes) else bus
            self.samples[i] = []
            self.static[i] = {"name": _text(_call(getattr(nv, "nvmlDeviceGetName", None), h)),
                              "pcie_gen": _call(getattr(nv, "nvmlDeviceGetCurrPcieLinkGeneration", None), h),
                              "pcie_width": _call(getattr(nv, "nvmlDeviceGetCurrPcieLinkWidth", None), h),
                              "pcie_gen_max": _call(getattr(nv, "nvmlDeviceGetMaxPcieLinkGeneration", None), h),
                              "pcie_width_max": _call(getattr(nv, "nvmlDeviceGetMaxPcieLinkWidth", None), h)}
        self.versions = {"driver": _text(_call(getattr(nv, "nvmlSystemGetDriverVersion", None))),
                         "cuda": _cuda_text(_call(getattr(nv, "nvmlSystemGetCudaDriverVersion", None)))}
        try:
            self._evset = nv.nvmlEventSetCreate()
            for h in self._handles.values():
                _call(nv.nvmlDeviceRegisterEvents, h, nv.nvmlEventTypeXidCriticalError, self._evset)
        except Exception:
            self._evset = None

    def start(self) -> "Sampler":
        self.t0 = self.clock()
        self.klog.open()
        try:
            self._open()
        except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, NVMLError_DriverNotLoaded, ...
            self.reason = f"NVML unavailable: {type(exc).__name__}: {exc}"
        self._thread = threading.Thread(target=self._run, name="gpudoctor-health", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        c0 = time.thread_time()
        try:
            while True:
                self.tick()
                if self._stop.wait(self.interval_s):
                    break
            self.tick()  # the level's last moment
        finally:
            self.cpu_s = time.thread_time() - c0

    # ---- one tick ---------------------------------------------------------------------------------------------
    def tick(self) -> None:
        now = self.clock()
        t = round(now - self.t0, 3)
        for line in self.klog.lines():
            if "NVRM: Xid" in line:  # parsed by section(), where gpudoctor.catalog.xid is (not on a remote target)
                self.klines.append([t, now, line[:400]])
        if self.reason is not None:
            return
        nv = self._nvml
        if self._evset is not None:
            while True:
                data = _call(nv.nvmlEventSetWait, self._evset, 0)
                if data is None:
                    break
                gpu = _call(nv.nvmlDeviceGetIndex, data.device)
                self.events.append({"t": t, "at": now, "kind": "xid", "xid": int(data.eventData), "gpu": gpu,
                                    "source": "nvml"})
        for i, h in self._handles.items():
            self.samples[i].append(self._sample(nv, i, h, t, now))

    def _sample(self, nv, i: int, h, t: float, now: float) -> dict:
        s: dict = {"t": t}
        s["sm_mhz"] = _call(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM)
        s["mem_mhz"] = _call(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM)
        get_reasons = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            getattr(nv, "nvmlDeviceGetCurrentClocksThrottleReasons")
        s["reasons"] = _call(get_reasons, h)
        mw = _call(nv.nvmlDeviceGetPowerUsage, h)
        s["power_w"] = None if mw is None else mw / 1000.0
        lim = _call(nv.nvmlDeviceGetEnforcedPowerLimit, h)
        s["power_limit_w"] = None if lim is None else lim / 1000.0
        s["temp_c"] = _call(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)
        mem = _call(nv.nvmlDeviceGetMemoryInfo, h)
        s["mem_used_mib"] = None if mem is None else mem.used / (1 << 20)
        util = _call(nv.nvmlDeviceGetUtilizationRates, h)
        s["util_pct"] = None if util is None else util.gpu
        s["ecc_corrected"] = _call(nv.nvmlDeviceGetTotalEccErrors, h, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED,
                                   nv.NVML_VOLATILE_ECC)
        s["ecc_uncorrected"] = _call(nv.nvmlDeviceGetTotalEccErrors, h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                     nv.NVML_VOLATILE_ECC)
        rows = _call(nv.nvmlDeviceGetRemappedRows, h)
        s["remapped_corr"], s["remapped_unc"] = (rows[0], rows[1]) if rows else (None, None)
        s["pcie_replay"] = _call(nv.nvmlDeviceGetPcieReplayCounter, h)
        reasons = s["reasons"] or 0
        new = reasons & ~self._last_reasons.get(i, 0)
        for name in reason_names(new):
            if name != "gpu_idle":
                self.events.append({"t": t, "at": now, "kind": "clock_event", "gpu": i, "reason": name})
        self._last_reasons[i] = reasons
        procs = _call(nv.nvmlDeviceGetComputeRunningProcesses, h) or []
        self._foreign(i, procs, t, now)
        return s

    def _foreign(self, gpu: int, procs, t: float, now: float) -> None:
        pids = {int(p.pid): p for p in procs}
        if self.server_pids is not None:
            server = set(self.server_pids() if callable(self.server_pids) else self.server_pids)
        elif gpu not in self._baseline:  # this GPU's first sample: what runs on it now is the server
            self._baseline[gpu] = set(pids)
            return
        else:
            server = self._baseline[gpu]
        for pid, p in pids.items():
            if pid in server or pid in self._seen_foreign:
                continue
            self._seen_foreign.add(pid)
            used = getattr(p, "usedGpuMemory", None)
            self.events.append({"t": t, "at": now, "kind": "foreign_process", "gpu": gpu, "pid": pid,
                                "used_mib": None if used is None else round(used / (1 << 20), 1),
                                "name": _proc_name(pid)})

    # ---- the section --------------------------------------------------------------------------------------------
    def stop(self) -> dict:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        self.klog.close()
        nv = self._nvml
        if self._evset is not None:
            _call(nv.nvmlEventSetFree, self._evset)
        if self.reason is None and nv is not None:
            _call(nv.nvmlShutdown)
        return self.section()

    def section(self) -> dict:
        dur = round(self.clock() - self.t0, 3)
        try:
            events = xid_events(self.events, self.klines)
            klines = None
        except ImportError:  # the sampler on a remote target without gpudoctor: the client parses them
            events, klines = sorted(self.events, key=lambda e: e["t"]), self.klines
        if self.reason is not None:
            out = {"status": UNAVAILABLE, "reason": self.reason, "duration_s": dur, "events": events}
        else:
            out = {"status": SAMPLED, "source": "nvml", "interval_s": self.interval_s, "duration_s": dur,
                   "samples": min((len(v) for v in self.samples.values()), default=0),
                   "gpus": {str(i): {**summarize_gpu(ss, self.bus.get(i)), **self.static.get(i, {})}
                            for i, ss in self.samples.items()},
                   **self.versions,
                   "events": events}
        out["kernel_log"] = self.klog.path if self.klog.reason is None else f"unavailable: {self.klog.reason}"
        out["sampler_cpu_s"] = round(self.cpu_s, 6)
        if klines is not None:
            out["klines"] = klines
        return out


def xid_events(events: list[dict], klines: list[list]) -> list[dict]:
    """`events` with the kernel log's NVRM Xid lines ([t, at, line]) added as xid events, in time order."""
    from gpudoctor.catalog import xid as xidlib
    out = list(events)
    for t, at, line in klines:
        x = xidlib.parse_line(line)
        if x is not None:
            out.append({"t": t, "at": at, "kind": "xid", "xid": x.code, "bus_id": x.pci, "source": "kernel log",
                        "text": x.text[:200]})
    return sorted(out, key=lambda e: e["t"])


def summarize_gpu(samples: list[dict], bus_id: str | None) -> dict:
    out: dict = {"bus_id": bus_id}
    for g in GAUGES:
        xs = [s[g] for s in samples if s.get(g) is not None]
        out[g] = ({"min": min(xs), "median": statistics.median(xs), "max": max(xs)} if xs else None)
    busy = [s["sm_mhz"] for s in samples if s.get("sm_mhz") is not None and not ((s.get("reasons") or 0) & 0x1)]
    out["sm_mhz_busy_median"] = statistics.median(busy) if busy else None
    seen = 0
    for s in samples:
        seen |= s.get("reasons") or 0
    out["reasons_seen"] = reason_names(seen)
    deltas = {}
    for c in COUNTERS:
        xs = [s[c] for s in samples if s.get(c) is not None]
        deltas[c] = (xs[-1] - xs[0]) if xs else None
    out["deltas"] = deltas
    # provenance: the clocks, enforced power limit and clock-event reasons at the level's start and end
    for name, s in (("start", samples[0] if samples else None), ("end", samples[-1] if samples else None)):
        out[name] = None if s is None else {"sm_mhz": s.get("sm_mhz"), "mem_mhz": s.get("mem_mhz"),
                                            "power_limit_w": s.get("power_limit_w"),
                                            "reasons": reason_names(s.get("reasons"))}
    out["sm_mhz_series"] = [[s["t"], s["sm_mhz"], int(bool((s.get("reasons") or 0) & 0x1))]
                            for s in samples if s.get("sm_mhz") is not None]
    return out


def _text(v):
    return v.decode() if isinstance(v, bytes) else v


def _cuda_text(v):
    """NVML's CUDA driver version (12040) as "12.4"."""
    return f"{v // 1000}.{v % 1000 // 10}" if isinstance(v, int) and v > 0 else None


def _proc_name(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8") as fh:
            return fh.read().strip() or None
    except OSError:
        return None  # not visible from here (another PID namespace, or already gone)


def process_tree(root: int) -> set[int]:
    """`root` and every process of its session (a server started in a new session: its workers too), from /proc."""
    out = {root}
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for n in names:
        if not n.isdigit():
            continue
        try:
            with open(f"/proc/{n}/stat", encoding="utf-8") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 4 and int(fields[3]) == root:  # field 6 (session id), counted after the ")"
            out.add(int(n))
    return out


def unavailable(reason: str) -> dict:
    """The section of a level nobody could sample (e.g. a remote target without a sampler there)."""
    return {"status": UNAVAILABLE, "reason": reason, "events": []}


# ---- the sampler on a remote target ------------------------------------------------------------------------------
# $1 output file, then the sampler's python argv (host/childpy.py's: -I). Starts it detached in its own session; prints
# its pid.
_AGENT_START = r"""out=$1
shift 1
case $out in "~/"*) out=$HOME/${out#"~/"} ;; esac
mkdir -p "$(dirname "$out")" || exit 90
rm -f "$out" "$out.ready"
setsid nohup "$@" "$out" > "$out.err" 2>&1 < /dev/null &
echo "pid=$!"
echo "out=$out"
"""
# $1 pid, $2 output file: wait until it can take SIGTERM (a python start on a busy host takes a while), send it,
# wait up to 10 s for the results, make sure it is gone, print them.
_AGENT_STOP = r"""i=0
while [ ! -e "$2.ready" ] && kill -0 "$1" 2>/dev/null && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
kill -TERM "$1" 2>/dev/null
i=0
while [ ! -s "$2" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
kill -KILL "$1" 2>/dev/null
i=0
while [ $i -lt 40 ]; do
  { read -r s < "/proc/$1/stat"; } 2>/dev/null || break
  s=${s##*") "}
  case $s in Z*|X*) break ;; esac
  sleep 0.05; i=$((i + 1))
done
rm -f "$2.ready"
cat "$2"
exit 0
"""


class RemoteSampler:
    """The Sampler run on `host` (a Host: SSH through the probe agent's seam, or local) for one level."""

    def __init__(self, host, run_dir: str, label: str, *, gpus: list[int] | None = None,
                 interval_s: float = DEFAULT_INTERVAL_S, kernel_log: str | None = DEFAULT_KERNEL_LOG,
                 server_pgid: int | None = None, max_s: float = 7200.0):
        self.host, self.gpus, self.interval_s, self.kernel_log = host, gpus, interval_s, kernel_log
        self.max_s = max_s
        self.out = f"{run_dir.rstrip('/')}/{label}.health.json"
        self.server_pgid = server_pgid
        self.pid: int | None = None
        self.error: str | None = None

    def start(self) -> "RemoteSampler":
        from pathlib import Path

        from gpudoctor.host.childpy import python_argv  # here: this file is also the sampler's stdlib-only program

        src = Path(__file__).read_text(encoding="utf-8")
        argv = ["sh", "-c", _AGENT_START, "gpudoctor-health", self.out,
                *python_argv(self.host.python[:1], "-c", src, json.dumps(
                    {"interval_s": self.interval_s, "kernel_log": self.kernel_log, "gpus": self.gpus,
                     "server_pgid": self.server_pgid, "max_s": self.max_s}))]
        try:
            res = self.host.run(argv, timeout=30.0)
        except Exception as exc:  # HostError: the level runs; its record says why nothing was sampled
            self.error = f"the sampler did not start on {self.host.name}: {exc}"
            return self
        out = dict(line.split("=", 1) for line in res.stdout.splitlines() if "=" in line)
        if res.ok and out.get("pid", "").strip().isdigit():
            self.pid, self.out = int(out["pid"]), out.get("out", self.out).strip()
        else:
            self.error = f"the sampler did not start on {self.host.name}: {res.describe()}"
        return self

    def stop(self) -> dict:
        if self.pid is None:
            return unavailable(self.error or "the sampler did not start")
        try:
            res = self.host.run(["sh", "-c", _AGENT_STOP, "gpudoctor-health-stop", str(self.pid), self.out],
                                timeout=60.0)
        except Exception as exc:
            return unavailable(f"the sampler's results could not be read from {self.host.name}: {exc}")
        try:
            out = json.loads(res.stdout)
        except ValueError:
            return unavailable(f"the sampler left no results on {self.host.name} ({self.out}; {res.describe()})")
        if "klines" in out:
            out["events"] = xid_events(out.get("events") or [], out.pop("klines"))
        if out["status"] == SAMPLED:
            out["source"] = f"nvml on {self.host.name}"
        out["host"] = self.host.name
        return out


def _agent(conf: dict, out: str) -> None:
    """`python3 -c <this file> CONF OUT` on the target: sample until SIGTERM, then write the raw state to OUT."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    open(out + ".ready", "w").close()
    pgid = conf.get("server_pgid")
    s = Sampler(None, gpus=conf.get("gpus"), interval_s=conf.get("interval_s") or DEFAULT_INTERVAL_S,
                kernel_log=conf.get("kernel_log"), server_pids=(lambda: process_tree(pgid)) if pgid else None).start()
    # Orphaned (the campaign killed): it ends by itself once the server's session is gone (a resumed campaign reaps
    # that server) or after max_s (the level's timeout), whichever comes first.
    end = time.monotonic() + float(conf.get("max_s") or 7200)
    while not stop.wait(1.0) and time.monotonic() < end:
        if pgid and process_tree(pgid) == {pgid} and not os.path.exists(f"/proc/{pgid}"):
            break
    s._stop.set()
    if s._thread is not None:
        s._thread.join(10)
    s.klog.close()
    with open(out + ".tmp", "w", encoding="utf-8") as fh:
        json.dump(s.section(), fh)
    os.replace(out + ".tmp", out)


if __name__ == "__main__" and len(sys.argv) == 3:
    _agent(json.loads(sys.argv[1]), sys.argv[2])
