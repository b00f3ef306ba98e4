"""Every Host operation on the target's files, written once: read, stat, open, listdir, statvfs, a batch of them,
and the writes (write, rename, unlink, makedirs, chmod, mknod).

The same functions run three ways; the transports differ only in how a request reaches them: in process
(LocalHost calls serve()), inside the SSH probe agent (agent_prog.py is sent after this file's text, one process
per connection), or one-shot where no agent can start (`python -I -S -c SOURCE REQUEST`, one process per
request). This text runs on the target: stdlib only, python >= 3.6, no gpudoctor imports.

Requests and answers (JSON objects; errno names such as "ENOENT"):
    {"op": "read", "path": P, "max": N}                     -> {"b": BASE64} | {"e": ERRNO}
    {"op": "stat", "paths": [...], "timeout": S}            -> {"r": {P: {"exists": ..., "kind": ..., ...}}}
    {"op": "open", "paths": [...], "access": "rw"|"r", "timeout": S}  -> {"r": {P: "OK" | ERRNO}}
    {"op": "listdir", "path": P}                            -> {"entries": [...]} | {"error": ERRNO}
    {"op": "statvfs", "path": P}                            -> {"total", "free", "avail", "readonly"} | {"error": ERRNO}
    {"op": "batch", "ops": [request, ...], "timeout": S}    -> {"r": [answer | {"timeout": 1}, ...]}
    {"op": "write", "path": P, "data": BASE64, "mode": M|null, "owner": [U, G]|null, "exclusive": bool}
    {"op": "rename", "src": A, "dst": B} {"op": "unlink", "path": P} {"op": "makedirs", "path": P, "mode": M}
    {"op": "chmod", "path": P, "mode": M} {"op": "mknod", "path": P, "mode": M, "major": N, "minor": N}
                                                            -> {"ok": 1} | {"errno": N, "msg": STRERROR}
stat and open answer path by path: a path still unanswered at the deadline is missing from "r" (the caller names
it TIMEOUT: the node that hangs is the finding). Anything unexpected answers {"bad": "..."}.
"""

import base64
import errno
import json
import os
import stat
import sys
import threading
import time


def _errname(e):
    return errno.errorcode.get(e.errno or 0, str(e.errno))


# --- reads ----------------------------------------------------------------------------------------

def op_read(req):
    left = int(req.get("max", 4 << 20))
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; a FIFO is refused at once, never read (it can block)
        fd = os.open(req["path"], os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            os.close(fd)
            return {"e": "FIFO"}
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", buffering=0) as f:
            chunks = []
            while left > 0:  # modest steps: one huge read() of a /proc/sys file fails with ENOMEM
                c = f.read(min(65536, left))
                if not c:
                    break
                chunks.append(c)
                left -= len(c)
        return {"b": base64.b64encode(b"".join(chunks)).decode()}
    except OSError as e:
        return {"e": _errname(e)}


def stat_one(p):
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


def open_one(p, access="rw"):
    """O_RDWR as CUDA opens its nodes; O_RDONLY ("r") as a capability node's consumer does."""
    try:
        fd = os.open(p, (os.O_RDONLY if access == "r" else os.O_RDWR) | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
        os.close(fd)
        return "OK"
    except OSError as e:
        return _errname(e)


def _each(fn, req):
    """fn over req["paths"] in order, in a worker: what answered by the deadline (a hung open stays behind)."""
    out = {}

    def work():
        for p in req["paths"]:
            out[p] = fn(p)

    t = threading.Thread(target=work)
    t.daemon = True
    t.start()
    t.join(float(req.get("timeout") or 5.0))
    return {"r": dict(out)}


def op_stat(req):
    return _each(stat_one, req)


def op_open(req):
    access = req.get("access", "rw")
    return _each(lambda p: open_one(p, access), req)


def op_listdir(req):
    try:
        return {"entries": sorted(os.listdir(req["path"]))}
    except OSError as e:
        return {"error": _errname(e)}


def op_statvfs(req):
    try:
        s = os.statvfs(req["path"])
    except OSError as e:
        return {"error": _errname(e)}
    return {"total": s.f_blocks * s.f_frsize, "free": s.f_bfree * s.f_frsize, "avail": s.f_bavail * s.f_frsize,
            "readonly": bool(s.f_flag & os.ST_RDONLY)}


def op_batch(req):
    """Several reads side by side (a hung one never holds up the rest); unfinished at the deadline: timeout."""
    ops = req.get("ops") or []
    timeout = float(req.get("timeout") or 3.0)
    deadline = time.monotonic() + timeout
    results = [None] * len(ops)

    def work(i, sub):
        fn = READS.get(sub.get("op"))
        if fn is None:
            results[i] = {"bad": "not a batch operation: %r" % (sub.get("op"),)}
            return
        results[i] = _guarded(fn, dict(sub, timeout=timeout))

    threads = []
    for i, sub in enumerate(ops):
        t = threading.Thread(target=work, args=(i, sub))
        t.daemon = True
        t.start()
        threads.append(t)
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    return {"r": [r if r is not None else {"timeout": 1} for r in results]}


# --- the mutation seam: every change gpudoctor makes to a file on a host, local or remote, is one of these ----------
# RECORDER is None in production (one global read per step). The crash-point harness (tests/crash) sets it to a
# callable(op, path, *detail) that is told of each step BEFORE it is made, so it can record the order or end the
# process between two steps. Local writers (files/atomic.py, model/stage.py, remedy.py's lock and audit log, the
# recovery and daemon state) call the same functions; the SSH agent and the one-shot carrier run this text.

RECORDER = None


def fs_note(op, path, *detail, **at):
    """Tell the recorder of one mutating step about to be made (for primitives done in place: a copy's chunk).
    at: fd= (the open file the step acts on) or dir_fd= (path is relative to it): the recorder is told the
    absolute path, so a trace names each file one way however it was opened (the power-loss states replay it)."""
    r = RECORDER
    if r is not None:
        r(op, _where(path, **at), *detail)


def _where(path, fd=None, dir_fd=None):
    """The absolute path a step acts on (only while recording)."""
    try:
        if fd is not None:
            return os.readlink("/proc/self/fd/%d" % fd)
        if dir_fd is not None:
            return os.path.join(os.readlink("/proc/self/fd/%d" % dir_fd), path)
    except OSError:
        pass
    return os.path.abspath(path) if path else path


def fs_open(path, flags, mode=0o666, dir_fd=None):
    """open(2) for writing: "create" (O_CREAT), "truncate" (O_TRUNC) or "open-write". With dir_fd (an openat walk
    that refuses links), path is relative to it and recorded as given."""
    op = "truncate" if flags & os.O_TRUNC else "create" if flags & os.O_CREAT else "open-write"
    fs_note(op, path, dir_fd=dir_fd)
    return os.open(path, flags, mode, dir_fd=dir_fd)


def fs_write(fd, data, path, offset=None):
    """The whole of data at the fd's position (or at offset: pwrite)."""
    fs_note("write", path, len(data), fd=fd)
    view = memoryview(data)
    while view:
        if offset is None:
            n = os.write(fd, view)
        else:
            n = os.pwrite(fd, view, offset)
            offset += n
        view = view[n:]


def fs_fsync(fd, path):
    fs_note("fsync", path, fd=fd)
    os.fsync(fd)


def fs_fsync_dir(path, fd=None):
    """fsync a directory so a rename or unlink in it survives a crash; best effort (pmxcfs refuses it). fd: the
    directory already open (an openat walk): fsynced, left open."""
    fs_note("fsync-dir", path or ".", fd=fd)
    if fd is not None:
        try:
            os.fsync(fd)
        except OSError:
            pass
        return
    try:
        fd = os.open(path or ".", os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def fs_rename(src, dst, dir_fd=None):
    """rename(2), then fsync of the destination's directory: the rename is durable when this returns. dir_fd: both
    names are relative to that directory (renameat)."""
    fs_note("rename", src, _where(dst, dir_fd=dir_fd) if RECORDER is not None else dst, dir_fd=dir_fd)
    os.rename(src, dst, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    fs_fsync_dir(os.path.dirname(dst), dir_fd)


def fs_unlink(path, missing_ok=False, dir_fd=None):
    fs_note("unlink", path, dir_fd=dir_fd)
    try:
        os.unlink(path, dir_fd=dir_fd)
    except FileNotFoundError:
        if not missing_ok:
            raise


def fs_mkdir(path, mode=0o777, dir_fd=None):
    """One mkdir(2) (mkdirat with dir_fd)."""
    fs_note("mkdir", path, dir_fd=dir_fd)
    os.mkdir(path, mode, dir_fd=dir_fd)


def fs_makedirs(path, mode=0o777):
    """os.makedirs(exist_ok=True), one recorded mkdir per missing component."""
    if os.path.isdir(path):
        return
    parent = os.path.dirname(path.rstrip("/"))
    if parent and parent != path and not os.path.exists(parent):  # as os.makedirs: a file there is ENOTDIR below
        fs_makedirs(parent, mode)
    fs_note("mkdir", path)
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        if not os.path.isdir(path):
            raise


def fs_chmod(path, mode, fd=None):
    fs_note("chmod", path, mode, fd=fd)
    if fd is None:
        os.chmod(path, mode)
    else:
        os.fchmod(fd, mode)


def fs_chown(path, uid, gid, fd=None):
    fs_note("chown", path, uid, gid, fd=fd)
    if fd is None:
        os.chown(path, uid, gid)
    else:
        os.fchown(fd, uid, gid)


def fs_ftruncate(fd, size, path):
    fs_note("truncate", path, size, fd=fd)
    os.ftruncate(fd, size)


def fs_mknod(path, mode, device):
    fs_note("mknod", path)
    os.mknod(path, mode, device)


# --- writes (remedies only, through gpudoctor.files.edit) ---------------------------------------------------

def _done(fn):
    try:
        fn()
        return {"ok": 1}
    except OSError as e:
        return {"errno": e.errno or 0, "msg": e.strerror or str(e)}


def op_write(req):
    """Create (or truncate, unless exclusive: EEXIST) and fsync; mode and owner set only where they differ."""
    path, mode, owner = req["path"], req.get("mode"), req.get("owner")
    data = base64.b64decode(req.get("data") or "")

    def write():
        flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | (os.O_EXCL if req.get("exclusive") else os.O_TRUNC)
        fd = fs_open(path, flags, 0o666 if mode is None else mode)
        try:
            fs_write(fd, data, path)
            st = os.fstat(fd)
            if mode is not None and stat.S_IMODE(st.st_mode) != mode:
                fs_chmod(path, mode, fd)  # cut by the umask
            if owner is not None and (st.st_uid, st.st_gid) != tuple(owner):
                fs_chown(path, owner[0], owner[1], fd)
            fs_fsync(fd, path)
        finally:
            os.close(fd)

    return _done(write)


def op_rename(req):
    # fs_fsync_dir is best effort: some filesystems (pmxcfs) refuse fsync on a directory; the rename itself stands
    return _done(lambda: fs_rename(req["src"], req["dst"]))


def op_unlink(req):
    def rm():
        fs_unlink(req["path"])
        fs_fsync_dir(os.path.dirname(req["path"]))

    return _done(rm)


def op_mknod(req):
    path, mode = req["path"], int(req["mode"])

    def mk():
        fs_mknod(path, stat.S_IFCHR | mode, os.makedev(int(req["major"]), int(req["minor"])))
        try:
            if stat.S_IMODE(os.lstat(path).st_mode) != mode:
                fs_chmod(path, mode)  # mknod's mode was cut by the umask
        except OSError:
            fs_unlink(path)
            raise

    return _done(mk)


READS = {"read": op_read, "stat": op_stat, "open": op_open, "listdir": op_listdir, "statvfs": op_statvfs}
WRITES = {
    "write": op_write,
    "rename": op_rename,
    "unlink": op_unlink,
    "makedirs": lambda req: _done(lambda: fs_makedirs(req["path"], int(req.get("mode", 0o700)))),
    "chmod": lambda req: _done(lambda: fs_chmod(req["path"], int(req["mode"]))),
    "mknod": op_mknod,
}
OPS = dict(READS, batch=op_batch, **WRITES)


def _guarded(fn, req):
    try:
        return fn(req)
    except Exception as e:  # noqa: BLE001 - one broken request never takes its carrier down
        return {"bad": "%s: %s" % (type(e).__name__, e)}


def serve(req):
    """The answer to one request (see the module docstring)."""
    fn = OPS.get(req.get("op"))
    return _guarded(fn, req) if fn is not None else {"bad": "unknown op %r" % (req.get("op"),)}


def _oneshot():
    """`python -I -S -c SOURCE REQUEST` (or `- LENGTH`: the request is LENGTH bytes on stdin): print the answer and
    leave at once. A request cut short (the connection lost mid-send) is refused whole: nothing is written."""
    if sys.argv[1:2] == ["-"]:
        raw = sys.stdin.buffer.read()
        if len(raw) != int(sys.argv[2]):
            _answer({"errno": errno.EIO, "msg": "short input: %d of %s bytes" % (len(raw), sys.argv[2])})
        raw = raw.decode()
    else:
        raw = sys.argv[1]
    try:
        ans = serve(json.loads(raw))
    except ValueError:
        ans = {"bad": "broken request (%d bytes)" % len(raw)}
    _answer(ans)


def _answer(ans):
    sys.stdout.write(json.dumps(ans) + "\n")
    sys.stdout.flush()
    os._exit(0)  # without waiting for a read stuck in the kernel
