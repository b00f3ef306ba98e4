"""Fixtures for the model tests: the real CLI in-process and as a subprocess, a fake-root host tree."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "model"
SHM = "/dev/shm"


def capture(name: str) -> str:
    """A captured command output without its `$ command` and `# rc=N` lines."""
    lines = (FIXTURES / name).read_text().splitlines()
    return "\n".join(ln for ln in lines if not ln.startswith(("$ ", "# rc="))) + "\n"


class CliResult:
    def __init__(self, code, out, err):
        self.code, self.out, self.err = code, out, err


@pytest.fixture
def cli(capsys):
    """Run gpudoctor.cli.main(argv) in-process: (exit code, stdout, stderr)."""
    from gpudoctor.cli import main

    def run(*argv: str) -> CliResult:
        capsys.readouterr()
        try:
            main([str(a) for a in argv])
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        out, err = capsys.readouterr()
        return CliResult(code, out, err)

    return run


def run_gpudoctor(*argv, env=None, timeout=60) -> subprocess.CompletedProcess:
    """The real command as a subprocess."""
    full = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "gpudoctor", *map(str, argv)], capture_output=True, text=True,
                          env=full, timeout=timeout)


@pytest.fixture
def state_dir(tmp_path, monkeypatch):
    """A private persistent-state dir for stage records (never /var/lib/gpudoctor of the test machine)."""
    d = tmp_path / "state"
    monkeypatch.setenv("GPUDOCTOR_STATE_DIR", str(d))
    return d


@pytest.fixture
def shm_dir():
    """A fresh directory path under the real /dev/shm tmpfs (removed afterwards)."""
    import shutil

    p = Path(SHM) / f"gpudoctor-test-{uuid.uuid4().hex[:10]}"
    yield p
    shutil.rmtree(p, ignore_errors=True)


@pytest.fixture
def disk_dir():
    """A fresh directory on a disk-backed filesystem (not tmpfs), wherever /tmp lives: /var/tmp, which the FHS keeps
    across reboots (Debian 13 mounts /tmp as tmpfs, /var/tmp stays on disk). Removed afterwards."""
    import shutil
    import tempfile

    from tests import needs

    base = "/var/tmp"
    # statfs's type name (coreutils `stat -f`): works in a chroot too, where /proc/self/mounts has no entry for "/"
    r = subprocess.run(["stat", "-f", "-c", "%T", base], capture_output=True, text=True, timeout=10)
    fstype = r.stdout.strip() if r.returncode == 0 else None
    if fstype in (None, "", "tmpfs", "ramfs"):
        needs.unavailable(f"no disk-backed directory for this test: {base} is on {fstype or 'an unknown filesystem'}")
    p = Path(tempfile.mkdtemp(prefix="gpudoctor-test-", dir=base))
    yield p
    shutil.rmtree(p, ignore_errors=True)


def make_root(root: Path, *, mounts: str, cgroup: str = "0::/\n", boot_id: str = "b0000000-0000-0000-0000-000000000001",
              meminfo: str | None = None, cgroup_files: dict | None = None) -> Path:
    """A fake host tree for LocalHost(root=...): /proc/mounts, /proc/self/cgroup, boot_id, meminfo, cgroup files."""
    (root / "proc/self").mkdir(parents=True, exist_ok=True)
    (root / "proc/sys/kernel/random").mkdir(parents=True, exist_ok=True)
    (root / "proc/mounts").write_text(mounts)
    (root / "proc/self/cgroup").write_text(cgroup)
    (root / "proc/sys/kernel/random/boot_id").write_text(boot_id + "\n")
    (root / "proc/meminfo").write_text(meminfo or capture("h200-healthy-meminfo.txt"))
    for rel, text in (cgroup_files or {}).items():
        p = root / rel.lstrip("/")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root
