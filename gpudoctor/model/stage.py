"""`model stage`: copy a model from persistent storage into tmpfs, in parallel, never leaving DST looking complete early.

Order of an apply, and why:
  1. lock DST; record "staging" in the persistent state dir; remove DST's marker, index and config.json first —
     from this moment DST verifies as incomplete;
  2. copy the weights (chunks of every shard, in parallel) and then the other files, each into `.NAME.gpudoctor-part`,
     renamed to NAME only when all its bytes are written (a visible file is always whole);
  3. copy the index, then config.json: only now can DST look complete, and every other file is already there;
  4. verify DST by headers and sizes; write the boot-id marker last (atomic), then the persistent record.
A SIGKILL anywhere leaves DST incomplete (no config/index) or complete in truth; a rerun skips whole shards.
"""

from __future__ import annotations

import errno
import fnmatch
import json
import os
import socket
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field

from gpudoctor.errors import InputError, LockHeld, RemedyError
from gpudoctor.files import safe, trust
from gpudoctor.host import ops as fs  # the mutation seam (tests/crash)
from gpudoctor.model import human_bytes, probe

CHUNK = 64 << 20  # work unit: a 64 MiB range of one file
STEP = 8 << 20  # bytes per copy syscall (progress granularity)
SMALL = 16 << 20  # files below this are "other" unless they are weights by suffix
DEFAULT_JOBS = min(8, os.cpu_count() or 1)


@dataclass
class StageFile:
    name: str  # path relative to the model directory (and to DST)
    src: str  # the real file read (symlinks to HF blobs resolved)
    size: int
    mode: int
    mtime_ns: int
    role: str  # weight | other | index | config
    action: str = "copy"  # copy | skip
    why: str = ""
    sha256: str | None = None  # known LFS hash (HF cache blob name)


@dataclass
class StagePlan:
    src: str
    src_kind: str
    revision: str | None
    source_dir: str
    dst: str
    files: list[StageFile]
    dst_exists: bool
    mount: dict | None
    statvfs: dict
    cgroup: dict
    meminfo: dict
    boot_id: str | None
    to_copy: int = 0
    to_free: int = 0
    stale: list[str] = field(default_factory=list)  # DST entries removed before copying
    extra: list[str] = field(default_factory=list)  # DST files not in the source (left alone)
    busy: list[dict] = field(default_factory=list)
    room: dict = field(default_factory=dict)
    refusals: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def tmpfs(self) -> bool:
        return bool(self.mount and self.mount.get("fstype") in ("tmpfs", "ramfs"))

    @property
    def nothing_to_copy(self) -> bool:
        return not any(f.action == "copy" for f in self.files)

    def to_json(self) -> dict:
        d = asdict(self)
        d["tmpfs"] = self.tmpfs
        return d


def _role(name: str, size: int) -> str:
    base = name.rsplit("/", 1)[-1]
    if name.endswith(probe.INDEX_SUFFIX) and "/" not in name:
        return "index"
    if name == "config.json":
        return "config"
    if base.endswith(probe.WEIGHT_SUFFIXES) or size >= SMALL:
        return "weight"
    return "other"


def _inside(a: str, b: str) -> bool:
    """a is b or lies under b (both real paths)."""
    return a == b or a.startswith(b.rstrip("/") + "/")


def resolve_hub(repo_id: str, revision: str) -> tuple[str, str]:
    """Download (or find) REPO in the Hugging Face cache; returns (repo folder, commit). Needs network and
    huggingface_hub; honours HF_HOME / HF_HUB_CACHE / HF_HUB_OFFLINE like every HF tool."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise InputError("--from-hub needs the huggingface_hub package (pip install huggingface_hub)") from None
    snap = snapshot_download(repo_id=repo_id, revision=revision)
    return os.path.dirname(os.path.dirname(snap)), os.path.basename(snap)


BUSY_SCAN_S = 15.0


def busy_under(dst: str, timeout: float | None = None) -> list[dict]:
    """Processes (not this one) holding a file open or mapped under dst: [{pid, name, files}]. A process whose /proc
    entries do not answer within the deadline (its mmap lock held by a hung fault) is reported as
    {pid, name, files: [], stuck: True}: it cannot be proven not to use DST."""
    from gpudoctor.host.local import with_deadline

    state: dict = {"pid": None, "name": "?"}
    timeout = BUSY_SCAN_S if timeout is None else timeout
    out = with_deadline(lambda: _scan(os.path.realpath(dst), state), timeout, None)
    if out is None:
        return [{"pid": state["pid"], "name": state["name"], "files": [], "stuck": True}]
    return out


def _scan(real: str, state: dict) -> list[dict]:
    import psutil

    me = os.getpid()
    out = []
    for p in psutil.process_iter(["pid", "name"]):
        if p.pid == me:
            continue
        state["pid"], state["name"] = p.pid, p.info.get("name") or "?"
        hits: set[str] = set()
        try:
            hits.update(f.path for f in p.open_files() if _inside(f.path, real))
        except (psutil.Error, OSError):
            pass
        try:  # mmap'ed shards (safetensors loaders map them) stay busy after close()
            with open(f"/proc/{p.pid}/maps") as fh:
                for line in fh:
                    parts = line.split(None, 5)
                    if len(parts) == 6:
                        path = parts[5].rstrip("\n").removesuffix(" (deleted)")
                        if path.startswith("/") and _inside(path, real):
                            hits.add(path)
        except OSError:
            pass
        if hits:
            out.append({"pid": p.pid, "name": p.info.get("name") or "?", "files": sorted(hits)[:5]})
    return out


def plan_stage(src: str, dst: str, *, revision: str = "main", check_busy: bool = True,
               exclude: tuple[str, ...] = ()) -> StagePlan:
    """What a stage of src into dst would do, and whether it must refuse. Reads only; raises InputError for bad
    paths. `exclude`: fnmatch patterns of source-relative names not to copy (e.g. "original/*")."""
    rep = probe.verify_model(src, revision)
    if rep["bad_input"]:
        raise InputError(f"--from: {rep['bad_input']}", path=src)
    unresolved = [p for p in rep["problems"] if p["kind"] in ("ref_missing", "snapshot_missing")]
    if rep["dir"] is None or unresolved:
        raise InputError("--from: " + "; ".join(f"{p['kind']} {p['file']}: {p['detail']}" for p in unresolved),
                         path=src)
    dst = os.path.abspath(dst)
    src_real, dst_real = os.path.realpath(rep["dir"]), os.path.realpath(dst)
    if _inside(dst_real, os.path.realpath(src)) or _inside(src_real, dst_real):
        raise InputError("--to must not be the source or lie inside it (or contain it)", path=dst)
    if os.path.lexists(dst) and not os.path.isdir(dst):
        raise InputError("--to exists and is not a directory", path=dst)
    if os.path.isdir(dst) and probe.is_hf_repo(dst):
        raise InputError("--to is a Hugging Face cache folder; stage into a plain directory", path=dst)

    files, _, _ = probe.walk_files(rep["dir"])
    src_root = os.path.realpath(src)
    outside = sorted(n for n, info in files.items() if info["link"] and not _inside(info["real"], src_root))
    if outside:
        n = outside[0]
        raise InputError(f"--from: {n} is a link to {files[n]['real']}, outside the source; gpudoctor does not copy "
                         f"what a link outside the model names" + (f" (+{len(outside) - 1} more)"
                                                                   if len(outside) > 1 else ""), path=src)
    _check_dst(dst)
    excluded = sorted(n for n in files if any(fnmatch.fnmatch(n, pat) for pat in exclude))
    for n in excluded:
        del files[n]
    plan_files = []
    for name, info in sorted(files.items()):
        sha = None
        if rep["kind"] == "hf_repo" and probe.HEX64.match(os.path.basename(info["real"])):
            sha = os.path.basename(info["real"])
        plan_files.append(StageFile(name, info["real"], info["size"], info["mode"], info["mtime_ns"],
                                    _role(name, info["size"]), sha256=sha))

    mounts = probe.parse_mounts(probe.read_text("/proc/mounts") or "")
    near = probe.nearest_existing(dst)
    plan = StagePlan(src=os.path.abspath(src), src_kind=rep["kind"], revision=rep["revision"], source_dir=rep["dir"],
                     dst=dst, files=plan_files, dst_exists=os.path.isdir(dst),
                     mount=probe.mount_of(os.path.realpath(near), mounts), statvfs=probe.statvfs(near),
                     cgroup=probe.memory_cgroup("", mounts), meminfo=probe.meminfo(""), boot_id=probe.boot_id())
    if not rep["complete"]:
        shown = "; ".join(_problem_line(p) for p in rep["problems"][:3])
        more = f" (+{len(rep['problems']) - 3} more)" if len(rep["problems"]) > 3 else ""
        plan.refusals.append(f"the source is incomplete: {shown}{more}")

    # what DST already has: whole shards are kept, anything else in the way is removed first
    have, _, partials = probe.walk_files(dst) if plan.dst_exists else ({}, [], [])
    for f in plan_files:
        cur = have.get(f.name)
        if cur is None:
            f.why = "absent in DST"
            continue
        if cur["link"] is None and cur["size"] == f.size:
            if f.name.endswith(".safetensors"):
                hb = probe.header_bytes(os.path.join(dst, f.name))
                if hb is not None and hb == probe.header_bytes(f.src):
                    f.action, f.why = "skip", "present: same size and header"
                    continue
            elif cur["mtime_ns"] == f.mtime_ns:
                f.action, f.why = "skip", "present: same size and mtime"
                continue
        f.why = "differs in DST: replaced"
        plan.stale.append(f.name)
        plan.to_free += cur["size"] if cur["link"] is None else 0
    if not plan.nothing_to_copy:
        for f in plan_files:  # rewritten last so that DST cannot look complete before it is
            if f.role in ("index", "config") and f.action == "skip":
                f.action, f.why = "copy", "rewritten last (DST looks complete only at the end)"
                plan.stale.append(f.name)
                plan.to_free += f.size
    for p in partials:
        plan.stale.append(p)
        try:
            plan.to_free += os.stat(os.path.join(dst, p)).st_size
        except OSError:
            pass
    names = {f.name for f in plan_files}
    plan.extra = sorted(n for n in have if n not in names)
    plan.to_copy = sum(f.size for f in plan_files if f.action == "copy")
    _check_room(plan)
    if check_busy and plan.dst_exists and not plan.nothing_to_copy:
        plan.busy = busy_under(dst)
        for b in plan.busy:
            if b.get("stuck"):
                plan.refusals.append(f"could not tell whether processes use {dst}: /proc/{b['pid']} ({b['name']}) did "
                                     f"not answer in {BUSY_SCAN_S:g} s (a process stuck in the kernel?)")
                continue
            plan.refusals.append(f"pid {b['pid']} ({b['name']}) has files open under {dst}: "
                                 + ", ".join(os.path.relpath(x, os.path.realpath(dst)) for x in b["files"][:3]))
    if not plan.tmpfs and plan.mount:
        plan.notes.append(f"{dst} is on {plan.mount['fstype']} ({plan.mount['mountpoint']}), not tmpfs: "
                          "a plain copy that survives reboots")
    if excluded:
        plan.notes.append(f"excluded {len(excluded)} file(s) by --exclude: " + ", ".join(excluded[:3])
                          + (" ..." if len(excluded) > 3 else ""))
    dup = [f for f in plan_files if f.name.startswith("original/") and f.role == "weight"]
    if dup and rep["weights"]["shards"]:
        plan.notes.append(f"original/ holds {human_bytes(sum(f.size for f in dup))} of weights in another format "
                          "(servers load the top-level shards); --exclude 'original/*' skips them")
    if plan.extra:
        plan.notes.append(f"{len(plan.extra)} file(s) in DST are not in the source and are left alone: "
                          + ", ".join(plan.extra[:3]))
    return plan


def _check_dst(dst: str) -> None:
    """Refuse before anything runs: DST (or the directory it would be made in) reached through a link another user
    controls, DST a link, or DST a directory another user owns or can write (safe.py's rules; Unsafe, exit 3)."""
    if os.path.islink(dst):
        st = os.lstat(dst)
        raise safe.Unsafe(f"--to is a link (owned by {safe.owner_name(st.st_uid)}); gpudoctor stages into a real "
                          "directory only", path=dst)
    near = probe.nearest_existing(dst)
    fd = safe.open_dir(near if os.path.isdir(near) else os.path.dirname(near), strict=True)
    try:
        if os.path.abspath(near) == os.path.abspath(dst):
            safe.check_owned(fd, dst)
    finally:
        os.close(fd)


def _problem_line(p: dict) -> str:
    sizes = ""
    if p.get("expected") is not None or p.get("actual") is not None:
        exp = "?" if p.get("expected") is None else p["expected"]
        act = "absent" if p.get("actual") is None else p["actual"]
        sizes = f" (expected {exp} bytes, actual {act})"
    return f"{p['kind']} {p.get('file') or ''}{sizes}".strip()


def _check_room(plan: StagePlan) -> None:
    need = plan.to_copy
    room = {"needed": need, "freed_first": plan.to_free, "fs_avail": plan.statvfs.get("avail")}
    if isinstance(room["fs_avail"], int) and need > room["fs_avail"] + plan.to_free:
        plan.refusals.append(f"{plan.mount['mountpoint'] if plan.mount else plan.dst} has "
                             f"{human_bytes(room['fs_avail'] + plan.to_free)} available, the stage needs "
                             f"{human_bytes(need)} ({need} bytes)")
    if plan.tmpfs:
        head = plan.cgroup.get("headroom")
        room["cgroup_headroom"] = head
        if isinstance(head, int) and need > head + plan.to_free:
            plan.refusals.append(f"the memory cgroup {plan.cgroup.get('path')} has {human_bytes(head)} headroom "
                                 f"(limit {human_bytes(plan.cgroup.get('limit'))}); tmpfs pages count against it "
                                 f"and the stage needs {human_bytes(need)}")
        avail = plan.meminfo.get("MemAvailable")
        room["mem_available"] = avail
        if isinstance(avail, int) and need > avail + plan.to_free:
            plan.refusals.append(f"MemAvailable is {human_bytes(avail)} (/proc/meminfo); tmpfs lives in RAM and the "
                                 f"stage needs {human_bytes(need)}")
    plan.room = room


# --- applying ---------------------------------------------------------------------------------------------------
def _part(path: str) -> str:
    d, b = os.path.split(path)
    return os.path.join(d, f".{b}{probe.PART_SUFFIX}")


class _Copier:
    """Copies byte ranges with the fastest primitive the kernel allows between the two filesystems."""

    def __init__(self, method: str):
        self.method = method  # auto | copy_file_range | sendfile | rw
        self._local = threading.local()

    _FALLBACK = (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL, errno.ENOTSUP)

    def copy(self, sfd: int, dfd: int, tmp: str, off: int, length: int, tick) -> None:
        """Copy [off, off+length) of sfd into dfd. auto = copy_file_range (same filesystem,
        may reflink), else sendfile (one in-kernel copy), else pread/pwrite; each refuses before copying a byte."""
        method = self.method  # read once: another thread may switch it while this one copies
        fs.fs_note("write", tmp, off, length)  # one chunk: a step of the mutation seam
        if method in ("auto", "copy_file_range"):
            try:
                self._cfr(sfd, dfd, off, length, tick)
                return
            except OSError as exc:
                if method != "auto" or exc.errno not in self._FALLBACK:
                    raise
                self.method = method = "sendfile"  # across filesystems (disk -> tmpfs) the kernel says EXDEV
        if method == "sendfile":
            try:
                self._sendfile(sfd, dfd, off, length, tick)
                return
            except OSError as exc:
                if self.method != "sendfile" or exc.errno not in self._FALLBACK or getattr(exc, "copied", 0):
                    raise
                self.method = "rw"
        self._rw(sfd, dfd, off, length, tick)

    @staticmethod
    def _cfr(sfd, dfd, off, length, tick):
        end = off + length
        while off < end:
            n = os.copy_file_range(sfd, dfd, min(STEP, end - off), off, off)
            if n == 0:
                raise OSError(errno.EIO, "source shrank while copying")
            off += n
            tick(n)

    @staticmethod
    def _sendfile(sfd, part_fd, off, length, tick):
        start, end = off, off + length
        dfd = safe.reopen(part_fd, os.O_WRONLY)  # sendfile writes at the fd's position: one per chunk
        try:
            os.lseek(dfd, off, os.SEEK_SET)
            while off < end:
                try:
                    n = os.sendfile(dfd, sfd, off, min(STEP, end - off))
                except OSError as exc:
                    exc.copied = off - start
                    raise
                if n == 0:
                    raise OSError(errno.EIO, "source shrank while copying")
                off += n
                tick(n)
        finally:
            os.close(dfd)

    def _rw(self, sfd, dfd, off, length, tick):
        buf = getattr(self._local, "buf", None)
        if buf is None:
            buf = self._local.buf = memoryview(bytearray(STEP))
        end = off + length
        while off < end:
            want = min(STEP, end - off)
            n = os.preadv(sfd, [buf[:want]], off)
            if n == 0:
                raise OSError(errno.EIO, "source shrank while copying")
            done = 0
            while done < n:
                done += os.pwrite(dfd, buf[done:n], off + done)
            off += n
            tick(n)


class _Dirs:
    """DST and its subdirectories as fds (safe.subdir: created 0755, never through a link), opened once each."""

    def __init__(self, dst: str, fd: int):
        self.dst, self.fds, self.lock = dst, {"": fd}, threading.Lock()

    def of(self, name: str) -> tuple[int, str]:
        """(fd of the directory holding `name`, its base name)."""
        d, base = os.path.split(name)
        with self.lock:
            if d not in self.fds:
                self.fds[d] = safe.subdir(self.fds[""], d, root=self.dst)
            return self.fds[d], base

    def of_existing(self, name: str) -> tuple[int, str]:
        d, base = os.path.split(name)
        with self.lock:
            if d not in self.fds:
                self.fds[d] = safe.subdir(self.fds[""], d, create=False, root=self.dst)
            return self.fds[d], base

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


class _OpenFile:
    """One file being copied: shared fds, chunks left, finalised (fsync, mode, mtime, rename) by its last chunk.
    The part file is created O_EXCL|O_NOFOLLOW in DST's fd (a planted part file or link is removed first, never
    written through); the source is opened through the one door (files/trust.py: every part walked by fd with
    O_NOFOLLOW, only root's links followed, a regular file by its fstat), and the staged mode and mtime are that fd's
    (a file swapped after the plan is never staged at the plan's mode)."""

    def __init__(self, f: StageFile, dirs: _Dirs, chunks: int):
        self.f, self.dirs, self.left = f, dirs, chunks
        self.final = os.path.join(dirs.dst, f.name)
        self.tmp = _part(self.final)  # its path, for messages
        self.lock = threading.Lock()
        self.sfd = self.dfd = self.pfd = None
        self.base = self.part = ""
        self.mode, self.mtime_ns = f.mode, f.mtime_ns  # replaced by the fstat of the source fd once it is open

    def fds(self):
        with self.lock:
            if self.sfd is None:
                self.pfd, self.base = self.dirs.of(self.f.name)
                self.part = f".{self.base}{probe.PART_SUFFIX}"
                try:  # walked by fd from "/" through the one door: a link planted on the way is not followed
                    sfd, st = trust.open_file(self.f.src, strict=False)
                except trust.Refused as exc:
                    raise OSError(exc.errno or errno.ESTALE, f"the source changed after the plan: {exc}",
                                  self.f.src) from None
                self.mode, self.mtime_ns = st.st_mode, st.st_mtime_ns  # of the file read, not of the plan
                self.sfd = sfd
                try:
                    os.posix_fadvise(self.sfd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
                except OSError:
                    pass
                safe.unlink_at(self.pfd, self.part)
                self.dfd = safe.create_excl(self.pfd, self.part, 0o600)
        return self.sfd, self.dfd

    def discard(self) -> None:
        if self.pfd is not None and self.part:
            safe.unlink_at(self.pfd, self.part)

    def chunk_done(self, pause) -> None:
        with self.lock:
            self.left -= 1
            if self.left:
                return
        if self.sfd is None:  # an empty file has one chunk and no fds yet
            self.fds()
        try:
            fs.fs_chmod(self.part, safe.staged_mode(self.mode), self.dfd)
            fs.fs_note("utime", self.part)
            os.utime(self.dfd, ns=(self.mtime_ns, self.mtime_ns))
            fs.fs_fsync(self.dfd, self.part)  # a no-op on tmpfs; on a disk DST it keeps "renamed" meaning "whole"
            try:
                os.posix_fadvise(self.sfd, 0, 0, os.POSIX_FADV_DONTNEED)  # do not double the RAM the model takes
            except OSError:
                pass
        finally:
            os.close(self.dfd)
            os.close(self.sfd)
            self.sfd = self.dfd = None
        pause()
        safe.rename_at(self.pfd, self.part, self.base)  # a link at NAME is replaced


def _test_pause_fn():
    """GPUDOCTOR_TEST_STAGE_DELAY_S: sleep at every step (tests kill the stage at random points)."""
    delay = float(os.environ.get("GPUDOCTOR_TEST_STAGE_DELAY_S", "0") or 0)
    return (lambda: time.sleep(delay)) if delay > 0 else (lambda: None)


def apply_stage(plan: StagePlan, *, jobs: int = DEFAULT_JOBS, on_progress=None, method: str | None = None) -> dict:
    """Do the plan. on_progress(bytes) is called from worker threads. Returns a result dict; raises RemedyError
    when the plan refuses or the copy fails verification, LockHeld when another stage writes DST."""
    import fcntl

    from gpudoctor.log import get_logger

    log = get_logger("gpudoctor.model.stage", dst=plan.dst)
    if plan.refusals:
        raise RemedyError("refusing to stage: " + "; ".join(plan.refusals))
    t0 = time.perf_counter()
    pause = _test_pause_fn()
    chunk = int(os.environ.get("GPUDOCTOR_TEST_STAGE_CHUNK", "0") or 0) or CHUNK
    method = method or os.environ.get("GPUDOCTOR_STAGE_COPY", "auto")
    dst_fd = safe.owned_dir(plan.dst)  # DST is ours: another user's directory or a link is refused (Unsafe)
    dirs = _Dirs(plan.dst, dst_fd)
    try:
        lock_fd = safe.open_regular(dst_fd, probe.LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600,
                                    path=os.path.join(plan.dst, probe.LOCK_NAME))
    except BaseException:
        dirs.close()
        raise
    try:
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LockHeld(f"another `gpudoctor model stage` is writing {plan.dst}") from None
        copied = 0
        if not plan.nothing_to_copy:
            _write_record(plan, "staging", log)
            safe.unlink_at(dst_fd, probe.MARKER_NAME)  # first: from here on DST is not vouched for
            for f in plan.files:
                if f.role in ("index", "config") and f.action == "copy":
                    _unlink_in(dirs, f.name)
            for name in plan.stale:
                _unlink_in(dirs, name)
            log.info("model.stage.started", files=sum(f.action == "copy" for f in plan.files), bytes=plan.to_copy)
            copier = _Copier(method)
            lock = threading.Lock()
            total = [0]

            def tick(n):
                with lock:
                    total[0] += n
                if on_progress:
                    on_progress(n)

            phases = [[f for f in plan.files if f.action == "copy" and f.role == r] for r in ("weight", "other")]
            phases += [[f] for f in plan.files if f.action == "copy" and f.role == "index"]
            phases += [[f] for f in plan.files if f.action == "copy" and f.role == "config"]
            with ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="stage") as pool:
                for phase in phases:
                    _run_phase(pool, phase, dirs, chunk, copier, tick, pause)
            copied = total[0]
            method = copier.method
        pause()
        rep = probe.verify_model(plan.dst)
        wrong = [f"{f.name}: {_size_of(os.path.join(plan.dst, f.name))} bytes, expected {f.size}"
                 for f in plan.files if _size_of(os.path.join(plan.dst, f.name)) != f.size]
        if not rep["complete"] or wrong:
            shown = [_problem_line(p) for p in rep["problems"][:3]] + wrong[:3]
            raise RemedyError(f"the staged copy in {plan.dst} failed verification: " + "; ".join(shown))
        marker = {"schema": probe.MARKER_SCHEMA, "boot_id": probe.boot_id(), "staged_at": time.time(),
                  "host": socket.gethostname(), "source": plan.src, "source_kind": plan.src_kind,
                  "revision": plan.revision, "total_bytes": sum(f.size for f in plan.files),
                  "files": [{"name": f.name, "size": f.size, **({"sha256": f.sha256} if f.sha256 else {})}
                            for f in plan.files]}
        pause()
        safe.write_at(dst_fd, probe.MARKER_NAME, json.dumps(marker, indent=1) + "\n", safe.output_mode(public=True))
        record_at = _write_record(plan, "staged", log, marker)
        secs = time.perf_counter() - t0
        log.info("model.stage.finished", bytes=copied, seconds=round(secs, 3))
        return {"dst": plan.dst, "copied_bytes": copied, "skipped": sum(f.action == "skip" for f in plan.files),
                "files": len(plan.files), "seconds": secs, "rate_bps": copied / secs if secs > 0 else None,
                "method": method, "jobs": jobs, "verify": {"complete": rep["complete"], "seconds": rep["seconds"],
                                                           "shards": rep["weights"]["shards"]},
                "marker": os.path.join(plan.dst, probe.MARKER_NAME), "record": record_at, "boot_id": marker["boot_id"]}
    finally:
        os.close(lock_fd)
        dirs.close()


def _unlink_in(dirs: _Dirs, name: str) -> None:
    """Remove DST/name through DST's fds: a link is removed, never followed; a missing directory is fine."""
    try:
        fd, base = dirs.of_existing(name)
    except FileNotFoundError:
        return
    safe.unlink_at(fd, base)


def _size_of(path: str) -> int | str:
    try:
        return os.stat(path).st_size
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, "absent")


def _run_phase(pool, files: list[StageFile], dirs: _Dirs, chunk: int, copier: _Copier, tick, pause) -> None:
    """Copy files in chunk-sized units on the pool; each file is renamed into place by its last chunk."""
    if not files:
        return
    units = []
    opened = []
    for f in files:
        n = max(1, -(-f.size // chunk))
        of = _OpenFile(f, dirs, n)
        opened.append(of)
        units += [(of, i * chunk, min(chunk, f.size - i * chunk)) for i in range(n)]

    def work(of: _OpenFile, off: int, length: int):
        pause()
        if length > 0:
            sfd, dfd = of.fds()
            copier.copy(sfd, dfd, of.part, off, length, tick)
        of.chunk_done(pause)

    futs = [pool.submit(work, *u) for u in units]
    try:
        done, pending = wait(futs, return_when=FIRST_EXCEPTION)
    except BaseException:  # Ctrl-C: do not copy the rest of the queue before exiting
        done, pending = set(), set(futs)
    failed = [f for f in done if f.exception() is not None]
    if failed or pending:
        for f in pending:
            f.cancel()
        wait(pending)
        for of in opened:  # close what an unfinished file left open and drop its partial copy
            for fd in (of.sfd, of.dfd):
                if fd is not None:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
            of.sfd = of.dfd = None
            of.discard()
        exc = failed[0].exception() if failed else KeyboardInterrupt()
        if isinstance(exc, OSError):
            raise RemedyError(f"copy failed: {exc.strerror or exc} ({getattr(exc, 'filename', None) or ''})") from exc
        raise exc


def _write_record(plan: StagePlan, state: str, log, marker: dict | None = None) -> str | None:
    """The persistent record (outside tmpfs): it survives the reboot that wipes DST and tells "wiped" from "never"."""
    rec = {"schema": "gpudoctor.stage-record/1", "dst": plan.dst, "state": state, "boot_id": probe.boot_id(),
           "at": time.time(), "source": plan.src, "source_kind": plan.src_kind, "revision": plan.revision,
           "total_bytes": sum(f.size for f in plan.files), "files": [{"name": f.name, "size": f.size}
                                                                     for f in plan.files]}
    if marker:
        rec["staged_at"] = marker["staged_at"]
    for d in probe.state_dirs():
        path = os.path.join(d, probe.STATE_SUBDIR, probe.record_key(plan.dst) + ".json")
        try:  # a state dir another user controls (root's HOME under sudo) is skipped: the record names a source
            fd = safe.owned_dir(os.path.dirname(path))
        except (OSError, InputError) as exc:
            log.debug("model.stage.record_unwritable", path=path, error=str(exc))
            continue
        try:
            # 0644 as before: an ordinary user's `model verify` reads it to tell "wiped" from "never staged"
            safe.write_at(fd, os.path.basename(path), json.dumps(rec, indent=1) + "\n", safe.output_mode(public=True))
            return path
        except OSError as exc:
            log.debug("model.stage.record_unwritable", path=path, error=str(exc))
        finally:
            os.close(fd)
    return None
