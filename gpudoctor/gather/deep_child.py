"""The deep tier's measuring child: one process per GPU, run on the target under a deadline (killable), plain JSON out.

It measures host→device and device→host copies from pinned memory placed on the GPU's own NUMA node (and on a remote
node where there are several), pageable copies for comparison, a device-memory copy, a bf16 GEMM and peer copies to
the GPUs after it, with torch when it imports and the CUDA driver API through ctypes otherwise (no GEMM then: that
needs cuBLAS). NVML (ctypes) samples clocks, power, temperature, clock-event reasons, the PCIe link and the processes
on the GPU during each measurement, and reads ECC and row-remap counters before and after. It reads; it never sets a
clock, a power limit or any other setting of the card.

After each measurement it prints the whole record again as one JSON line, so a child killed at its deadline still
leaves what it measured (the parent keeps the last complete line). argv: one JSON object (see deep_gpu.child_args).

Its record's `phases` ([name, start, end] in seconds since its first line) and `startup_s` (its interpreter's start-up
before that line) are the child's part of the deep timeline (gather/deep_timeline.py).
"""

import inspect

from gpudoctor.gather.deep_timeline import started_ago

_PROGRAM = r"""
A = json.loads(sys.argv[1])
T0 = time.monotonic()
DEADLINE = T0 + float(A["budget_s"])
out = {"schema": "gpudoctor.deep.gpu/1", "device": A["dev"], "pid": os.getpid(), "backend": None, "error": None,
       "tests": [], "skipped": [], "notes": [], "startup_s": started_ago(), "phases": []}

class phase:
    # one entry of out["phases"]: [name, start, end], seconds since T0
    def __init__(self, name):
        self.name = name

    def __enter__(self):
        self.t = time.monotonic() - T0
        return self

    def __exit__(self, *exc):
        out["phases"].append([self.name, round(self.t, 4), round(time.monotonic() - T0, 4)])

def uptime():
    try:
        with open("/proc/uptime") as f:
            return float(f.read().split()[0])
    except (OSError, ValueError):
        return None

out["uptime_start"] = uptime()

def emit():
    out["elapsed_s"] = round(time.monotonic() - T0, 3)
    out["uptime_end"] = uptime()
    sys.stdout.write(json.dumps(out, sort_keys=True) + "\n")
    sys.stdout.flush()

# ---- NVML through ctypes: reads only ----------------------------------------------------------------------------
class PciInfo(ctypes.Structure):
    _fields_ = [("busIdLegacy", ctypes.c_char * 16), ("domain", ctypes.c_uint), ("bus", ctypes.c_uint),
                ("device", ctypes.c_uint), ("pciDeviceId", ctypes.c_uint), ("pciSubSystemId", ctypes.c_uint),
                ("busId", ctypes.c_char * 32)]

class ProcInfo(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong), ("gpuInstanceId", ctypes.c_uint),
                ("computeInstanceId", ctypes.c_uint)]

class Util(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]

REASONS = {0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
           0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
           0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting"}

class Nvml:
    def __init__(self, index):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        rc = self.lib.nvmlInit_v2()
        if rc:
            raise OSError("nvmlInit_v2 -> %d" % rc)
        self.h = ctypes.c_void_p()
        rc = self.lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(self.h))
        if rc:
            raise OSError("nvmlDeviceGetHandleByIndex_v2(%d) -> %d" % (index, rc))

    def _get(self, fn, ctype, *args):
        f = getattr(self.lib, fn, None)
        if f is None:
            return None
        v = ctype()
        return v.value if f(self.h, *args, ctypes.byref(v)) == 0 else None

    def u(self, fn, *args):
        return self._get(fn, ctypes.c_uint, *[ctypes.c_uint(a) for a in args])

    def ull(self, fn, *args):
        return self._get(fn, ctypes.c_ulonglong, *[ctypes.c_uint(a) for a in args])

    def name(self):
        b = ctypes.create_string_buffer(96)
        return b.value.decode() if self.lib.nvmlDeviceGetName(self.h, b, 96) == 0 else None

    def bus_id(self):
        p = PciInfo()
        f = getattr(self.lib, "nvmlDeviceGetPciInfo_v3", None) or self.lib.nvmlDeviceGetPciInfo_v2
        return p.busId.decode() if f(self.h, ctypes.byref(p)) == 0 else None

    def reasons(self):
        v = self.ull("nvmlDeviceGetCurrentClocksEventReasons")
        if v is None:
            v = self.ull("nvmlDeviceGetCurrentClocksThrottleReasons")
        return None if v is None else [n for b, n in REASONS.items() if v & b]

    def procs(self):
        for fn in ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2"):
            f = getattr(self.lib, fn, None)
            if f is None:
                continue
            n = ctypes.c_uint(64)
            arr = (ProcInfo * 64)()
            if f(self.h, ctypes.byref(n), arr) == 0:
                res = []
                for p in arr[:n.value]:
                    mem = p.usedGpuMemory
                    res.append({"pid": p.pid, "used_mib": None if mem >= (1 << 63) else mem >> 20})
                return res
        return None

    def proc_name(self, pid):
        b = ctypes.create_string_buffer(256)
        f = getattr(self.lib, "nvmlSystemGetProcessName", None)
        return b.value.decode("utf-8", "replace") if f and f(ctypes.c_uint(pid), b, 256) == 0 else None

    def util(self):
        u = Util()
        return u.gpu if self.lib.nvmlDeviceGetUtilizationRates(self.h, ctypes.byref(u)) == 0 else None

    def counters(self):
        c = {"ecc_uncorrected": self.ull("nvmlDeviceGetTotalEccErrors", 1, 0),
             "ecc_corrected": self.ull("nvmlDeviceGetTotalEccErrors", 0, 0)}
        r = [ctypes.c_uint() for _ in range(4)]
        f = getattr(self.lib, "nvmlDeviceGetRemappedRows", None)
        if f is not None and f(self.h, *[ctypes.byref(x) for x in r]) == 0:
            c["remap"] = {"correctable": r[0].value, "uncorrectable": r[1].value, "pending": r[2].value,
                          "failure": r[3].value}
        cur, pend = ctypes.c_uint(), ctypes.c_uint()
        f = getattr(self.lib, "nvmlDeviceGetMigMode", None)
        if f is not None and f(self.h, ctypes.byref(cur), ctypes.byref(pend)) == 0:
            c["mig"] = cur.value
        c["power_limit_w"] = (lambda v: None if v is None else v / 1000.0)(self.u("nvmlDeviceGetEnforcedPowerLimit"))
        c["link_max"] = {"gen": self.u("nvmlDeviceGetMaxPcieLinkGeneration"),
                         "width": self.u("nvmlDeviceGetMaxPcieLinkWidth"),
                         "gpu_gen": self.u("nvmlDeviceGetGpuMaxPcieLinkGeneration")}
        c["app_clocks_mhz"] = {"sm": self.u("nvmlDeviceGetApplicationsClock", 1),
                               "sm_default": self.u("nvmlDeviceGetDefaultApplicationsClock", 1)}
        return c

    def sample(self):
        p = self.u("nvmlDeviceGetPowerUsage")
        return {"sm": self.u("nvmlDeviceGetClockInfo", 1), "mem": self.u("nvmlDeviceGetClockInfo", 2),
                "power": None if p is None else p / 1000.0, "temp": self.u("nvmlDeviceGetTemperature", 0),
                "reasons": self.reasons(), "gen": self.u("nvmlDeviceGetCurrPcieLinkGeneration"),
                "width": self.u("nvmlDeviceGetCurrPcieLinkWidth"), "util": self.util(), "procs": self.procs()}

try:
    with phase("NVML"):
        NV = Nvml(A["dev"])
        out["name"], out["bus_id"] = NV.name(), NV.bus_id()
        out["before"] = NV.counters()
except (OSError, AttributeError) as e:
    NV = None
    out["notes"].append("NVML: %s (no clocks, power or counters sampled)" % e)

FOREIGN = set()   # NVML pids on the GPU before this process touched it
SELF = set([os.getpid()])

def mark_self():
    # The process NVML lists now and did not before this one made its context is this one (in a container NVML
    # may report the host's PID for it).
    if NV is not None:
        new = [p["pid"] for p in (NV.procs() or []) if p["pid"] not in FOREIGN]
        if len(new) == 1:
            SELF.add(new[0])
        out["self_pids"] = sorted(SELF)

def summarise(samples):
    s = {"n": len(samples)}
    for k in ("sm", "mem", "power", "temp", "util"):
        v = [x[k] for x in samples if x.get(k) is not None]
        if v:
            s[k] = [min(v), max(v)]
    s["reasons"] = sorted(set(r for x in samples for r in (x.get("reasons") or [])))
    links = sorted(set((x["gen"], x["width"]) for x in samples if x.get("gen") is not None))
    s["link"] = [{"gen": g, "width": w} for g, w in links]
    procs = {}
    for x in samples:
        for p in x.get("procs") or []:
            if p["pid"] not in SELF:
                procs[p["pid"]] = max(procs.get(p["pid"]) or 0, p["used_mib"] or 0)
    s["procs"] = [{"pid": pid, "used_mib": mib, "name": NV.proc_name(pid) if NV else None}
                  for pid, mib in sorted(procs.items())]
    return s

class Sampler:
    def __enter__(self):
        self.t0 = time.monotonic()
        self.samples, self.stop = [], threading.Event()
        self.t = threading.Thread(target=self.run, daemon=True)
        if NV is not None:
            self.t.start()
        return self

    def run(self):
        while True:
            try:
                self.samples.append(NV.sample())
            except Exception:
                pass
            if self.stop.wait(0.05):
                break

    def __exit__(self, *exc):
        self.stop.set()
        if self.t.is_alive():
            self.t.join(2)
        self.summary = summarise(self.samples) if NV is not None else None

# ---- NUMA placement: our own mapping, bound to a node before it is touched, then registered (pinned) ------------
SYSCALLS = {"x86_64": {"set_mempolicy": 238, "move_pages": 279}, "aarch64": {"set_mempolicy": 237, "move_pages": 239}}
LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.syscall.restype = ctypes.c_long

def sysfs(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None

def cpulist(s):
    cpus = set()
    for part in (s or "").split(","):
        if "-" in part:
            a, b = part.split("-")
            cpus.update(range(int(a), int(b) + 1))
        elif part.strip():
            cpus.add(int(part))
    return cpus

def status_field(name):
    for line in (sysfs("/proc/self/status") or "").splitlines():
        if line.startswith(name + ":"):
            return line.split(":", 1)[1].strip()
    return None

def numa_facts():
    bdf = None
    if out.get("bus_id"):
        d, rest = out["bus_id"].lower().split(":", 1)
        bdf = "%04x:%s" % (int(d, 16), rest)
    node = sysfs("/sys/bus/pci/devices/%s/numa_node" % bdf) if bdf else None
    nodes = []
    for n in sorted(os.listdir("/sys/devices/system/node")) if os.path.isdir("/sys/devices/system/node") else []:
        if n.startswith("node") and n[4:].isdigit() and (sysfs("/sys/devices/system/node/%s/cpulist" % n) or ""):
            nodes.append(int(n[4:]))
    gpu_node = int(node) if node not in (None, "-1") else None
    return {"bdf": bdf, "gpu_node": gpu_node, "nodes": nodes,
            "gpu_cpus": sysfs("/sys/bus/pci/devices/%s/local_cpulist" % bdf) if bdf else None,
            "mems_allowed": status_field("Mems_allowed_list"), "cpus_allowed": status_field("Cpus_allowed_list")}

def set_policy(node):
    nr = SYSCALLS.get(platform.machine())
    if nr is None:
        return "no set_mempolicy number for %s" % platform.machine()
    mask = (ctypes.c_ulong * 16)()
    if node is not None:
        mask[node // 64] |= 1 << (node % 64)
    rc = LIBC.syscall(nr["set_mempolicy"], 2 if node is not None else 0, mask if node is not None else None,
                      ctypes.c_ulong(1025 if node is not None else 0))
    return None if rc == 0 else "set_mempolicy(MPOL_BIND, node %s) -> errno %d" % (node, ctypes.get_errno())

def page_nodes(addr, size, probes=16):
    nr = SYSCALLS.get(platform.machine())
    if nr is None:
        return None
    ps = mmap.PAGESIZE
    pages = (ctypes.c_void_p * probes)(*[addr + (size // probes) * i // ps * ps for i in range(probes)])
    status = (ctypes.c_int * probes)()
    rc = LIBC.syscall(nr["move_pages"], 0, ctypes.c_ulong(probes), pages, None, status, 0)
    if rc != 0:
        return None
    counts = {}
    for s in status:
        counts[str(s)] = counts.get(str(s), 0) + 1
    return counts

LIBC.mmap.restype = ctypes.c_void_p
LIBC.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
LIBC.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]

class HostBuf:
    # An anonymous mapping touched while the thread's policy binds it to `node` (None: the default policy).
    def __init__(self, size, node):
        self.size, self.note = size, None
        old = os.sched_getaffinity(0)
        if node is not None:
            cpus = cpulist(sysfs("/sys/devices/system/node/node%d/cpulist" % node)) & old
            if cpus:
                os.sched_setaffinity(0, cpus)
            self.note = set_policy(node)
        try:
            # PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS|MAP_POPULATE: the kernel touches every page in this
            # call, under the policy just set (far faster than faulting them in one by one from here)
            addr = LIBC.mmap(None, size, 3, 0x22 | 0x8000, -1, 0)
            if addr in (None, ctypes.c_void_p(-1).value):
                raise MemoryError("mmap of %d bytes -> errno %d" % (size, ctypes.get_errno()))
            self.addr = addr
        finally:
            if node is not None:
                set_policy(None)
                os.sched_setaffinity(0, old)
        self.nodes = page_nodes(self.addr, size)

    def array(self):
        return (ctypes.c_uint8 * self.size).from_address(self.addr)

    def close(self):
        LIBC.munmap(self.addr, self.size)

# Each figure is sized by its confidence, not a fixed count: at least MIN_REPS of its kind, at most the reps the
# parent asks for (deep_gpu.DEFAULTS), stopping as soon as half the samples lie within 1 % of their median.
MIN_REPS = {"pinned": 3, "pageable": 3, "d2d": 5, "gemm": 5, "p2p": 3}
STABLE = 0.01

def until_stable(one, what):
    # `one()` times one rep (seconds); returns the sorted samples and why it stopped
    kmax = int(A["reps"][what])
    kmin = min(MIN_REPS.get(what, 3), kmax)
    ts = []
    while len(ts) < kmax:
        ts.append(one())
        if len(ts) >= kmin:
            srt = sorted(ts)
            med = srt[len(srt) // 2]
            dev = sorted(abs(x - med) for x in srt)
            if dev[len(dev) // 2] <= STABLE * med:
                return srt, "stable"
    return sorted(ts), "max"

def budget_left(need):
    return DEADLINE - time.monotonic() > need

STOPPED = [None]  # why the last figure's sampling stopped ("stable" or "max")

def record(kind, **kw):
    kw["kind"] = kind
    if STOPPED[0] and kw.get("seconds"):
        kw["stopped"], STOPPED[0] = STOPPED[0], None
    out["tests"].append(kw)
    emit()

# ---- the measurements --------------------------------------------------------------------------------------------
def run_torch(torch):
    dev = A["dev"]
    d = torch.device("cuda", dev)
    n = int(A["bytes"])

    def timed(fn, what, sync_devs=(dev,)):
        fn()
        for x in sync_devs:
            torch.cuda.synchronize(x)

        def one():
            if len(sync_devs) > 1:  # a peer copy: wall time until both devices are done
                t = time.perf_counter(); fn()
                for x in sync_devs:
                    torch.cuda.synchronize(x)
                return time.perf_counter() - t
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(); fn(); b.record(); b.synchronize()
            return a.elapsed_time(b) / 1e3

        with Sampler() as s:
            ts, why = until_stable(one, what)
        STOPPED[0] = why
        return ts, ts[len(ts) // 2], s.summary

    with phase("CUDA context"):
        torch.cuda.set_device(dev)
        cudart = torch.cuda.cudart()
        dbuf = torch.empty(n, dtype=torch.uint8, device=d)
        torch.cuda.synchronize()
    mark_self()
    numa = out["numa"]
    places = [("local", numa["gpu_node"])]
    remote = [x for x in numa["nodes"] if x != numa["gpu_node"]]
    if numa["gpu_node"] is not None and remote:
        places.append(("remote", remote[0]))
    # The local buffer serves both: pinned (registered) first, then, unregistered, as the pageable one (the same
    # ordinary memory on the GPU's node, already touched: one 1 GiB mapping less).
    for where, node in places:
        if not budget_left(4):
            out["skipped"].append("pinned %s: budget" % where)
            continue
        with phase("pinned buffer %s" % where):
            hb = HostBuf(n, node)
            rc = cudart.cudaHostRegister(hb.addr, n, 0)
        if int(rc) != 0:
            out["skipped"].append("pinned %s: cudaHostRegister -> %s" % (where, int(rc)))
        else:
            h = torch.frombuffer(hb.array(), dtype=torch.uint8)
            for kind, fn in (("h2d", lambda: dbuf.copy_(h, non_blocking=True)),
                             ("d2h", lambda: h.copy_(dbuf, non_blocking=True))):
                with phase("%s pinned %s" % (kind, where)):
                    ts, med, smp = timed(fn, "pinned")
                record(kind, memory="pinned", placement=where, node=node, page_nodes=hb.nodes, policy_note=hb.note,
                       bytes=n, seconds=ts, gbs=n / med / 1e9, samples=smp)
            del h
            with phase("unpin %s" % where):
                cudart.cudaHostUnregister(hb.addr)
        if where == "local":
            if budget_left(6):
                h = torch.frombuffer(hb.array(), dtype=torch.uint8)
                for kind, fn in (("h2d", lambda: dbuf.copy_(h)), ("d2h", lambda: h.copy_(dbuf))):
                    with phase("%s pageable" % kind):
                        ts, med, smp = timed(fn, "pageable")
                    record(kind, memory="pageable", placement="local", node=node, page_nodes=hb.nodes, bytes=n,
                           seconds=ts, gbs=n / med / 1e9, samples=smp)
                del h
            else:
                out["skipped"].append("pageable: budget")
        hb.close()
    if budget_left(2):
        with phase("d2d"):
            dst = torch.empty_like(dbuf)
            ts, med, smp = timed(lambda: dst.copy_(dbuf), "d2d")
        record("d2d", bytes=n, counted="read+write", seconds=ts, gbs=2 * n / med / 1e9, samples=smp)
        del dst
    else:
        out["skipped"].append("d2d: budget")
    del dbuf
    torch.cuda.empty_cache()
    if budget_left(3):
        m = int(A["gemm_n"])
        with phase("gemm inputs"):
            x = torch.randn(m, m, dtype=torch.bfloat16, device=d)
            y = torch.randn(m, m, dtype=torch.bfloat16, device=d)
        with phase("gemm"):
            ts, med, smp = timed(lambda: torch.matmul(x, y), "gemm")
        record("gemm", n=m, dtype="bf16", seconds=ts, tflops=2 * m ** 3 / med / 1e12, samples=smp)
        del x, y
        torch.cuda.empty_cache()
    else:
        out["skipped"].append("gemm: budget")
    pn = int(A["p2p_bytes"])
    for peer in A.get("peers") or []:
        if not budget_left(2):
            out["skipped"].append("p2p %d-%d: budget" % (dev, peer))
            continue
        with phase("p2p %d-%d" % (dev, peer)):
            can = bool(torch.cuda.can_device_access_peer(dev, peer))
            src = torch.empty(pn, dtype=torch.uint8, device=d)
            dst = torch.empty(pn, dtype=torch.uint8, device=torch.device("cuda", peer))
            ts, med, smp = timed(lambda: dst.copy_(src), "p2p", sync_devs=(dev, peer))
        record("p2p", peer=peer, can_access_peer=can, bytes=pn, seconds=ts, gbs=pn / med / 1e9, samples=smp)
        del src, dst
        torch.cuda.empty_cache()

def run_ctypes():
    def ck(rc, what):
        if rc:
            raise RuntimeError("%s -> CUresult %d" % (what, rc))
    n = int(A["bytes"])
    d1, d2 = ctypes.c_uint64(), ctypes.c_uint64()
    with phase("CUDA context"):
        try:
            cu = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise RuntimeError("no CUDA: libcuda.so.1 cannot be loaded (%s)" % e)
        ck(cu.cuInit(0), "cuInit")
        dv, ctx = ctypes.c_int(), ctypes.c_void_p()
        ck(cu.cuDeviceGet(ctypes.byref(dv), A["dev"]), "cuDeviceGet")
        ck(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dv), "cuDevicePrimaryCtxRetain")
        ck(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        ck(cu.cuMemAlloc_v2(ctypes.byref(d1), ctypes.c_size_t(n)), "cuMemAlloc")
    mark_self()
    def timed(fn, what):
        fn(); ck(cu.cuCtxSynchronize(), "cuCtxSynchronize")

        def one():
            t = time.perf_counter(); fn(); ck(cu.cuCtxSynchronize(), "cuCtxSynchronize")
            return time.perf_counter() - t

        with Sampler() as s:
            ts, why = until_stable(one, what)
        STOPPED[0] = why
        return ts, ts[len(ts) // 2], s.summary
    numa = out["numa"]
    places = [("local", numa["gpu_node"])]
    remote = [x for x in numa["nodes"] if x != numa["gpu_node"]]
    if numa["gpu_node"] is not None and remote:
        places.append(("remote", remote[0]))
    for where, node in places:  # the local buffer pinned, then unregistered as the pageable one (as run_torch)
        if not budget_left(4):
            out["skipped"].append("pinned %s: budget" % where)
            continue
        with phase("pinned buffer %s" % where):
            hb = HostBuf(n, node)
            ck(cu.cuMemHostRegister_v2(ctypes.c_void_p(hb.addr), ctypes.c_size_t(n), 0), "cuMemHostRegister")
        pinned = True
        for memory in ("pinned", "pageable") if where == "local" else ("pinned",):
            if memory == "pageable":
                cu.cuMemHostUnregister(ctypes.c_void_p(hb.addr))
                pinned = False
                if not budget_left(4):
                    out["skipped"].append("pageable: budget")
                    break
            for kind, fn in (("h2d", lambda: ck(cu.cuMemcpyHtoD_v2(d1, ctypes.c_void_p(hb.addr), ctypes.c_size_t(n)),
                                                "cuMemcpyHtoD")),
                             ("d2h", lambda: ck(cu.cuMemcpyDtoH_v2(ctypes.c_void_p(hb.addr), d1, ctypes.c_size_t(n)),
                                                "cuMemcpyDtoH"))):
                with phase("%s %s %s" % (kind, memory, where)):
                    ts, med, smp = timed(fn, memory)
                record(kind, memory=memory, placement=where, node=node, page_nodes=hb.nodes, policy_note=hb.note,
                       bytes=n, seconds=ts, gbs=n / med / 1e9, samples=smp)
        if pinned:
            cu.cuMemHostUnregister(ctypes.c_void_p(hb.addr))
        hb.close()
    with phase("d2d"):
        ck(cu.cuMemAlloc_v2(ctypes.byref(d2), ctypes.c_size_t(n)), "cuMemAlloc")
        ts, med, smp = timed(lambda: ck(cu.cuMemcpyDtoD_v2(d2, d1, ctypes.c_size_t(n)), "cuMemcpyDtoD"), "d2d")
    record("d2d", bytes=n, counted="read+write", seconds=ts, gbs=2 * n / med / 1e9, samples=smp)
    cu.cuMemFree_v2(d1); cu.cuMemFree_v2(d2)
    out["skipped"].append("gemm: the ctypes backend has no cuBLAS (run with a python that has torch)")
    if A.get("peers"):
        out["skipped"].append("p2p: measured with torch only")

def wait_turn():
    # Where the parent starts several children at once (gather/deep_gpu.py: their start-up overlaps), each measures
    # only when its turn comes: the parent makes the file $GPUDOCTOR_DEEP_GO names when the child before it has
    # exited (a GPU measured alone has the host link to itself; a peer copy's context on this GPU is gone). Its
    # budget starts then.
    global DEADLINE
    go = os.environ.get("GPUDOCTOR_DEEP_GO")
    if not go:
        return
    with phase("waiting for its turn"):
        limit = time.monotonic() + float(os.environ.get("GPUDOCTOR_DEEP_WAIT_S") or 600)
        stop = os.path.join(os.path.dirname(go), "stop")  # the parent gave up on the run
        while not os.path.exists(go):
            if time.monotonic() > limit or os.path.exists(stop):
                raise RuntimeError("its turn to measure never came (%s)" % go)
            time.sleep(0.01)
    DEADLINE = time.monotonic() + float(A["budget_s"])

class Primer:
    # The CUDA context made in a thread (the driver API, ctypes: the GIL is released) while torch imports, after the
    # idle sample: torch's runtime then finds the device's primary context made. Every failure is left to the
    # measurement itself to report.
    def __init__(self):
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        with phase("CUDA context (driver)"):
            try:
                cu = ctypes.CDLL("libcuda.so.1")
                if cu.cuInit(0) == 0:
                    dv, ctx = ctypes.c_int(), ctypes.c_void_p()
                    if cu.cuDeviceGet(ctypes.byref(dv), A["dev"]) == 0:
                        cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dv)
            except OSError:
                pass

    def join(self):
        self.t.join()

def idle_sample(started=None):
    # 0.3 s of the GPU before this process touches it (who else is there); `started`: a sampler already running
    if NV is None:
        return
    idle = started or Sampler().__enter__()
    left = 0.3 - (time.monotonic() - idle.t0)
    if left > 0:
        time.sleep(left)
    idle.__exit__(None, None, None)
    out["idle"] = idle.summary
    out["phases"].append(["idle sample", round(idle.t0 - T0, 4), round(time.monotonic() - T0, 4)])
    FOREIGN.update(p["pid"] for p in (NV.procs() or []))

try:
    with phase("NUMA facts"):
        out["numa"] = numa_facts()
    if A.get("host_only"):  # the host half alone (no GPU needed): where a buffer bound to each node lands
        for node in out["numa"]["nodes"] or [None]:
            hb = HostBuf(int(A["bytes"]), node)
            record("host_placement", node=node, page_nodes=hb.nodes, policy_note=hb.note, bytes=hb.size)
            hb.close()
        raise SystemExit(emit())
    # Alone (no turn to wait for), the idle GPU is sampled and then its context made while torch imports (neither
    # needs torch, and importing it touches no GPU); with a turn to wait for, both after the turn came.
    alone = not os.environ.get("GPUDOCTOR_DEEP_GO")
    want_torch = A.get("backend", "auto") in ("auto", "torch")
    primer = None
    if alone:
        sampler = Sampler().__enter__() if NV is not None else None
        if want_torch:
            def idle_then_prime():
                global primer
                idle_sample(sampler)
                primer = Primer()
            early = threading.Thread(target=idle_then_prime, daemon=True)
            early.start()
        else:
            idle_sample(sampler)
    torch = None
    if want_torch:
        try:
            with phase("import torch"):
                import torch
        except ImportError as e:
            if A.get("backend") == "torch":
                raise RuntimeError("torch does not import: %s" % e)
            out["notes"].append("torch does not import (%s): CUDA driver API through ctypes" % e)
            torch = None
    if alone:
        if want_torch:
            early.join()
    else:
        wait_turn()
        idle_sample()
        if torch is not None:
            primer = Primer()
    if primer is not None:
        primer.join()
    if torch is not None:
        out["backend"] = "torch"
        out["torch"] = torch.__version__
        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA: torch %s sees no CUDA device (torch.cuda.is_available() is False)"
                               % torch.__version__)
        run_torch(torch)
    else:
        out["backend"] = "ctypes"
        run_ctypes()
except Exception as e:
    out["error"] = "%s: %s" % (type(e).__name__, e)
if NV is not None:
    try:
        with phase("NVML counters after"):
            out["after"] = NV.counters()
    except Exception as e:
        out["notes"].append("NVML counters after: %s" % e)
emit()
# Nothing is left to tear down that the kernel does not: no Python teardown (torch's, its allocator's) on the clock.
os._exit(0)
"""

# The program: its imports, the start-up reading gather/deep_timeline.py uses too (one text), then the measuring.
PROGRAM = ("import ctypes, json, mmap, os, platform, sys, threading, time, warnings\n"
           + inspect.getsource(started_ago) + _PROGRAM)
