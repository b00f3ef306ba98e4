"""The one file-edit helper every remedy uses (Ansible lineinfile's discipline, over any Host).

plan_edit() is pure: before/after bytes → an EditPlan with its unified diff; nothing is written. apply_edit() on a
Host: re-read the target (already the planned result → nothing to do; changed since the plan → refuse), write a dated
backup OUTSIDE the edited directory, write a temp file in the SAME directory (created with the target's mode and
owner, so no chmod/chown is needed on pmxcfs, which allows only 0640 root:www-data), read it back, validate it,
check the target did not change meanwhile, then rename it over the target in one step. A reader, or a run killed at
any point, sees either the original or the complete new file. A failed validation leaves the target byte-identical.
"""

from __future__ import annotations

import difflib
import errno
import hashlib
import os
import secrets
import time
from dataclasses import dataclass
from typing import Callable

from gpudoctor.errors import RemedyError

DEFAULT_BACKUP_DIR = "/var/lib/gpudoctor/backups"
MAX_BYTES = 1 << 20  # pmxcfs's limit for one file; configs are far smaller
TEMP_MARK = ".tmp.gpudoctor."


class EditError(RemedyError):
    """A planned edit could not be made; the target is unchanged unless the message says otherwise."""


class EditConflict(EditError):
    """The file changed between plan and apply."""


class ValidationFailed(EditError):
    """The new content did not pass validation; nothing was renamed."""


class ReadOnlyTarget(EditError):
    """The target's filesystem refuses writes (read-only mount, or pmxcfs without quorum)."""


def sha256(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


def _lines(data: bytes) -> list[str]:
    text = data.decode("utf-8", "surrogateescape")
    out, start = [], 0
    while start < len(text):
        i = text.find("\n", start)
        end = len(text) if i < 0 else i + 1
        out.append(text[start:end])
        start = end
    return out


def unified_diff(path: str, before: bytes | None, after: bytes, context: int = 3) -> str:
    """`diff -u` of the edit, marking a missing final newline the way diff does."""
    out = []
    for line in difflib.unified_diff(_lines(before or b""), _lines(after), f"{path} (before)", f"{path} (after)",
                                     n=context, lineterm="\n"):
        if not line.endswith("\n"):
            line += "\n\\ No newline at end of file\n"
        out.append(line)
    return "".join(out).encode("utf-8", "surrogateescape").decode("utf-8", "replace")


@dataclass(frozen=True)
class EditPlan:
    """A planned replacement of one file's bytes."""

    path: str
    before: bytes | None  # None: the file does not exist yet
    after: bytes

    @property
    def changed(self) -> bool:
        return self.before != self.after

    @property
    def before_sha256(self) -> str | None:
        return sha256(self.before)

    @property
    def after_sha256(self) -> str:
        return sha256(self.after)

    @property
    def diff(self) -> str:
        return unified_diff(self.path, self.before, self.after) if self.changed else ""

    def reverse(self) -> "EditPlan":
        if self.before is None:
            raise EditError(f"{self.path}: cannot reverse the creation of a file")
        return EditPlan(self.path, self.after, self.before)


@dataclass
class EditResult:
    path: str
    changed: bool
    backup: str | None
    before_sha256: str | None
    after_sha256: str

    def to_json(self) -> dict:
        return dict(self.__dict__)


def plan_edit(path: str, before: bytes | None, after: bytes | str) -> EditPlan:
    if isinstance(after, str):
        after = after.encode("utf-8", "surrogateescape")
    return EditPlan(path, before, after)


def backup_path_for(path: str, backup_dir: str, when: float | None = None) -> str:
    """<backup_dir>/<path without leading />.<UTC time to the microsecond>, e.g. …/etc/pve/lxc/200.conf.20260102T030405.123456Z"""
    when = time.time() if when is None else when
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(when)) + f".{int((when % 1) * 1e6):06d}Z"
    return os.path.join(backup_dir, os.path.abspath(path).lstrip("/")) + "." + stamp


def _inside(child: str, parent: str) -> bool:
    child, parent = os.path.normpath(child), os.path.normpath(parent)
    return child == parent or child.startswith(parent.rstrip("/") + "/")


def _read(host, path: str, timeout: float) -> bytes | None:
    r = host.read_file(path, timeout=timeout, max_bytes=MAX_BYTES + 1)
    if r.error == "ENOENT":
        return None
    if not r.ok:
        raise EditError(f"{path}: cannot read it ({r.error})")
    if len(r.data) > MAX_BYTES:
        raise EditError(f"{path}: larger than {MAX_BYTES} bytes; not editing")
    return r.data


def _write_error(exc: OSError, path: str, what: str) -> EditError:
    name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
    if exc.errno == errno.EROFS or (path.startswith("/etc/pve/") and exc.errno in (errno.EACCES, errno.EPERM)):
        extra = (" (/etc/pve is read-only when this node has lost quorum: check `pvecm status`)"
                 if path.startswith("/etc/pve/") else "")
        return ReadOnlyTarget(f"{path}: cannot {what}: {name} {exc.strerror or ''}".rstrip() +
                              f"; the filesystem refuses writes{extra}. Nothing was changed")
    return EditError(f"{path}: cannot {what}: {name} {exc.strerror or ''}".rstrip())


def apply_edit(host, plan: EditPlan, *, validate: Callable[[bytes], str | None] | None = None,
               backup_dir: str = DEFAULT_BACKUP_DIR, timeout: float = 10.0) -> EditResult:
    """Make the planned edit on `host` (see the module docstring for the steps). Idempotent."""
    path = plan.path
    d, name = os.path.dirname(path) or ".", os.path.basename(path)
    if _inside(backup_dir, d):
        raise EditError(f"{path}: the backup directory {backup_dir} is inside the edited directory {d}; "
                        f"backups must live elsewhere (pmxcfs keeps no history and limits its size)")
    current = _read(host, path, timeout)
    if current == plan.after:
        return EditResult(path, False, None, sha256(current), plan.after_sha256)
    if current != plan.before:
        raise EditConflict(f"{path} changed since the plan (sha256 {sha256(current)}, planned from "
                           f"{plan.before_sha256}); nothing was changed: plan again")

    mode = owner = None
    if current is not None:
        st = host.stat(path, timeout=timeout)
        if st.exists and st.kind == "file":
            mode, owner = st.mode, (st.uid, st.gid)
        elif st.exists:
            raise EditError(f"{path}: is a {st.kind}, not a regular file; not editing")

    backup = None
    if current is not None:
        backup = _write_backup(host, path, current, backup_dir, timeout)

    _remove_stale_temps(host, d, name, timeout)
    tmp = os.path.join(d, f"{name}{TEMP_MARK}{os.getpid()}.{secrets.token_hex(4)}")
    try:
        host.write_file(tmp, plan.after, mode=mode, owner=owner, exclusive=True, timeout=timeout)
    except OSError as exc:
        raise _write_error(exc, path, "write its temp file") from exc
    try:
        written = _read(host, tmp, timeout)
        if written != plan.after:
            raise EditError(f"{tmp}: read back {len(written or b'')} bytes, wrote {len(plan.after)}; not renaming")
        if validate is not None:
            try:
                problem = validate(written)
            except Exception as exc:  # noqa: BLE001 - a crashing validator is a failed validation
                problem = f"validator crashed: {type(exc).__name__}: {exc}"
            if problem:
                raise ValidationFailed(f"{path}: the new content failed validation: {problem}; "
                                       f"the file was not changed")
        if _read(host, path, timeout) != current:
            raise EditConflict(f"{path} changed while gpudoctor was writing; nothing was changed: plan again")
        try:
            host.rename(tmp, path, timeout=timeout)
        except OSError as exc:
            raise _write_error(exc, path, "rename the temp file over it") from exc
    except BaseException:
        try:
            host.unlink(tmp, timeout=timeout)
        except Exception:  # noqa: BLE001 - best effort; the next apply removes stale temps
            pass
        raise
    final = _read(host, path, timeout)
    if final != plan.after:
        raise EditError(f"{path}: after the rename it holds sha256 {sha256(final)}, expected {plan.after_sha256}")
    return EditResult(path, True, backup, plan.before_sha256, plan.after_sha256)


def _write_backup(host, path: str, data: bytes, backup_dir: str, timeout: float) -> str:
    for attempt in range(5):
        dest = backup_path_for(path, backup_dir) + (f".{attempt}" if attempt else "")
        # written under a temp name, then renamed: a run killed mid-write never leaves a torn file named as a backup
        tmp = f"{dest}{TEMP_MARK}{os.getpid()}.{secrets.token_hex(4)}"
        try:
            host.makedirs(os.path.dirname(dest), 0o700, timeout=timeout)
            if not attempt:  # a backup temp a killed run left (its dated name differs: match the pattern)
                _remove_stale_temps(host, os.path.dirname(dest), os.path.basename(path), timeout, dated=True)
            if host.stat(dest, timeout=timeout).exists:
                continue
            host.write_file(tmp, data, mode=0o600, exclusive=True, timeout=timeout)
            if _read(host, tmp, timeout) != data:
                host.unlink(tmp, timeout=timeout)
                raise EditError(f"the backup {dest} does not read back as written; nothing was changed")
            host.rename(tmp, dest, timeout=timeout)
        except FileExistsError:
            continue
        except OSError as exc:
            raise EditError(f"cannot write the backup {dest}: {errno.errorcode.get(exc.errno or 0, exc.errno)} "
                            f"{exc.strerror or ''}; nothing was changed (set another --backup-dir)") from exc
        return dest
    raise EditError(f"cannot find a free backup name for {path} in {backup_dir}")


def _remove_stale_temps(host, d: str, name: str, timeout: float, dated: bool = False) -> None:
    """Temp files an earlier, killed gpudoctor run left beside the target (ours only, by name); dated: those of a
    backup of it (NAME.<UTC stamp>[.N]<TEMP_MARK>…)."""
    import re

    entries = host.listdir(d, timeout=timeout)
    if not isinstance(entries, list):
        return
    stamp = re.compile(re.escape(name) + r"\.\d{8}T\d{6}\.\d{6}Z(\.\d+)?" + re.escape(TEMP_MARK))
    for e in entries:
        if (stamp.match(e) if dated else e.startswith(name + TEMP_MARK)):
            try:
                host.unlink(os.path.join(d, e), timeout=timeout)
            except OSError:
                pass
