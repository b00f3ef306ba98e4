"""A local attacker in our own namespaces (#40): an ordinary uid, its files and directories, its processes.

NOBODY (uid/gid 65534) plays the other user. `as_user` runs a command as that uid with no supplementary groups and no
capabilities; it needs root, and a private mount namespace in which /root (0700 here, holding the interpreter the tests
run under) is replaced by a 0755 tmpfs carrying only the interpreter's tree, so the uid can run the installed gpudoctor.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests import needs

NOBODY = 65534


def owned_by(path: Path, uid: int = NOBODY, mode: int | None = None) -> Path:
    """chown `path` to uid (and its gid), optionally chmod it; returns it."""
    os.chown(path, uid, uid)
    if mode is not None:
        os.chmod(path, mode)
    return path


def attacker_dir(parent: Path, name: str = "eve", mode: int = 0o755) -> Path:
    """A directory the attacker owns (inside a root-owned test directory others can traverse)."""
    parent.chmod(0o755)
    d = parent / name
    d.mkdir()
    return owned_by(d, mode=mode)


def executable(path: Path, text: str, uid: int = NOBODY) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return owned_by(path, uid)


def _interpreter_root() -> str | None:
    """The top directory under /root that holds this interpreter's files (pyenv: /root/.pyenv), if any."""
    real = os.path.realpath(sys.base_prefix)
    if not real.startswith("/root/"):
        return None
    return "/root/" + real.split("/")[2]


def as_user(argv: list[str], *, cwd: Path, env: dict, uid: int = NOBODY, timeout: float = 60
            ) -> subprocess.CompletedProcess:
    """Run argv as `uid` (no groups, no capabilities) in a private mount namespace (see the module's note)."""
    needs.root()
    for tool in ("unshare", "setpriv"):  # util-linux
        if shutil.which(tool) is None:
            needs.missing(tool)
    keep = _interpreter_root()
    script = "set -e\n"
    if keep:
        script += ('d=$(mktemp -d)\nmount --bind /root "$d"\nmount -t tmpfs -o mode=0755,size=1m tmpfs /root\n'
                   f'mkdir -p {keep}\nmount --bind "$d/{keep[6:]}" {keep}\n')
    script += f'cd "$1"\nshift\nexec setpriv --reuid={uid} --regid={uid} --clear-groups --inh-caps=-all -- "$@"\n'
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", str(cwd),
                           *map(str, argv)], capture_output=True, text=True, timeout=timeout, env=env)
