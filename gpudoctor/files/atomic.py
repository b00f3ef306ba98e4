"""Atomic file writes: temp file beside the target, fsync, rename. A reader never sees half a file."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from gpudoctor.host import ops as fs  # the mutation seam: every step below is recorded there (tests/crash)


def atomic_write(path: str | os.PathLike, data: bytes | str, *, mode: int | None = None,
                 owner: tuple[int, int] | None = None) -> None:
    """Replace `path` with `data` atomically, keeping the old file's mode. The new file belongs to whoever writes it
    (root's replacement is root's), or to `owner` (uid, gid) when the caller names one.
    Steps: create a temp file beside it (O_EXCL|O_NOFOLLOW), write, mode/owner, fsync, rename over the target,
    fsync the directory."""
    target = Path(path)
    if isinstance(data, str):
        data = data.encode()
    old = None
    try:
        old = target.stat()
    except FileNotFoundError:
        pass
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
    for _ in range(100):
        tmp = os.path.join(target.parent, f".{target.name}.{secrets.token_hex(4)}.tmp")
        try:
            fd = fs.fs_open(tmp, flags, 0o600)
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(f"no free temp name beside {target}")
    try:
        try:
            fs.fs_write(fd, data, tmp)
            if mode is not None:
                fs.fs_chmod(tmp, mode, fd)
            elif old is not None:  # another user's setuid/setgid bits never pass to a file of ours
                fs.fs_chmod(tmp, old.st_mode & (0o7777 if old.st_uid == os.geteuid() else 0o1777), fd)
            else:
                fs.fs_chmod(tmp, 0o644, fd)
            if owner is not None:
                fs.fs_chown(tmp, owner[0], owner[1], fd)
            fs.fs_fsync(fd, tmp)
        finally:
            os.close(fd)
        fs.fs_rename(tmp, target)  # and fsyncs the directory
    except BaseException:
        fs.fs_unlink(tmp, missing_ok=True)
        raise


def fsync_dir(path: str | os.PathLike) -> None:
    """fsync a directory so a rename in it survives a crash; best effort (some filesystems refuse)."""
    fs.fs_fsync_dir(os.fspath(path))


def append_jsonl_atomic(path: str | os.PathLike, records: list[dict], *, mode: int | None = None) -> None:
    """Append JSON records to a JSONL file by rewriting it atomically (small result files only)."""
    import json

    target = Path(path)
    existing = target.read_bytes() if target.exists() else b""
    if existing and not existing.endswith(b"\n"):
        existing += b"\n"
    extra = "".join(json.dumps(r, sort_keys=True) + "\n" for r in records).encode()
    atomic_write(target, existing + extra, mode=mode)
