"""The probe agent: one stdlib python process per SSH connection that answers Host operations sent as JSON lines.

Runs ON THE TARGET, started once per connection as `python3 -I -S -c SOURCE` (gpudoctor/host/agent.py sends this
file's text). Without it every command and every stat/open/statvfs batch would start its own login shell and
python on the target: the shell sources the user's rc files each time (bash does for ssh commands), which on a
host with pyenv/conda initialisation costs ~0.1 s of CPU per command.

Protocol (one JSON object per line; stdin: requests, stdout: answers, in any order):
    -> {"hello": 1, "pid": N, "python": sys.executable}                         once, at start
    <- {"id": 7, "op": "read", "path": P, "max": N}      -> {"id": 7, "b": BASE64} | {"id": 7, "e": "ENOENT"}
    <- {"id": 8, "op": "stat", "paths": [...]}           -> {"id": 8, "r": {path: {...}}}
    <- {"id": 9, "op": "open", "paths": [...]}           -> {"id": 9, "r": {path: "OK" | "EPERM" | ...}}
    <- {"id": 10, "op": "listdir", "path": P}            -> {"id": 10, "entries": [...]} | {"id": 10, "error": E}
    <- {"id": 11, "op": "statvfs", "path": P}            -> {"id": 11, "total": ..., ...} | {"id": 11, "error": E}
    <- {"id": 12, "op": "run", "argv": [...], "timeout": S, "env": {...} | null, "path_prepend": [...], "py": N}
                                                         -> {"id": 12, "rc": N | null, "o": B64, "e": B64, "t": bool}
    <- {"id": 13, "op": "kill", "target": 12}            (no answer: kills request 12's process group)
    <- {"id": 14, "op": "batch", "ops": [{"op": "read", ...}, ...], "timeout": S}
                                                         -> {"id": 14, "r": [answer, ...]}  (unfinished: {"timeout": 1})

Each request runs in its own thread, so a hung read or command never blocks the others; the client keeps every
deadline and abandons what does not answer in time. A command runs in a new session (its own process group,
killed as a whole by `kill` or when `timeout` passes here, which backstops a client that went away); "py": N means
argv[:N] is the inventory's python, replaced by this interpreter (already resolved: no shim, no second lookup).
On EOF the agent waits for the commands still running (each bounded by its timeout) and exits.
Compatible with python >= 3.6; stdlib only.
"""

import base64
import errno
import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time

_out_lock = threading.Lock()
_runs = {}  # request id -> Popen
_runs_lock = threading.Lock()
_running = [0]  # commands in flight (guarded by _runs_lock)


def _errname(e):
    return errno.errorcode.get(e.errno, str(e.errno))


def _send(obj):
    data = (json.dumps(obj, separators=(",", ":")) + "\n").encode()
    with _out_lock:
        try:
            _write_all(data)
        except OSError:
            os._exit(0)  # the client is gone


def _write_all(data):
    view = memoryview(data)
    while view:
        view = view[os.write(1, view):]


def _read(req):
    n = int(req.get("max", 4 << 20))
    try:
        with open(req["path"], "rb", buffering=0) as f:
            chunks, left = [], n
            while left > 0:  # modest steps: one huge read() of a /proc/sys file fails with ENOMEM
                c = f.read(min(65536, left))
                if not c:
                    break
                chunks.append(c)
                left -= len(c)
        return {"b": base64.b64encode(b"".join(chunks)).decode()}
    except OSError as e:
        return {"e": _errname(e)}


def _stat_one(p):
    try:
        st = os.lstat(p)
    except OSError as e:
        return {"exists": False, "error": _errname(e)}
    m = st.st_mode
    kind = ("char" if stat.S_ISCHR(m) else "block" if stat.S_ISBLK(m) else "dir" if stat.S_ISDIR(m)
            else "link" if stat.S_ISLNK(m) else "file" if stat.S_ISREG(m) else "other")
    d = {"exists": True, "kind": kind, "mode": stat.S_IMODE(m), "uid": st.st_uid, "gid": st.st_gid,
         "size": st.st_size, "mtime": st.st_mtime}
    if kind in ("char", "block"):
        d["major"], d["minor"] = os.major(st.st_rdev), os.minor(st.st_rdev)
    if kind == "link":
        try:
            d["target"] = os.readlink(p)
        except OSError:
            pass
    return d


def _open_one(p, access="rw"):
    try:
        fd = os.open(p, (os.O_RDONLY if access == "r" else os.O_RDWR) | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
        os.close(fd)
        return "OK"
    except OSError as e:
        return _errname(e)


def _listdir(req):
    try:
        return {"entries": sorted(os.listdir(req["path"]))}
    except OSError as e:
        return {"error": _errname(e)}


def _statvfs(req):
    try:
        s = os.statvfs(req["path"])
    except OSError as e:
        return {"error": _errname(e)}
    return {"total": s.f_blocks * s.f_frsize, "free": s.f_bfree * s.f_frsize, "avail": s.f_bavail * s.f_frsize,
            "readonly": bool(s.f_flag & os.ST_RDONLY)}


def _killpg(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        try:
            proc.kill()
        except OSError:
            pass


def _run(req):
    argv = [str(a) for a in req["argv"]]
    n = int(req.get("py") or 0)
    if n and sys.executable:
        argv = [sys.executable] + argv[n:]
    env = dict(os.environ)
    if req.get("path_prepend"):
        env["PATH"] = ":".join(req["path_prepend"] + [env.get("PATH", "")])
    env.update(req.get("env") or {})
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=env, start_new_session=True, close_fds=True)
    except OSError as e:  # as a shell's exec reports it: 127 not found, 126 found but not runnable
        code = 127 if e.errno == errno.ENOENT else 126
        msg = "%s: %s" % (argv[0], "command not found" if code == 127 else os.strerror(e.errno or 0))
        return {"rc": code, "o": "", "e": base64.b64encode(msg.encode() + b"\n").decode(), "t": False}
    with _runs_lock:
        _runs[req["id"]] = proc
        _running[0] += 1
    try:
        try:
            out, err = proc.communicate(timeout=float(req.get("timeout") or 60))
            timed_out = False
        except subprocess.TimeoutExpired:
            _killpg(proc)
            try:
                out, err = proc.communicate(timeout=1.0)
            except subprocess.TimeoutExpired:  # stuck in the kernel: report without its output
                out, err = b"", b""
            timed_out = True
    finally:
        with _runs_lock:
            _runs.pop(req["id"], None)
            _running[0] -= 1
    rc = proc.returncode
    # A command killed by a signal has no exit status (OpenSSH sends exit-signal; paramiko reports -1).
    return {"rc": None if timed_out else (-1 if rc is not None and rc < 0 else rc),
            "o": base64.b64encode(out).decode(), "e": base64.b64encode(err).decode(), "t": timed_out}


def _batch(req):
    """Several read-only operations side by side (a hung one never holds up the rest); at the deadline the
    unfinished ones answer {"timeout": 1}."""
    ops = req.get("ops") or []
    deadline = time.monotonic() + float(req.get("timeout") or 3.0)
    results = [None] * len(ops)

    def work(i, op):
        fn = _BATCHABLE.get(op.get("op"))
        try:
            results[i] = fn(op) if fn is not None else {"bad": "not a batch operation: %r" % (op.get("op"),)}
        except Exception as e:  # noqa: BLE001
            results[i] = {"bad": "%s: %s" % (type(e).__name__, e)}

    threads = []
    for i, op in enumerate(ops):
        t = threading.Thread(target=work, args=(i, op))
        t.daemon = True
        t.start()
        threads.append(t)
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    return {"r": [r if r is not None else {"timeout": 1} for r in results]}


def _kill(req):
    with _runs_lock:
        proc = _runs.get(req.get("target"))
    if proc is not None:
        _killpg(proc)
    return None


_BATCHABLE = {
    "read": _read,
    "stat": lambda req: {"r": dict((p, _stat_one(p)) for p in req["paths"])},
    "open": lambda req: {"r": dict((p, _open_one(p, req.get("access", "rw"))) for p in req["paths"])},
    "listdir": _listdir,
    "statvfs": _statvfs,
}
OPS = dict(_BATCHABLE, run=_run, kill=_kill, batch=_batch)


def _serve(req):
    try:
        fn = OPS.get(req.get("op"))
        res = fn(req) if fn is not None else {"bad": "unknown op %r" % (req.get("op"),)}
    except Exception as e:  # noqa: BLE001 - one broken request never takes the agent down
        res = {"bad": "%s: %s" % (type(e).__name__, e)}
    if res is not None:
        res["id"] = req.get("id")
        _send(res)


def main():
    _send({"hello": 1, "pid": os.getpid(), "python": sys.executable})
    buf = b""
    while True:
        try:
            chunk = os.read(0, 65536)
        except OSError:
            chunk = b""
        if not chunk:
            break
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            try:
                req = json.loads(line.decode())
            except ValueError:
                continue
            t = threading.Thread(target=_serve, args=(req,))
            t.daemon = True
            t.start()
    # stdin closed: the client is done (or gone). Let running commands reach their own deadlines, then leave
    # without waiting for reads stuck in the kernel (daemon threads).
    while True:
        with _runs_lock:
            if not _running[0]:
                break
        time.sleep(0.05)
    os._exit(0)


if __name__ == "__main__":
    main()
