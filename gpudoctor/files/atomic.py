"""Atomic file writes: temp file beside the target, fsync, rename. A reader never sees half a file."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write(path: str | os.PathLike, data: bytes | str, *, mode: int | None = None,
                 owner: tuple[int, int] | None = None) -> None:
    """Replace `path` with `data` atomically, keeping the old file's mode. The new file belongs to whoever writes it
    (root's replacement is root's: #40), or to `owner` (uid, gid) when the caller names one."""
    target = Path(path)
    if isinstance(data, str):
        data = data.encode()
    old = None
    try:
        old = target.stat()
    except FileNotFoundError:
        pass
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        elif old is not None:  # another user's setuid/setgid bits never pass to a file of ours
            os.chmod(tmp, old.st_mode & (0o7777 if old.st_uid == os.geteuid() else 0o1777))
        else:
            os.chmod(tmp, 0o644)
        if owner is not None:
            os.chown(tmp, *owner)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(target.parent)


def fsync_dir(path: str | os.PathLike) -> None:
    """fsync a directory so a rename in it survives a crash; best effort (some filesystems refuse)."""
    try:
        dfd = os.open(os.fspath(path) or ".", os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


def append_jsonl_atomic(path: str | os.PathLike, records: list[dict], *, mode: int | None = None) -> None:
    """Append JSON records to a JSONL file by rewriting it atomically (small result files only)."""
    import json

    target = Path(path)
    existing = target.read_bytes() if target.exists() else b""
    if existing and not existing.endswith(b"\n"):
        existing += b"\n"
    extra = "".join(json.dumps(r, sort_keys=True) + "\n" for r in records).encode()
    atomic_write(target, existing + extra, mode=mode)
