"""A directory where device nodes made with mknod behave as on /dev, wherever /tmp lives and however it is mounted.

Debian 13 mounts /tmp as tmpfs with `nodev`: a node made there opens EACCES whatever its mode or major, so a test
that makes nodes under pytest's tmp_path would measure the mount, not gpudoctor. As root, `DevMount` mounts ONE
private tmpfs (no `nodev`; mode 0755) for the session under pytest's base temp and hands out a fresh directory on it
per test (`dev_tmp_path` in tests/conftest.py; a module that makes nodes overrides `tmp_path` with it). Each test's
directory is removed after it, the mount at the end of the session. As an ordinary user nothing is mounted (mknod
needs root anyway, those tests skip through tests/needs.py): the plain tmp_path is used.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path


def nodev(path: Path) -> bool:
    """True when the mount holding `path` has `nodev` (statvfs's ST_NODEV)."""
    return bool(os.statvfs(path).f_flag & os.ST_NODEV)


class DevMount:
    def __init__(self, base: Path):
        self.base = base
        self.mounted = False

    def _mount(self) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755,size=512m", "gpudoctor-test-dev", str(self.base)],
                       check=True, capture_output=True, text=True)
        self.mounted = True
        if nodev(self.base):  # a parent namespace forces nodev (an unprivileged container): say so, do not pretend
            raise RuntimeError(f"tests/devmount.py: the tmpfs mounted on {self.base} is nodev anyway")

    def directory(self, name: str) -> Path:
        if not self.mounted:
            self._mount()
        return Path(tempfile.mkdtemp(prefix=re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:40] + "-", dir=self.base))

    def close(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "--lazy", str(self.base)], check=False, capture_output=True)
            self.mounted = False


def remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
