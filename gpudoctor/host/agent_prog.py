"""The probe agent: one stdlib python process per SSH connection that answers Host operations sent as JSON lines.

Runs ON THE TARGET, started once per connection as `python3 -I -S -c SOURCE`, SOURCE being host/ops.py's text (the
file operations, written once) followed by this file's (gpudoctor/host/agent.py sends them). It adds what only a
long-lived process can do: commands (run, kill) and many requests in flight at once. Without it every command and every stat/open/statvfs batch would start its own login shell and
python on the target: the shell sources the user's rc files each time (bash does for ssh commands), which on a
host with pyenv/conda initialisation costs ~0.1 s of CPU per command.

Protocol (one JSON object per line; stdin: requests, stdout: answers, in any order): every request of host/ops.py
with an "id" added (answers carry it back), and
    -> {"hello": 1, "pid": N, "python": sys.executable}                         once, at start
    <- {"id": 12, "op": "run", "argv": [...], "timeout": S, "env": {...} | null, "path_prepend": [...], "py": N}
                                                         -> {"id": 12, "rc": N | null, "o": B64, "e": B64, "t": bool}
    <- {"id": 13, "op": "kill", "target": 12}            (no answer: kills request 12's process group)

Each request runs in its own thread, so a hung read or command never blocks the others; the client keeps every
deadline and abandons what does not answer in time. A command runs in a new session (its own process group,
killed as a whole by `kill` or when `timeout` passes here, which backstops a client that went away); "py": N means
argv[:N] is the inventory's python, replaced by this interpreter (already resolved: no shim, no second lookup).
On EOF (the client is done, gone or interrupted) the agent kills the commands still running and exits.
Compatible with python >= 3.6; stdlib only.
"""

import base64
import errno
import json
import os
import signal
import subprocess
import sys
import threading
import time

try:  # on the target host/ops.py's text comes first; importing is for reading this file on its own
    from gpudoctor.host.ops import OPS, _guarded
except ImportError:
    pass

_out_lock = threading.Lock()
_runs = {}  # request id -> Popen
_runs_lock = threading.Lock()
_running = [0]  # commands in flight (guarded by _runs_lock)


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


def _kill(req):
    with _runs_lock:
        proc = _runs.get(req.get("target"))
    if proc is not None:
        _killpg(proc)
    return None


AGENT_OPS = dict(OPS, run=_run, kill=_kill)


def _serve(req):
    fn = AGENT_OPS.get(req.get("op"))
    res = _guarded(fn, req) if fn is not None else {"bad": "unknown op %r" % (req.get("op"),)}
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
    # stdin closed: the client is done (or gone, interrupted): nobody will read an answer. Kill what still runs
    # (process group and all) so nothing of gpudoctor outlives it on the target, then leave without waiting for
    # reads stuck in the kernel (daemon threads).
    with _runs_lock:
        procs = list(_runs.values())
    for proc in procs:
        _killpg(proc)
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        with _runs_lock:
            if not _running[0]:
                break
        time.sleep(0.02)
    os._exit(0)


if __name__ == "__main__":
    main()
