"""#40 item 3: root staging into /dev/shm never follows what another user planted there.

An ordinary user (uid 65534) makes the model directory first — after a reboot anyone can — and plants links to a
root file (a victim in the test's own tmp), a part file, the lock file, or DST itself as a link. `model stage --apply` as
root must refuse in one line naming the owner (exit 3) and leave the victim byte for byte as it was. The staged copy
of a setuid or world-writable source file loses those bits; a source link pointing outside the source is refused.
"""

from __future__ import annotations

import json
import os
import stat

from gpudoctor.model import probe
from tests.hostile.planted import as_attacker, cli, digest, shm_name, victim  # noqa: F401 - fixtures
from tests.model.modelfiles import shard_name, write_model

PART = probe.PART_SUFFIX


def _model(tmp_path):
    src = tmp_path / "src" / "tiny"
    files = write_model(src, shards=2, elems=4096)
    return src, files


def _refused(r, *words):
    code, out, err = r
    assert code == 3, (code, out, err)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


def test_a_model_directory_planted_by_another_user_is_refused(cli, tmp_path, victim, shm_name, monkeypatch):
    monkeypatch.setenv("GPUDOCTOR_STATE_DIR", str(tmp_path / "state"))
    src, _ = _model(tmp_path)
    before = digest(victim)

    def plant():
        shm_name.mkdir(mode=0o777)
        (shm_name / "config.json").symlink_to(victim)  # the last file the stage writes
        (shm_name / shard_name(1, 2)).symlink_to(victim)
        (shm_name / f".config.json{PART}").symlink_to(victim)  # a re-planted part file
        (shm_name / f".{shard_name(2, 2)}{PART}").symlink_to(victim)
        (shm_name / probe.LOCK_NAME).symlink_to(victim)  # the lock file
        (shm_name / probe.MARKER_NAME).symlink_to(victim)
        (shm_name / "sub").symlink_to(victim.parent)  # DST/sub -> a root directory

    as_attacker(plant)
    line = _refused(cli("model", "stage", "--from", src, "--to", shm_name, "--apply"), "owned by nobody",
                    str(shm_name))
    assert "Traceback" not in line
    assert digest(victim) == before
    assert sorted(os.listdir(victim.parent)) == ["victim"]
    assert not (tmp_path / "state").exists()  # refused before anything was recorded


def test_dst_itself_a_link_is_refused(cli, tmp_path, victim, shm_name, monkeypatch):
    monkeypatch.setenv("GPUDOCTOR_STATE_DIR", str(tmp_path / "state"))
    src, _ = _model(tmp_path)
    before = digest(victim)
    as_attacker(lambda: shm_name.symlink_to(victim.parent, target_is_directory=True))
    _refused(cli("model", "stage", "--from", src, "--to", shm_name, "--apply"), "link", str(shm_name))
    assert digest(victim) == before and sorted(os.listdir(victim.parent)) == ["victim"]


def test_a_root_directory_others_can_write_is_refused(cli, tmp_path, victim, shm_name, monkeypatch):
    """Root-owned but 1777 (made by a careless script): anyone can plant a part file or swap a shard in it."""
    monkeypatch.setenv("GPUDOCTOR_STATE_DIR", str(tmp_path / "state"))
    src, _ = _model(tmp_path)
    shm_name.mkdir()
    os.chmod(shm_name, 0o1777)
    before = digest(victim)
    as_attacker(lambda: (shm_name / f".config.json{PART}").symlink_to(victim))
    _refused(cli("model", "stage", "--from", src, "--to", shm_name, "--apply"), "writable by every user (mode 1777)")
    assert digest(victim) == before


def test_links_inside_our_own_destination_are_replaced_never_followed(tmp_path, victim, shm_name, monkeypatch):
    """Links left in a root-owned DST (an earlier stage, an admin) are removed or replaced by rename, not written
    through: part files are created O_EXCL|O_NOFOLLOW, the lock file is opened O_NOFOLLOW."""
    from gpudoctor.model import stage as st

    monkeypatch.setenv("GPUDOCTOR_STATE_DIR", str(tmp_path / "state"))
    src, files = _model(tmp_path)
    shm_name.mkdir()
    before = digest(victim)
    (shm_name / "config.json").symlink_to(victim)
    (shm_name / f".{shard_name(1, 2)}{PART}").symlink_to(victim)
    st.apply_stage(st.plan_stage(str(src), str(shm_name), check_busy=False))
    assert digest(victim) == before
    assert not (shm_name / "config.json").is_symlink()
    assert (shm_name / "config.json").read_bytes() == files["config.json"]
    (shm_name / probe.LOCK_NAME).unlink()
    (shm_name / probe.LOCK_NAME).symlink_to(victim)
    os.unlink(shm_name / "config.json")
    try:
        st.apply_stage(st.plan_stage(str(src), str(shm_name), check_busy=False))
        raise AssertionError("a lock file that is a link was opened")
    except st.safe.Unsafe as exc:
        assert probe.LOCK_NAME in str(exc)
    assert digest(victim) == before


def test_staged_modes_are_normalised(tmp_path, shm_name, monkeypatch):
    """A setuid, setgid or world-writable source file is staged 0755/0644-like: root must not make a root-owned
    setuid copy of a user's file, nor a shard anyone can rewrite after verification."""
    from gpudoctor.model import stage as st

    monkeypatch.setenv("GPUDOCTOR_STATE_DIR", str(tmp_path / "state"))
    src, _ = _model(tmp_path)
    (src / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(src / "run.sh", 0o6777)
    os.chmod(src / shard_name(1, 2), 0o666)
    st.apply_stage(st.plan_stage(str(src), str(shm_name), check_busy=False))
    assert stat.S_IMODE(os.stat(shm_name / "run.sh").st_mode) == 0o755
    assert stat.S_IMODE(os.stat(shm_name / shard_name(1, 2)).st_mode) == 0o644
    assert stat.S_IMODE(os.stat(shm_name).st_mode) & 0o022 == 0
    for root, dirs, names in os.walk(shm_name):
        for n in dirs + names:
            m = os.lstat(os.path.join(root, n)).st_mode
            assert not m & (stat.S_ISUID | stat.S_ISGID | stat.S_IWOTH), (n, oct(m))


def test_a_source_link_pointing_outside_the_source_is_refused(cli, tmp_path, victim, shm_name, monkeypatch):
    monkeypatch.setenv("GPUDOCTOR_STATE_DIR", str(tmp_path / "state"))
    src, _ = _model(tmp_path)
    (src / "extra.txt").symlink_to(victim)  # a user's model that names root's file
    _refused(cli("model", "stage", "--from", src, "--to", shm_name, "--apply"), "extra.txt", "outside the source")
    assert not shm_name.exists()


def test_verify_says_when_another_user_owns_the_model(cli, tmp_path, shm_name, monkeypatch):
    """COMPLETE is true only now: the owner can swap a shard after. verify and the check say so."""
    monkeypatch.setenv("GPUDOCTOR_STATE_DIR", str(tmp_path / "state"))
    files = write_model(tmp_path / "src", shards=2, elems=4096)

    def plant():
        shm_name.mkdir(mode=0o755)
        for name, data in files.items():
            (shm_name / name).write_bytes(data)

    as_attacker(plant)
    code, out, _ = cli("model", "verify", shm_name)
    assert code == 0 and "COMPLETE" in out
    assert f"{shm_name}: owned by nobody (uid 65534), mode 0755, not root's: contents can change after verification" in out
    code, out, _ = cli("model", "verify", shm_name, "--json")
    assert "owned by nobody" in json.loads(out)["others_control"]
