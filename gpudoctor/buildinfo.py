"""Which commit this gpudoctor was built from, for `--version`: recorded by install.sh at install time
(<venv>/gpudoctor-commit), else read from the git checkout an editable install runs from (files only: git is never
run), else "unknown"."""

from __future__ import annotations

import re
import sys
from pathlib import Path

STAMP = "gpudoctor-commit"  # install.sh writes it beside the venv's pyvenv.cfg
_HEX = re.compile(r"[0-9a-f]{7,64}")


def commit() -> str:
    """The commit (12 hex digits), or "unknown"."""
    for find in (_stamped, _checkout):
        try:
            found = find()
        except (OSError, UnicodeDecodeError, ValueError):
            found = None
        if found:
            return found[:12]
    return "unknown"


def _stamped() -> str | None:
    text = _read(Path(sys.prefix) / STAMP)
    return text if text and _HEX.fullmatch(text) else None


def _checkout() -> str | None:
    """HEAD of the checkout holding this package (an editable install), read as git stores it."""
    top = Path(__file__).resolve().parent.parent
    dotgit = top / ".git"
    if dotgit.is_file():  # a worktree: "gitdir: <dir>"
        text = _read(dotgit) or ""
        if not text.startswith("gitdir:"):
            return None
        gitdir = Path(text.split(":", 1)[1].strip())
        gitdir = gitdir if gitdir.is_absolute() else top / gitdir
    elif dotgit.is_dir():
        gitdir = dotgit
    else:
        return None
    head = _read(gitdir / "HEAD") or ""
    if _HEX.fullmatch(head):
        return head
    if not head.startswith("ref:"):
        return None
    ref = head.split(":", 1)[1].strip()
    common = gitdir
    if (gitdir / "commondir").is_file():
        common = (gitdir / (_read(gitdir / "commondir") or ".")).resolve()
    for d in (gitdir, common):
        value = _read(d / ref)
        if value and _HEX.fullmatch(value):
            return value
    packed = _read(common / "packed-refs") or ""
    for line in packed.splitlines():
        sha, _, name = line.partition(" ")
        if name == ref and _HEX.fullmatch(sha):
            return sha
    return None


def _read(path: Path) -> str | None:
    try:
        with open(path, encoding="ascii") as f:
            return f.read(4096).strip()
    except FileNotFoundError:
        return None
