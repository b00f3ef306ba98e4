"""The file layer's rules for what root writes (files/safe.py; #48 item 6: a group-writable model destination and a
hard-linked lock file had no test), through the stage and the writers that use them, so a merge of the layer's
modules keeps them. Runs as root (chown, other owners)."""

from __future__ import annotations

import os
import stat

import pytest

from gpudoctor.errors import InputError
from gpudoctor.files import safe
from gpudoctor.model import probe
from gpudoctor.model import stage as st

from tests import needs
from tests.model.modelfiles import write_model


@pytest.fixture
def model(tmp_path, monkeypatch):
    needs.root()
    monkeypatch.setenv("GPUDOCTOR_STATE_DIR", str(tmp_path / "state"))
    write_model(tmp_path / "src", shards=2, elems=64)
    return tmp_path / "src"


@pytest.mark.parametrize("gid,mode,ok", [(65534, 0o775, False), (0, 0o775, False), (65534, 0o757, False),
                                         (65534, 0o755, True)])
def test_a_destination_another_group_can_write_is_refused(model, tmp_path, gid, mode, ok):
    dst = tmp_path / "shm" / "m"
    dst.mkdir(parents=True)
    os.chown(dst, 0, gid)
    os.chmod(dst, mode)
    if ok:
        st.apply_stage(st.plan_stage(str(model), str(dst), check_busy=False), jobs=1)
        assert (dst / probe.MARKER_NAME).exists()
        return
    with pytest.raises(InputError, match="writable by (group|every user)") as e:
        st.plan_stage(str(model), str(dst), check_busy=False)
    assert e.value.path == str(dst)


def test_a_destination_another_user_owns_is_refused(model, tmp_path):
    dst = tmp_path / "m"
    dst.mkdir()
    os.chown(dst, 65534, 65534)
    os.chmod(dst, 0o755)
    with pytest.raises(InputError, match="owned by nobody"):
        st.plan_stage(str(model), str(dst), check_busy=False)


def test_a_hard_linked_lock_file_is_not_opened(model, tmp_path):
    """The stage's lock kept in DST: hard-linked to another file (e.g. /etc/shadow's inode), root must not open it."""
    dst = tmp_path / "m"
    dst.mkdir()
    other = tmp_path / "precious"
    other.write_text("keep\n")
    os.link(other, dst / probe.LOCK_NAME)
    plan = st.plan_stage(str(model), str(dst), check_busy=False)
    with pytest.raises(InputError, match=r"2 link\(s\)"):
        st.apply_stage(plan, jobs=1)
    assert other.read_text() == "keep\n" and not (dst / probe.MARKER_NAME).exists()
    os.unlink(dst / probe.LOCK_NAME)
    os.symlink(other, dst / probe.LOCK_NAME)
    with pytest.raises(InputError, match="is a link"):
        st.apply_stage(plan, jobs=1)
    os.unlink(dst / probe.LOCK_NAME)
    (dst / probe.LOCK_NAME).write_text("")
    os.chown(dst / probe.LOCK_NAME, 65534, 0)
    with pytest.raises(InputError, match="owner nobody"):
        st.apply_stage(plan, jobs=1)


def test_write_file_replaces_a_link_and_sets_its_mode(tmp_path):
    needs.root()
    target = tmp_path / "target"
    target.write_text("untouched\n")
    out = tmp_path / "out.json"
    os.symlink(target, out)
    safe.write_file(out, "{}\n")
    assert target.read_text() == "untouched\n" and not out.is_symlink() and out.read_text() == "{}\n"
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    safe.write_file(out, b"[]\n", public=True)
    assert stat.S_IMODE(out.stat().st_mode) == 0o644 and out.read_bytes() == b"[]\n"
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
    with pytest.raises(InputError, match="is a directory"):
        safe.write_file(tmp_path, "x")
    with pytest.raises(InputError, match="cannot write"):
        safe.write_file(tmp_path / "none" / "f", "x")


def test_modes(tmp_path):
    assert safe.output_mode() == 0o600 and safe.output_mode(public=True) == 0o644
    assert safe.staged_mode(0o4777) == 0o755 and safe.staged_mode(0o640) == 0o640 and safe.staged_mode(0o000) == 0o600
    assert safe.staged_mode(0o000, is_dir=True) == 0o700
