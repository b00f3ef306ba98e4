"""Power-loss states and invariants across files (issue #48, items 1-2): the model of tests/crash/power.py finds
what a kill cannot (data not fsynced, a rename whose directory was not fsynced), and each of round 6's three
breaks, reintroduced into a patched copy of the product's function, makes the harness fail."""

from __future__ import annotations

import os

import pytest

from gpudoctor.host import ops

from tests import needs
from tests.crash import breaks, power
from tests.crash.harness import Writer, crash_all
from tests.crash.writers import all_writers


def _writer(name: str):
    return next(w for w in all_writers() if w.name == name)


def _setup(base):
    (base / "conf").write_text("old\n")
    return base


def _replace(base, fsync: bool):
    tmp, dst = str(base / ".conf.0badcafe.tmp"), str(base / "conf")
    fd = ops.fs_open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        ops.fs_write(fd, b"new content\n", tmp)
        if fsync:
            ops.fs_fsync(fd, tmp)
    finally:
        os.close(fd)
    ops.fs_rename(tmp, dst)


def test_a_rename_of_data_never_fsynced_leaves_an_empty_file(tmp_path):
    """Killed, the world is old or new at every step; after a power cut the renamed name can hold nothing (ext4's
    zero-length file): only the power-loss states see it."""
    rep = crash_all(Writer("no-fsync", "state", _setup, lambda b, f: _replace(b, fsync=False)), tmp_path)
    kills = [f for f in rep.failures if f.startswith("after step")]
    assert kills == [] and any("power cut" in f and "conf is torn" in f for f in rep.failures), rep.failures
    rep = crash_all(Writer("fsync", "state", _setup, lambda b, f: _replace(b, fsync=True)), tmp_path)
    assert rep.failures == [] and rep.power_states >= 3, rep.failures


def test_a_rename_without_its_directory_fsync_is_not_durable_when_the_run_returns(tmp_path, monkeypatch):
    """fs_rename fsyncs the destination's directory itself; without that, a power cut right after the run returned
    can undo the rename (the old order check read this guarantee back from the trace: it could not fail)."""
    rep = crash_all(Writer("dir-fsync", "state", _setup, lambda b, f: _replace(b, fsync=True)), tmp_path)
    assert rep.failures == []

    def rename(src, dst, dir_fd=None):
        ops.fs_note("rename", src, dst, dir_fd=dir_fd)
        os.rename(src, dst, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)

    monkeypatch.setattr(ops, "fs_rename", rename)
    rep = crash_all(Writer("no-dir-fsync", "state", _setup, lambda b, f: _replace(b, fsync=True)), tmp_path)
    assert any("not durable when it returned" in f and "conf" in f for f in rep.failures), rep.failures


def test_an_unsynced_append_is_lost_or_cut_at_a_page(tmp_path):
    """A log line appended without fsync: gone after a power cut (the log loses nothing it held before, so the
    kill states pass), or cut at a 4 KiB page boundary."""
    def setup(base):
        (base / "log").write_bytes(b"x" * 4000 + b"\n")
        return base

    def append(base, _f):
        fd = ops.fs_open(str(base / "log"), os.O_WRONLY | os.O_APPEND)
        try:
            ops.fs_write(fd, b"y" * 300 + b"\n", str(base / "log"))
        finally:
            os.close(fd)

    rep = crash_all(Writer("append", "state", setup, append, logs=("log",)), tmp_path)
    assert [f for f in rep.failures if f.startswith("after step")] == []
    assert any("not durable when it returned" in f for f in rep.failures), rep.failures
    steps = [["open-write", str(tmp_path / "w/log"), [], 1], ["write", str(tmp_path / "w/log"), [301], 1]]
    old, new = b"x" * 4000 + b"\n", b"x" * 4000 + b"\n" + b"y" * 300 + b"\n"
    worlds = [{"0:log": ("file", old, 0o644)}, {"0:log": ("file", old, 0o644)}, {"0:log": ("file", new, 0o644)}]
    got = {s["0:log"][1] for _, s in power.states(steps, worlds, [tmp_path / "w"])}
    assert got == {old, new, new[:4096]}


@pytest.mark.parametrize("brk,writer,limit", [("audit append without fsync", "devices.node.mode", None),
                                              ("marker before data", "model.stage_cli", 25),
                                              ("marker removed late", "model.stage_cli@restage", 25)])
def test_each_known_break_fails_the_harness(brk, writer, limit, tmp_path, monkeypatch):
    """The three breaks that passed the kill-only harness with 0 failures: each, reintroduced, is found as an
    invariant break (the unpatched writer passes: tests/crash/test_crash_points.py)."""
    needs.root()
    obj, attr, fn = breaks.BREAKS[brk]()
    monkeypatch.setattr(obj, attr, fn)
    rep = crash_all(_writer(writer), tmp_path, limit=limit, power=limit is None)  # the stage's: in its first steps
    assert rep.invariant_breaks > 0, rep.failures[:5]
    assert any("invariant:" in f for f in rep.failures)


def test_an_append_after_a_torn_line_must_start_a_fresh_one(tmp_path, monkeypatch):
    """The audit log's second world (issue #48, item 3): it ends in half a line. AuditLog.append starts its record on
    a fresh line; glued to the torn one, the record is lost to every reader, and the harness says so."""
    from gpudoctor.remedy import AuditLog

    w = _writer("remedy.audit_log@torn")
    assert crash_all(w, tmp_path / "ok").failures == []
    monkeypatch.setattr(AuditLog, "append", breaks.patched(AuditLog.append, [(r'^(\s*)line = b"\\n" \+ line\n',
                                                                               r"\1pass\n")]))
    rep = crash_all(w, tmp_path / "glued")
    assert any("glued to the torn line" in f for f in rep.failures), rep.failures
