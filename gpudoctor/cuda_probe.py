"""The cuInit probe's program, with no imports: the console script starts it before anything else is loaded
(gpudoctor/entry.py); gather/cuda.py runs the same text on any target."""

# Runs on the target. Loads libcuda.so.1 by SONAME (never bare libcuda.so, which may be the toolkit stub).
PROBE = r"""
import ctypes, json, os, time
t = time.perf_counter()
out = {"cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
try:
    lib = ctypes.CDLL("libcuda.so.1")
except OSError as e:
    out["dlopen_error"] = str(e)
    print(json.dumps(out)); raise SystemExit(0)
try:
    for line in open("/proc/self/maps"):
        if "libcuda.so" in line:
            out["library"] = line.split()[-1]; break
except OSError:
    pass
def name(code):
    s = ctypes.c_char_p()
    try:
        lib.cuGetErrorName(code, ctypes.byref(s))
    except Exception:
        return None
    return s.value.decode() if s.value else None
v = ctypes.c_int(0)
out["driver_version_rc"] = lib.cuDriverGetVersion(ctypes.byref(v))
out["driver_api_version"] = v.value
rc = lib.cuInit(0)
out["cuinit"] = rc
out["cuinit_name"] = name(rc)
n = ctypes.c_int(-1)
out["device_count_rc"] = lib.cuDeviceGetCount(ctypes.byref(n))
out["device_count"] = n.value
out["seconds"] = round(time.perf_counter() - t, 4)
print(json.dumps(out))
"""
