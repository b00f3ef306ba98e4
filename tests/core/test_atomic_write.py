"""gpudoctor.files.atomic on real files (#35: bench/mutation.py found its mode, owner, failure and JSONL paths
untested): a new file is 0644 whatever the umask, a replaced one keeps its mode (special bits included) and owner,
an explicit mode wins, a failed write leaves the old file and no temp file, no descriptor is left open, and
append_jsonl_atomic keeps what was there, ending a last line that lacked its newline."""

from __future__ import annotations

import json
import os

import pytest

from gpudoctor.files.atomic import append_jsonl_atomic, atomic_write
from tests import needs


def fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_a_new_file_is_0644_whatever_the_umask_and_nothing_else_is_left(tmp_path):
    old = os.umask(0o077)
    try:
        atomic_write(tmp_path / "f", "text")
    finally:
        os.umask(old)
    assert (tmp_path / "f").read_bytes() == b"text"
    assert oct((tmp_path / "f").stat().st_mode & 0o7777) == "0o644"
    assert os.listdir(tmp_path) == ["f"]


def test_a_replaced_file_keeps_its_mode_with_special_bits_and_an_explicit_mode_wins(tmp_path):
    f = tmp_path / "f"
    f.write_bytes(b"old")
    os.chmod(f, 0o2640)  # setgid: the 0o7777 mask keeps it
    atomic_write(f, b"new")
    assert f.read_bytes() == b"new" and oct(f.stat().st_mode & 0o7777) == "0o2640"
    atomic_write(f, b"newer", mode=0o600)
    assert oct(f.stat().st_mode & 0o7777) == "0o600"


def test_a_root_written_replacement_belongs_to_root_unless_the_caller_names_an_owner(tmp_path):
    """#40: root replacing another user's file does not hand root's content to that user (nor keep their setgid)."""
    needs.root()  # chown
    f = tmp_path / "f"
    f.write_bytes(b"old")
    os.chown(f, 65534, 33)
    os.chmod(f, 0o2664)
    atomic_write(f, b"new")
    st = f.stat()
    assert (st.st_uid, st.st_gid, f.read_bytes()) == (0, 0, b"new") and st.st_mode & 0o7777 == 0o664
    atomic_write(f, b"newer", owner=(65534, 33))
    st = f.stat()
    assert (st.st_uid, st.st_gid, f.read_bytes()) == (65534, 33, b"newer")


def test_a_failed_write_leaves_the_old_file_and_no_temp(tmp_path):
    f = tmp_path / "f"
    f.write_bytes(b"old")
    with pytest.raises(TypeError):
        atomic_write(f, 12345)  # not bytes: the write itself fails, after the temp file exists
    assert f.read_bytes() == b"old" and os.listdir(tmp_path) == ["f"]


def test_no_descriptor_is_left_open(tmp_path):
    before = fds()
    for i in range(5):
        atomic_write(tmp_path / "f", f"{i}")
    assert fds() == before


def test_append_jsonl_keeps_the_lines_and_ends_a_cut_last_line(tmp_path):
    f = tmp_path / "r.jsonl"
    append_jsonl_atomic(f, [{"b": 1, "a": 2}])
    assert f.read_text() == '{"a": 2, "b": 1}\n'
    f.write_text(f.read_text() + '{"c": 3}')  # a last line without its newline
    append_jsonl_atomic(f, [{"d": 4}, {"e": 5}])
    assert [json.loads(x) for x in f.read_text().splitlines()] == [{"a": 2, "b": 1}, {"c": 3}, {"d": 4}, {"e": 5}]
    assert f.read_text().endswith('{"e": 5}\n')
