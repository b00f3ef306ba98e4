"""Crash consistency, enumerated (issue #40, item 7): every remedy of the registry and every state writer, stopped
after each of its mutating steps (a forked child ends with os._exit: no finally block, no rollback), leaves every
file old or new, never torn or missing, an audit log that says what happened, and a rerun that converges; every
rename follows an fsync of its file. tests/crash/harness.py; the power-loss states: test_power_loss.py."""

from __future__ import annotations

import pytest

from gpudoctor import remedies
from gpudoctor.host import ops

from tests import needs
from tests.crash.harness import Writer, check_order, crash_all
from tests.crash.writers import REMEDY_WORLDS, REMEDY_WRITERS, STATE_WRITERS, all_writers

REPORTS: dict = {}


def test_every_remedy_of_the_registry_has_a_scenario():
    assert set(remedies.REMEDIES) <= set(REMEDY_WRITERS), sorted(set(remedies.REMEDIES) - set(REMEDY_WRITERS))
    assert len(all_writers()) == len(remedies.REMEDIES) + len(REMEDY_WORLDS) + len(STATE_WRITERS)
    assert len({w.name for w in all_writers()}) == len(all_writers())  # each world its own name


def test_the_recorder_is_off_in_production():
    assert ops.RECORDER is None


@pytest.mark.parametrize("writer", all_writers(), ids=lambda w: w.name)
def test_every_crash_point(writer: Writer, tmp_path):
    needs.root()  # mknod'ed nodes, chown, the stand-ins' root
    rep = crash_all(writer, tmp_path)
    REPORTS[writer.name] = rep
    print("crash:", rep.line())
    assert rep.steps > 0, f"{writer.name}: no mutating step went through the seam"
    assert not rep.failures, "\n".join(rep.failures[:20])
    assert rep.crash_points == rep.steps and rep.power_states > 0


def test_summary(capsys):
    """The counts of the parametrized runs above in this session (none when run alone)."""
    writers = len(REPORTS)
    points = sum(r.crash_points for r in REPORTS.values())
    failures = sum(len(r.failures) for r in REPORTS.values())
    with capsys.disabled():
        print(f"\ncrash points: {writers} writers, {points} crash points, {failures} failures")
    assert failures == 0


def test_the_order_check_finds_a_rename_without_an_fsync():
    steps = [["create", "/d/.t", [], 1], ["write", "/d/.t", [3], 1], ["rename", "/d/.t", ["/d/t"], 1]]
    assert any("without an fsync" in b for b in check_order(steps))
    good = steps[:2] + [["fsync", "/d/.t", [], 1], steps[2], ["fsync-dir", "/d", [], 1]]
    assert check_order(good) == []


def test_the_harness_catches_a_torn_write_and_a_non_converging_rerun(tmp_path):
    """A writer that rewrites a file in place (truncate, then write) is torn at its crash points; one that appends a
    line each run never converges."""
    import os

    def setup(base):
        (base / "conf").write_text("old\n")
        return base

    def in_place(base, _facts):
        fd = ops.fs_open(str(base / "conf"), os.O_WRONLY | os.O_TRUNC)
        try:
            ops.fs_write(fd, b"new content\n", str(base / "conf"))
        finally:
            os.close(fd)

    rep = crash_all(Writer("in-place", "state", setup, in_place), tmp_path)
    assert rep.steps == 2 and any("conf is torn" in f for f in rep.failures), rep.failures

    def appends(base, _facts):
        fd = ops.fs_open(str(base / "conf"), os.O_WRONLY | os.O_APPEND)
        try:
            ops.fs_write(fd, b"one more\n", str(base / "conf"))
            ops.fs_fsync(fd, str(base / "conf"))
        finally:
            os.close(fd)

    rep = crash_all(Writer("appends", "state", setup, appends), tmp_path)
    assert any("then a rerun" in f for f in rep.failures), rep.failures


def test_the_snapshot_writer_runs_snapshot_o_itself(tmp_path, monkeypatch):
    """tests/crash/writers.py's snapshot.output writes through the `snapshot -o` command: where the file layer's
    write_file rewrites in place (truncate, write), the harness finds the snapshot torn."""
    import os

    from gpudoctor.files import safe

    def in_place(path, data, public=False):
        fd = ops.fs_open(os.fspath(path), os.O_WRONLY | os.O_TRUNC)
        try:
            ops.fs_write(fd, data.encode() if isinstance(data, str) else data, os.fspath(path))
        finally:
            os.close(fd)

    monkeypatch.setattr(safe, "write_file", in_place)
    (w,) = [w for w in all_writers() if w.name == "snapshot.output"]
    rep = crash_all(w, tmp_path, power=False)
    assert any("snap.json is torn" in f for f in rep.failures), rep.failures
