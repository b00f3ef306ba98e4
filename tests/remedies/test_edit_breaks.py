"""gpudoctor.files.edit where it refuses or fails, each on a real condition (#35: what bench/mutation.py found that
no test failed on): a file over pmxcfs's size limit, a device node, a target that cannot be read, a concurrent
writer, a rename or a temp file the filesystem refuses (chattr +i), a backup that cannot be written; and the exact
bytes of its diff (held to GNU diff), its hashes and its backup names. Over both hosts of test_edit.py."""

import dataclasses
import hashlib
import inspect
import os
import subprocess

import pytest

from gpudoctor.files.edit import (MAX_BYTES, EditConflict, EditError, ReadOnlyTarget, apply_edit, backup_path_for,
                                  plan_edit, unified_diff)
from tests import needs

from .test_edit import AFTER, BEFORE, backups, host, host_on  # noqa: F401 - the fixture

TARGET = "/etc/pve/lxc/200.conf"


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


@pytest.fixture
def immutable():
    """chattr +i on paths for the test (root), always undone."""
    done = []

    def make(path):
        needs.root()
        subprocess.run([needs.need("chattr"), "+i", str(path)], check=True, capture_output=True)
        done.append(path)

    yield make
    for p in done:
        subprocess.run([needs.need("chattr"), "-i", str(p)], check=True, capture_output=True)


def test_the_hashes_are_the_files_sha256_and_the_backup_dir_is_private(host):
    h, root = host
    plan = plan_edit(TARGET, BEFORE, AFTER)
    assert (plan.before_sha256, plan.after_sha256) == (sha(BEFORE), sha(AFTER))
    assert plan_edit("/new", None, b"x").before_sha256 is None
    res = apply_edit(h, plan, backup_dir="/bk")
    assert (res.before_sha256, res.after_sha256) == (sha(BEFORE), sha(AFTER))
    assert res.to_json()["after_sha256"] == sha(AFTER)
    (bk,) = backups(root)
    assert oct(bk.parent.stat().st_mode & 0o777) == "0o700"  # made by apply_edit: only root reads old configs


def test_a_plan_is_frozen_and_only_an_edit_reverses():
    plan = plan_edit(TARGET, BEFORE, AFTER)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.after = b"x"
    assert (plan.reverse().before, plan.reverse().after) == (AFTER, BEFORE)
    with pytest.raises(EditError, match="cannot reverse the creation of a file"):
        plan_edit("/new", None, b"x").reverse()


def test_the_backup_name_and_the_documented_default_dir():
    assert backup_path_for("/Xa/b.conf", "/bk", when=0.25) == "/bk/Xa/b.conf.19700101T000000.250000Z"
    assert inspect.signature(apply_edit).parameters["backup_dir"].default == "/var/lib/gpudoctor/backups"  # docs


@pytest.mark.parametrize("before,after", [
    (b"\nl1\nl2\nl3\nl4\nl5\nl6\nl7\nl8\nl9\n", b"top\nl1\nl2\nl3\nl4\nl5\nl6\nl7\nl8\nL9\n"),  # two hunks
    (b"a\nb", b"a\nb\nc\n"),  # no newline at the end of the old file
    (b"x\n", b"\n\nx\ny"),
])
def test_the_diff_is_byte_for_byte_gnu_diff_u(tmp_path, before, after):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(before)
    b.write_bytes(after)
    real = subprocess.run(["diff", "-u", "--label", "/x (before)", "--label", "/x (after)", str(a), str(b)],
                          capture_output=True, text=True)
    assert real.returncode == 1, real.stderr
    assert unified_diff("/x", before, after) == real.stdout


def test_bytes_that_are_not_utf8_are_kept_and_shown_replaced(host):
    h, root = host
    t = root / TARGET.lstrip("/")
    old = BEFORE + b"comment: \xff\xfe latin\n"
    t.write_bytes(old)
    new_text = old.decode("utf-8", "surrogateescape") + "arch: amd64\n"
    plan = plan_edit(TARGET, old, new_text)
    assert plan.after == old + b"arch: amd64\n"
    assert "comment: \ufffd\ufffd latin" in plan.diff and "+arch: amd64\n" in plan.diff
    apply_edit(h, plan, backup_dir="/bk")
    assert t.read_bytes() == old + b"arch: amd64\n"


def test_a_file_over_pmxcfs_limit_is_refused_and_one_at_it_is_edited(host):
    h, root = host
    t = root / TARGET.lstrip("/")
    assert MAX_BYTES == 1 << 20
    big = b"#" * MAX_BYTES + b"\n"
    t.write_bytes(big)
    with pytest.raises(EditError, match=f"{TARGET}: larger than 1048576 bytes; not editing"):
        apply_edit(h, plan_edit(TARGET, big, b"x\n"), backup_dir="/bk")
    assert t.read_bytes() == big and not backups(root)
    at = big[:-2] + b"\n"
    assert len(at) == MAX_BYTES
    t.write_bytes(at)
    assert apply_edit(h, plan_edit(TARGET, at, b"x\n"), backup_dir="/bk").changed and t.read_bytes() == b"x\n"


def test_a_target_that_cannot_be_read_is_named(host):
    h, root = host
    os.unlink(root / TARGET.lstrip("/"))
    (root / TARGET.lstrip("/")).mkdir()
    with pytest.raises(EditError, match=f"{TARGET}: cannot read it \\(EISDIR"):
        apply_edit(h, plan_edit(TARGET, BEFORE, AFTER), backup_dir="/bk")
    assert not backups(root)


@pytest.mark.parametrize("kind", ["local", "run-only"])
def test_a_device_node_is_not_edited(kind, dev_tmp_path):
    # under dev_tmp_path, where the node opens as on /dev (a nodev /tmp, as Debian 13's, gives EACCES on open)
    needs.root()  # mknod
    h, root = host_on(kind, dev_tmp_path)
    t = root / TARGET.lstrip("/")
    os.unlink(t)
    os.mknod(t, 0o020644, os.makedev(1, 3))  # /dev/null's numbers: it reads as empty
    with pytest.raises(EditError, match=f"{TARGET}: is a char, not a regular file; not editing"):
        apply_edit(h, plan_edit(TARGET, b"", AFTER), backup_dir="/bk")
    assert os.major(t.stat().st_rdev) == 1 and not backups(root)


def test_a_writer_during_validation_is_a_conflict_and_wins(host):
    h, root = host
    t = root / TARGET.lstrip("/")

    def validate(data):
        t.write_bytes(b"theirs\n")  # another writer, between our temp file and our rename
        return None

    with pytest.raises(EditConflict, match="changed while gpudoctor was writing; nothing was changed"):
        apply_edit(h, plan_edit(TARGET, BEFORE, AFTER), validate=validate, backup_dir="/bk")
    assert t.read_bytes() == b"theirs\n" and os.listdir(t.parent) == ["200.conf"]


def test_a_refused_rename_is_named_with_quorum_and_leaves_no_temp(host, immutable):
    h, root = host
    t = root / TARGET.lstrip("/")
    immutable(t)  # the kernel refuses to replace it: EPERM, what pmxcfs says without quorum
    with pytest.raises(ReadOnlyTarget) as exc:
        apply_edit(h, plan_edit(TARGET, BEFORE, AFTER), backup_dir="/bk")
    assert str(exc.value) == (f"{TARGET}: cannot rename the temp file over it: EPERM Operation not permitted; the "
                              "filesystem refuses writes (/etc/pve is read-only when this node has lost quorum: "
                              "check `pvecm status`). Nothing was changed")
    assert t.read_bytes() == BEFORE and os.listdir(t.parent) == ["200.conf"]


def test_a_refused_temp_file_is_named(host, immutable):
    h, root = host
    t = root / TARGET.lstrip("/")
    immutable(t.parent)  # no new file in the directory
    with pytest.raises(ReadOnlyTarget, match=f"{TARGET}: cannot write its temp file: EPERM"):
        apply_edit(h, plan_edit(TARGET, BEFORE, AFTER), backup_dir="/bk")
    assert t.read_bytes() == BEFORE


def test_a_backup_that_cannot_be_written_stops_the_edit(host):
    h, root = host
    (root / "bkfile").write_text("a file where the backup directory should be")
    with pytest.raises(EditError, match="cannot write the backup /bkfile/sub/etc/pve/lxc/200.conf.* ENOTDIR .*"
                                        "nothing was changed \\(set another --backup-dir\\)"):
        apply_edit(h, plan_edit(TARGET, BEFORE, AFTER), backup_dir="/bkfile/sub")
    assert (root / TARGET.lstrip("/")).read_bytes() == BEFORE


def test_a_refused_rename_outside_etc_pve_is_a_plain_edit_error(host, immutable):
    h, root = host
    t = root / "etc/other.conf"
    t.write_bytes(BEFORE)
    immutable(t)
    with pytest.raises(EditError) as exc:
        apply_edit(h, plan_edit("/etc/other.conf", BEFORE, AFTER), backup_dir="/bk")
    assert not isinstance(exc.value, ReadOnlyTarget)
    assert str(exc.value) == "/etc/other.conf: cannot rename the temp file over it: EPERM Operation not permitted"
    assert t.read_bytes() == BEFORE and sorted(os.listdir(t.parent)) == ["other.conf", "pve"]
