"""gpudoctor.files.edit on real files: diff, backup outside, temp+rename, validate, conflicts, read-only, mode/owner kept.
Run over the in-process LocalHost and over a run-only backend (host/ops.py one-shot, as without the SSH agent)."""

import errno
import os
import subprocess
from dataclasses import dataclass

import pytest

from gpudoctor.files.edit import (EditConflict, EditError, ReadOnlyTarget, ValidationFailed, apply_edit, plan_edit,
                            unified_diff)
from gpudoctor.host.base import Host
from gpudoctor.host.local import LocalHost
from tests import needs

BEFORE = b"arch: amd64\nlxc.cgroup2.devices.allow: c 195:* rwm\n\n[snap]\narch: amd64\n"
AFTER = b"arch: amd64\nlxc.cgroup2.devices.allow: c 195:* rwm\nlxc.cgroup2.devices.allow: c 511:* rwm\n\n[snap]\narch: amd64\n"


@dataclass
class RunOnlyHost(Host):
    """Every file operation one-shot through run() (what a remote host without the agent gets), under a temp root."""

    name: str = "runonly"
    root: str = ""

    def __post_init__(self):
        self._local = LocalHost()
        self.python = self._local.python

    def run(self, argv, timeout=None, input=None, env=None):
        return self._local.run(argv, timeout=timeout, input=input, env=env)

    def _path(self, path):
        return self.root + path if path.startswith("/") else path


def host_on(kind: str, root):
    """(the host, its root): /etc/pve/lxc/200.conf holding BEFORE, under `root`."""
    (root / "etc/pve/lxc").mkdir(parents=True)
    t = root / "etc/pve/lxc/200.conf"
    t.write_bytes(BEFORE)
    os.chmod(t, 0o640)
    h = LocalHost(root=str(root)) if kind == "local" else RunOnlyHost(root=str(root))
    return h, root


@pytest.fixture(params=["local", "run-only"])
def host(request, tmp_path):
    return host_on(request.param, tmp_path)


def backups(root):
    return sorted(p for p in (root / "bk").rglob("*") if p.is_file()) if (root / "bk").exists() else []


def test_diff_is_unified_and_marks_missing_newline():
    d = unified_diff("/x.conf", b"a\nb", b"a\nb\nc\n")
    assert d.splitlines()[:2] == ["--- /x.conf (before)", "+++ /x.conf (after)"]
    assert "-b\n\\ No newline at end of file\n+b\n+c\n" in d
    assert plan_edit("/x", b"same", b"same").diff == ""


def test_apply_then_apply_again_changes_nothing(host):
    h, root = host
    plan = plan_edit("/etc/pve/lxc/200.conf", BEFORE, AFTER)
    assert "+lxc.cgroup2.devices.allow: c 511:* rwm" in plan.diff
    res = apply_edit(h, plan, backup_dir="/bk")
    assert res.changed and (root / "etc/pve/lxc/200.conf").read_bytes() == AFTER
    bk = backups(root)
    assert len(bk) == 1 and bk[0].read_bytes() == BEFORE and res.backup == "/" + str(bk[0].relative_to(root))
    assert bk[0].relative_to(root / "bk").as_posix().startswith("etc/pve/lxc/200.conf.")
    assert oct(bk[0].stat().st_mode & 0o777) == "0o600"
    assert oct((root / "etc/pve/lxc/200.conf").stat().st_mode & 0o777) == "0o640"  # mode kept
    assert os.listdir(root / "etc/pve/lxc") == ["200.conf"]  # no temp left beside it
    again = apply_edit(h, plan, backup_dir="/bk")
    assert not again.changed and len(backups(root)) == 1


def test_failed_validate_leaves_target_byte_identical(host):
    h, root = host
    t = root / "etc/pve/lxc/200.conf"
    st = t.stat()
    seen = []

    def validate(data):
        seen.append(data)
        return "line 3 is wrong"

    with pytest.raises(ValidationFailed, match="line 3 is wrong"):
        apply_edit(h, plan_edit("/etc/pve/lxc/200.conf", BEFORE, AFTER), backup_dir="/bk", validate=validate)
    assert seen == [AFTER]  # the validator saw the temp file's content as written
    assert t.read_bytes() == BEFORE and t.stat().st_ino == st.st_ino and t.stat().st_mtime_ns == st.st_mtime_ns
    assert os.listdir(root / "etc/pve/lxc") == ["200.conf"]

    def crash(data):
        raise RuntimeError("boom")

    with pytest.raises(ValidationFailed, match="validator crashed"):
        apply_edit(h, plan_edit("/etc/pve/lxc/200.conf", BEFORE, AFTER), backup_dir="/bk", validate=crash)
    assert t.read_bytes() == BEFORE


def test_file_changed_since_plan_is_a_conflict(host):
    h, root = host
    t = root / "etc/pve/lxc/200.conf"
    t.write_bytes(BEFORE + b"lock: backup\n")
    with pytest.raises(EditConflict, match="changed since the plan"):
        apply_edit(h, plan_edit("/etc/pve/lxc/200.conf", BEFORE, AFTER), backup_dir="/bk")
    assert t.read_bytes() == BEFORE + b"lock: backup\n" and not backups(root)


def test_backup_dir_inside_the_edited_dir_is_refused(host):
    h, root = host
    with pytest.raises(EditError, match="backups must live elsewhere"):
        apply_edit(h, plan_edit("/etc/pve/lxc/200.conf", BEFORE, AFTER), backup_dir="/etc/pve/lxc/bk")
    assert (root / "etc/pve/lxc/200.conf").read_bytes() == BEFORE


def test_owner_kept_without_needless_chown(host):
    needs.root()  # chown
    h, root = host
    t = root / "etc/pve/lxc/200.conf"
    os.chown(t, 0, 33)  # root:www-data, as pmxcfs shows every file
    apply_edit(h, plan_edit("/etc/pve/lxc/200.conf", BEFORE, AFTER), backup_dir="/bk")
    st = t.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (0, 33, 0o640)


def test_stale_temp_of_a_killed_run_is_removed(host):
    h, root = host
    stale = root / "etc/pve/lxc/200.conf.tmp.gpudoctor.999.deadbeef"
    stale.write_bytes(b"half")
    other = root / "etc/pve/lxc/200.conf.tmp.1234"  # Proxmox's own temp: not ours, left alone
    other.write_bytes(b"pve")
    apply_edit(h, plan_edit("/etc/pve/lxc/200.conf", BEFORE, AFTER), backup_dir="/bk")
    assert sorted(os.listdir(root / "etc/pve/lxc")) == ["200.conf", "200.conf.tmp.1234"]


def test_read_only_filesystem_is_refused_and_nothing_changes(host):
    needs.root()  # mount
    h, root = host
    d = root / "etc/pve/lxc"
    subprocess.run(["mount", "--bind", str(d), str(d)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(d)], check=True)
        with pytest.raises(ReadOnlyTarget, match="EROFS.*Nothing was changed"):
            apply_edit(h, plan_edit("/etc/pve/lxc/200.conf", BEFORE, AFTER), backup_dir="/bk")
    finally:
        subprocess.run(["umount", str(d)], check=True)
    assert (d / "200.conf").read_bytes() == BEFORE and os.listdir(d) == ["200.conf"]


def test_pmxcfs_without_quorum_eacces_is_read_only(tmp_path):
    """pmxcfs answers EACCES on writes without quorum: under /etc/pve that is reported as read-only."""
    from gpudoctor.files.edit import _write_error

    err = _write_error(OSError(errno.EACCES, "Permission denied"), "/etc/pve/lxc/200.conf", "write its temp file")
    assert isinstance(err, ReadOnlyTarget) and "lost quorum" in str(err)
    err = _write_error(OSError(errno.EACCES, "Permission denied"), "/srv/x.conf", "write its temp file")
    assert not isinstance(err, ReadOnlyTarget)


def test_rollback_is_the_reverse_plan(host):
    h, root = host
    plan = plan_edit("/etc/pve/lxc/200.conf", BEFORE, AFTER)
    apply_edit(h, plan, backup_dir="/bk")
    back = apply_edit(h, plan.reverse(), backup_dir="/bk")
    assert back.changed and (root / "etc/pve/lxc/200.conf").read_bytes() == BEFORE
    assert sorted(p.read_bytes() for p in backups(root)) == sorted([BEFORE, AFTER])
