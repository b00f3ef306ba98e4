"""A local attacker in the test's own machine: an ordinary user (uid 65534, nobody) who creates files where any user
may (/dev/shm, /tmp), before root runs gpudoctor. Played by a forked child that drops to that uid."""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from pathlib import Path

import pytest

UID = GID = 65534
SHM = Path("/dev/shm")


def as_attacker(fn) -> None:
    """Run fn() in a child as uid 65534 (umask 0); raise if it failed."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.setgroups([])
            os.setgid(GID)
            os.setuid(UID)
            os.umask(0)
            fn()
            code = 0
        except BaseException as exc:  # noqa: BLE001 - reported through the exit code
            os.write(2, f"attacker: {exc!r}\n".encode())
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the attacker's set-up failed"


def digest(path: Path) -> tuple:
    """What a victim file is: its bytes, mode and owner (a write, chmod or chown through a link changes one)."""
    st = os.lstat(path)
    return hashlib.sha256(path.read_bytes()).hexdigest(), st.st_mode, st.st_uid, st.st_gid


@pytest.fixture
def victim(tmp_path):
    """A root file the attacker would like root to overwrite (in the test's own tmp, never a real /etc file)."""
    v = tmp_path / "etc" / "victim"
    v.parent.mkdir()
    v.write_bytes(b"root's file: must stay byte for byte\n")
    os.chmod(v, 0o600)
    return v


@pytest.fixture
def shm_name():
    """A fresh name under the real /dev/shm (removed afterwards, whoever made it)."""
    p = SHM / f"gpudoctor-hostile-{uuid.uuid4().hex[:10]}"
    yield p
    if p.is_symlink():
        p.unlink()
    shutil.rmtree(p, ignore_errors=True)


@pytest.fixture
def cli(capsys):
    """gpudoctor.cli.main in-process: (code, out, err)."""
    from gpudoctor.cli import main

    def run(*argv):
        capsys.readouterr()
        try:
            main([str(a) for a in argv])
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.fixture
def public():
    """A directory like /tmp that the attacker can reach: root's, sticky, 1777 (under /dev/shm; removed after)."""
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="gpudoctor-hostile-pub-", dir=str(SHM)))
    os.chmod(d, 0o1777)
    yield d
    shutil.rmtree(d, ignore_errors=True)
