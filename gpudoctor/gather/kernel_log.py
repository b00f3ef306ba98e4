"""Kernel log facts: the NVRM Xid lines of this boot (or of a window), read from /dev/kmsg, else from `dmesg`.

A log that could not be read is never "no Xid": an error, a /dev/kmsg that is not the kernel's character device
(systemd's ProtectKernelLogs=yes puts its inaccessible node there: c 0:0, or an empty regular file), and 0 records
where the boot must have logged (a real /dev/kmsg always holds this boot's first lines, or its oldest surviving
ones) each add an error and leave "source" None unless `dmesg` then reads the log.

Bounded: /dev/kmsg is read record by record without blocking until the end of the ring buffer, at most MAX_RECORDS
records and within the deadline; only the newest MAX_XIDS Xid lines are kept. The window is the policy's
`checks: driver.xid: {window: SECONDS}` (inventory), else the whole boot.

facts["kernel_log"] = {
  "source": "/dev/kmsg" | "dmesg" | None,  "uptime": 12345.6,  "window_s": None | 3600,
  "errors": ["/dev/kmsg → EACCES", "dmesg → rc 1: dmesg: read kernel buffer failed: Operation not permitted"],
  "kind": "char" | "file" | ... | None,   what /dev/kmsg is, stat'ed when it gave 0 records (None: not stat'ed)
  "scanned": 5120, "truncated": false, "xids": [{"pci", "code", "text", "t", "pid", "name"}, ...],
}
"""

from __future__ import annotations

import json
import re
from pathlib import PurePosixPath

from gpudoctor.gather.context import GatherContext
from gpudoctor.host.childpy import python_argv
from gpudoctor.host import Host
from gpudoctor.host.replay import not_recorded
from gpudoctor.catalog.xid import parse_line

MAX_RECORDS = 200_000
MAX_XIDS = 500

# argv: window seconds (0 = since boot), max records, max Xid lines, deadline seconds, the kmsg path. /dev/kmsg gives
# one record per read ("PRI,SEQ,USEC,FLAGS;text\n" then " KEY=value" continuation lines); a saved copy of it (a
# file) gives many per read: both are split the same way.
_PY_KMSG = r"""
import collections, errno, json, os, sys, time
window, maxrec, maxx, dl, path = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
end = time.monotonic() + dl
out = {"uptime": None, "scanned": 0, "truncated": False, "lines": []}
try:
    with open("/proc/uptime") as f:
        out["uptime"] = float(f.read().split()[0])
except (OSError, ValueError):
    pass
keep = collections.deque(maxlen=maxx)
try:
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
except OSError as e:
    out["error"] = errno.errorcode.get(e.errno, str(e.errno))
else:
    try:
        while out["scanned"] < maxrec:
            if time.monotonic() > end:
                out["truncated"] = True
                break
            try:
                rec = os.read(fd, 16384)
            except BlockingIOError:
                break
            except OSError as e:
                if e.errno == errno.EPIPE:  # the record was overwritten while we read: go on with the next
                    continue
                out["error"] = errno.errorcode.get(e.errno, str(e.errno))
                break
            if not rec:
                break
            for ln in rec.decode("utf-8", "replace").split("\n"):
                if not ln or ln[0] == " ":
                    continue  # continuation lines (" SUBSYSTEM=pci") belong to the record before
                out["scanned"] += 1
                head, _, msg = ln.partition(";")
                if "NVRM: Xid" not in msg:
                    continue
                try:
                    t = int(head.split(",")[2]) / 1e6
                except (IndexError, ValueError):
                    t = None
                if window and t is not None and out["uptime"] is not None and t < out["uptime"] - window:
                    continue
                keep.append([t, msg])
        else:
            out["truncated"] = True
    finally:
        os.close(fd)
out["lines"] = list(keep)
print(json.dumps(out))
"""

_DMESG_TS = re.compile(r"^\s*(?:<\d+>)?\s*\[\s*(\d+\.\d+)\]\s*")


def window_of(ctx: GatherContext) -> float | None:
    """Seconds of kernel log to look at (policy checks.driver.xid.window), None for the whole boot."""
    w = (((ctx.policy or {}).get("checks") or {}).get("driver.xid") or {}).get("window")
    try:
        return float(w) if w not in (None, "", "boot") and float(w) > 0 else None
    except (TypeError, ValueError):
        return None


def parse_dmesg(text: str, uptime: float | None, window: float | None) -> list[list]:
    """`dmesg` output → [[seconds since boot | None, message], ...] of its Xid lines inside the window."""
    out = []
    for ln in (text or "").splitlines():
        if "NVRM: Xid" not in ln:
            continue
        m = _DMESG_TS.match(ln)
        t = float(m.group(1)) if m else None
        if window and t is not None and uptime is not None and t < uptime - window:
            continue
        out.append([t, ln[m.end():] if m else ln])
    return out[-MAX_XIDS:]


def kmsg_argv(python: list[str], window: float | None, t: float, kmsg: str = "/dev/kmsg") -> list[str]:
    return python_argv(python, "-c", _PY_KMSG, str(window or 0), str(MAX_RECORDS), str(MAX_XIDS), str(t), kmsg,
                       site=False)


def probe_argv(python: list[str], ctx: GatherContext) -> list[str]:
    """The kernel log reader's command line for this context (gather/prestart.py starts the same one at CLI entry)."""
    return kmsg_argv(python, window_of(ctx), min(ctx.timeout, 5.0))


def gather(host: Host, ctx: GatherContext) -> dict | None:
    return read_kernel_log(host, window_of(ctx), min(ctx.timeout, 5.0))


def _stat_of(host: Host, path: str, t: float):
    """`path` stat'ed once its links are followed; None when that cannot be said."""
    for _ in range(8):
        st = host.stat(path, timeout=t)
        if not st.exists or st.kind != "link" or not st.target:
            return st if st.exists else None
        path = st.target if st.target.startswith("/") else str(PurePosixPath(path).parent / st.target)
    return None


def _kind_of(host: Host, path: str, t: float) -> str | None:
    """What `path` is once its links are followed (char, file, ...), None when that cannot be said."""
    st = _stat_of(host, path, t)
    return st.kind if st is not None else None


def read_kernel_log(host: Host, window: float | None, t: float, kmsg: str = "/dev/kmsg",
                    device: bool | None = None) -> dict | None:
    """The kernel log's Xid lines through `host` (`kmsg` is another path only in tests: a saved kmsg dump).
    `device`: `kmsg` must be the kernel's character device (default: when it is /dev/kmsg)."""
    device = kmsg == "/dev/kmsg" if device is None else device
    res = host.run(kmsg_argv(host.python, window, t, kmsg), timeout=t + 1.0)
    if not_recorded(res):
        return None  # a snapshot from a gpudoctor that did not read the kernel log
    out: dict = {"source": None, "uptime": None, "window_s": window, "errors": [], "scanned": 0, "truncated": False,
                 "xids": []}
    try:
        d = json.loads(res.stdout) if res.ok else None
    except ValueError:
        d = None
    if d is None:
        out["errors"].append("kernel log probe " + res.describe())
        return out
    out["uptime"], out["scanned"], out["truncated"] = d.get("uptime"), d.get("scanned", 0), d.get("truncated", False)
    out["kind"] = None
    lines = d.get("lines") or []
    error = d.get("error")
    if error in ("EACCES", "EPERM", "ENXIO", "ENODEV") and device:
        # systemd's ProtectKernelLogs=yes bind-mounts its inaccessible node (c 0:0, mode 000, nodev) over /dev/kmsg
        st = _stat_of(host, kmsg, t)
        if st is not None and st.kind == "char" and (st.major, st.minor) == (0, 0):
            out["kind"] = "char"
            error += (": c 0:0, not the kernel's log device (a sandbox: systemd's ProtectKernelLogs=yes puts its "
                      "inaccessible node there)")
    if error is None and not out["scanned"]:
        # a real /dev/kmsg always holds this boot's records: 0 is a stand-in (a sandbox's empty file, /dev/null)
        out["kind"] = kind = _kind_of(host, kmsg, t)
        error = ("an empty regular file, not the kernel's log device (a sandbox: systemd's ProtectKernelLogs=yes "
                 "leaves one there)" if kind == "file" and device else
                 "0 records read, where this boot must have logged"
                 + {"char": " (a character device)", "file": " (a regular file)"}.get(kind or "", ""))
    if error:
        out["errors"].append(f"{kmsg} → {error}")
        lines = []
        dm = host.run(["dmesg"], timeout=t)
        if dm.ok and dm.stdout.strip():
            out["source"] = "dmesg"
            lines = parse_dmesg(dm.stdout, out["uptime"], window)
        elif dm.ok:
            out["errors"].append("dmesg → no output: the kernel log is not readable here")
        elif not not_recorded(dm):
            out["errors"].append("dmesg → " + ("not found" if dm.rc == 127 else dm.describe().split(" → ", 1)[-1]))
    else:
        out["source"] = kmsg
    for ts, msg in lines:
        x = parse_line(msg, ts)
        if x is not None:
            out["xids"].append(x.to_json())
    return out
